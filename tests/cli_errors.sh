#!/usr/bin/env bash
# Errors that must surface, each named (issue 23): an unknown option names itself and the nearest known one; --data
# says what a path that is not a text file is (and never blocks on a FIFO); --lr's range in --help is the one its
# check applies; a long list of config problems ends with "and N more" on a line of its own; a log, trace or weights
# file that cannot be written is warned about, fails the run and is named as failed in the summary; `ckpt frob`
# names the unknown subcommand before the usage.
set -u
bin=${STRATA_BIN:?STRATA_BIN must name the strata binary}
source "$(dirname "${BASH_SOURCE[0]}")/helpers/cli.sh"
cli_scratch cli_errors

# Unknown options: named as unknown (not "needs a value"), with the nearest known flag when one is close.
check "unknown option at the end" 2 "unknown option --bogus; see \`strata train --help\`" -- "$bin" train --bogus
check "unknown option, near one" 2 "unknown option --dtpye; did you mean --dtype?" -- "$bin" train --dtpye bf16
check "known option without its value" 2 "--steps needs a value" -- "$bin" train --steps
# --name=value is --name value (every command, one parser); a switch given a value is refused.
check "--name=value form" 0 "summary: 1 steps" -- "$bin" train --steps=1 --batch=1 --seq=8 --quiet
check "--name=value out of range" 2 '--batch "0" must be a whole number' -- "$bin" train --batch=0
check "switch given a value" 2 "--quiet takes no value" -- "$bin" train --quiet=yes
check "nvme-bench --name=value" 2 'bad value "0" for --threads' -- "$bin" nvme-bench --threads=0

# --data: what the path is and what --data expects; a FIFO is refused at once (timeout 20 s: exit 124 if it blocks).
check "data directory" 2 "--data \"$scratch\" is a directory; --data expects a regular file of training text" -- \
    "$bin" train --data "$scratch"
check "data device" 2 '--data "/dev/urandom" is a character device; --data expects a regular file' -- \
    "$bin" train --data /dev/urandom
if mkfifo "$scratch/fifo" 2>/dev/null; then
    check "data FIFO" 2 "--data \"$scratch/fifo\" is a FIFO (named pipe); --data expects a regular file" -- \
        timeout 20 "$bin" train --data "$scratch/fifo"
else
    echo "skip data FIFO: mkfifo failed in $scratch"
fi

# --lr: --help states the range the check applies, and the check's message states the same range.
range=$("$bin" train --help | sed -n 's/.*--lr X  *peak learning rate in \([[(][^ ]* [^ ]*[])]\).*/\1/p')
if [ -z "$range" ]; then
    fail "--help does not state --lr's range"; "$bin" train --help | grep -- "--lr"
else
    check "lr 0 against --help's $range" 2 "--lr \"0\": must be a learning rate in $range" -- "$bin" train --lr 0
    case $range in
    \(0,*) check "lr 0 refused as help says" 2 "" -- "$bin" train --lr 0 ;;
    \[0,*) fail "--help admits lr 0 but the engine refuses it (optimizer.params.lr)" ;;
    esac
fi
check "lr 10 refused" 2 "--lr \"10\": must be a learning rate in $range" -- "$bin" train --lr 10
check "min-lr 0 accepted" 0 "summary: 1 steps" -- "$bin" train --min-lr 0 --steps 1 --batch 1 --seq 8 --quiet

# A long list of config problems: whole lines only, and the last one says how many more there are (400 in all),
# for `config check` (8 KiB of message) and `train --config` (4 KiB).
{
    printf '{"strata": {'
    for i in $(seq 1 400); do printf '%s"unknown_key_number_%03d_with_a_long_name": 1' "$([ "$i" -gt 1 ] && echo ,)" "$i"; done
    printf '}}\n'
} >"$scratch/many.json"
long_list() { # long_list NAME command...: exit 2, every line a whole "config: unknown key" line, then "... and N more"
    local name=$1 out shown more; shift
    out=$("$@" 2>&1 | sed -n '/^config: /,$p')
    shown=$(grep -c '^config: unknown key strata\.unknown_key_number_[0-9]*_with_a_long_name; keys allowed in strata: .*, aio$' <<<"$out")
    more=$(tail -1 <<<"$out" | sed -n 's/^config: \.\.\. and \([0-9]*\) more problems$/\1/p')
    if [ -z "$more" ] || [ $((shown + more)) -ne 400 ] || [ $(($(wc -l <<<"$out") - 1)) -ne "$shown" ]; then
        fail "$name: expected whole lines and \"... and N more\" adding up to 400 (shown $shown, more '$more'); the end:"
        tail -c 300 <<<"$out"; echo
    else
        ok
    fi
}
long_list "config check, 400 problems" "$bin" config check "$scratch/many.json"
long_list "train --config, 400 problems" "$bin" train --config "$scratch/many.json"

# Output files that cannot be written: a warning naming the file and strerror, once, when it happens; exit 1 at the
# end; the summary names the file as failed and never offers it to open.
run=(train --steps 3 --batch 1 --seq 8 --quiet)
outputs() { # outputs NAME FLAG FILE TEXT: the run warns once with TEXT, exits 1, and the summary says FAILED
    local name=$1 flag=$2 file=$3 text=$4 out rc
    out=$("$bin" "${run[@]}" "$flag" "$file" 2>&1); rc=$?
    if [ $rc -ne 1 ]; then fail "$name: exit $rc, expected 1; output:"; echo "$out"; return; fi
    local warnings
    warnings=$(grep -c "^strata train: warning: .*$text" <<<"$out")
    [ "$warnings" -eq 1 ] || { fail "$name: $warnings warnings with \"$text\", expected 1; output:"; echo "$out"; return; }
    grep -q "FAILED: .*$text" <<<"$out" || { fail "$name: the summary does not say the file failed:"; echo "$out"; return; }
    if grep -q "open it at" <<<"$out"; then fail "$name: the summary offers the failed file to open:"; echo "$out"; return; fi
    ok
}
outputs "log to /dev/full" --log-jsonl /dev/full '--log-jsonl "/dev/full": writing failed at step 1: No space left on device'
outputs "trace to /dev/full" --trace /dev/full 'strata.trace_path "/dev/full": writing the trace (.* events) failed: No space left on device'
check "weights to /dev/full" 1 '--dump-weights "/dev/full": cannot write: No space left on device' -- \
    "$bin" "${run[@]}" --dump-weights /dev/full

# A nearly full filesystem (a 64 KiB tmpfs with 8 KiB free): the log keeps whole lines of the steps before the one
# that failed, and the trace says it is incomplete. As root only; skipped with the reason otherwise.
mkdir "$scratch/tiny"
if [ "$(id -u)" -eq 0 ] && mount -t tmpfs -o size=64k strata-tiny "$scratch/tiny" 2>/dev/null; then
    trap 'umount "$scratch/tiny"; rm -rf "$scratch"' EXIT
    dd if=/dev/zero of="$scratch/tiny/fill" bs=4k count=14 2>/dev/null
    run=(train --steps 40 --batch 1 --seq 8 --quiet)
    outputs "log on a full disk" --log-jsonl "$scratch/tiny/log.jsonl" \
        "writing failed at step [0-9]*: No space left on device; the log is incomplete (whole lines of the steps before it)"
    /usr/bin/python3 -c 'import json, sys; [json.loads(l) for l in open(sys.argv[1])]' "$scratch/tiny/log.jsonl" &&
        ok || fail "the log on a full disk is not whole JSON lines"
    rm -f "$scratch/tiny/log.jsonl"
    outputs "trace on a full disk" --trace "$scratch/tiny/trace.json" \
        "writing the trace (.* events) failed: No space left on device (ENOSPC); the file is incomplete"
else
    echo "skip full disk: mounting a 64 KiB tmpfs needs root with CAP_SYS_ADMIN"
fi

# ckpt: an unknown subcommand is named before the usage.
check "ckpt unknown subcommand" 2 'strata ckpt: unknown subcommand "frob"; allowed: inspect, verify, export' -- \
    "$bin" ckpt frob
first=$("$bin" ckpt frob 2>&1 | head -1)
[[ $first == "strata ckpt: unknown subcommand"* ]] && ok ||
    fail "ckpt frob: the first line is not the reason: $first"
check "ckpt without DIR" 2 "strata ckpt inspect: takes one DIR, a checkpoint or a directory holding checkpoints; got 0 arguments" -- \
    "$bin" ckpt inspect
check "config unknown subcommand" 2 'strata config: unknown subcommand "frob"; allowed: check, defaults' -- "$bin" config frob
check "config check without FILE" 2 "strata config check: takes one FILE, a JSON config; got 0 arguments" -- "$bin" config check

cli_done cli_errors
