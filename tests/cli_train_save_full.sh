#!/usr/bin/env bash
# `strata train --save` on a disk that fills up (a 2 MiB tmpfs, one checkpoint of the tiny model fits, two do not;
# root only, else skipped): the save that finds the disk full warns naming the step and the free space, training
# goes on to the last step, each later save tries again, and the run exits 1 with a line naming the failed saves;
# the previous checkpoint still verifies with its step, no partial staging directory is left, and --resume takes it.
set -u
bin=${STRATA_BIN:?STRATA_BIN must name the strata binary}
here=$(dirname "${BASH_SOURCE[0]}")
source "$here/helpers/cli.sh"
[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root to mount a small tmpfs"; exit 77; }
cli_scratch cli_train_save_full # its own trap below also unmounts
mnt="$scratch/small"
mkdir "$mnt"
if ! mount -t tmpfs -o size=2m,mode=0700 tmpfs "$mnt" 2>"$scratch/mount.err"; then
    echo "SKIP: cannot mount a tmpfs at $mnt: $(cat "$scratch/mount.err") (no CAP_SYS_ADMIN in this sandbox?)"
    rm -rf "$scratch"; exit 77
fi
trap 'umount "$mnt" 2>/dev/null; rm -rf "$scratch"' EXIT
common=(train --model tiny --batch 2 --seq 16 --threads 1 --seed 4 --quiet)

out=$("$bin" "${common[@]}" --steps 6 --save "$mnt/ck" --save-every 2 2>&1); rc=$?
[ $rc -eq 1 ] && ok || fail "a run whose saves found the disk full: exit $rc, expected 1"
grep -qF "warning: saving $mnt/ck/step-4 failed, the disk is full (" <<<"$out" &&
    grep -qF "training goes on and the next save tries again; the last checkpoint (step-2) is intact" <<<"$out" &&
    ok || fail "no warning naming step-4, the free space and the intact step-2"
grep -q "^summary: 6 steps" <<<"$out" && ok || fail "training did not go on to step 6"
grep -qF "warning: saving $mnt/ck/step-6 failed, the disk is full" <<<"$out" && ok ||
    fail "the save after the failed one was not tried"
want="2 of 3 checkpoint saves failed, the disk was full (steps 4, 6); the latest checkpoint is step-2 in \"$mnt/ck\""
grep -qF "$want" <<<"$out" && ok || fail "no closing line \"$want\""
[ $failed -eq 0 ] || echo "$out"
left=$(cd "$mnt/ck" && ls -A | tr '\n' ' ')
[ "$left" = ".strata.lock step-2 " ] && ok ||
    fail "the root holds \"$left\", expected \".strata.lock step-2 \" (no partial staging directory)"
check "the previous checkpoint verifies" 0 "every checksum matches" -- "$bin" ckpt verify "$mnt/ck/step-2"
check "the previous checkpoint keeps its step" 0 "step         2 " -- "$bin" ckpt inspect "$mnt/ck/step-2"
check "resume takes the previous checkpoint" 0 "resumed from $mnt/ck/step-2 at step 2" -- \
    "$bin" "${common[@]}" --steps 3 --resume "$mnt/ck"

cli_done cli_train_save_full
