#!/usr/bin/env bash
# `strata train --save/--resume`: 16 steps straight and 12 steps + resume for 4 more end with bit-identical
# weights (the data order depends only on the seed and the step); --save-every keeps the last --keep
# checkpoints and leaves a user's step-N directory without a manifest alone; --resume DIR takes DIR's latest
# checkpoint; each "checkpoint:" line stands alone on its line, on a terminal too (where the progress line is
# redrawn with \r); SIGTERM finishes the step, saves and exits 128+15; --resume without a checkpoint exits 2.
set -u
bin=${STRATA_BIN:?STRATA_BIN must name the strata binary}
source "$(dirname "${BASH_SOURCE[0]}")/helpers/cli.sh"
cli_scratch cli_train_ckpt
common=(train --model tiny --batch 4 --seed 3 --threads 2 --quiet --warmup 2)

"$bin" "${common[@]}" --steps 16 --dump-weights "$scratch/straight.bin" >"$scratch/a.out" 2>&1 || { fail "straight run"; cat "$scratch/a.out"; }
# A user's step-999 directory (no manifest: not a checkpoint) in the --save directory is neither rotated away
# nor resumed from.
mkdir -p "$scratch/ck/step-999" && echo "mine" >"$scratch/ck/step-999/notes.txt"
"$bin" "${common[@]}" --steps 16 --save "$scratch/ck" --save-every 4 --keep 2 --dump-weights "$scratch/saved.bin" \
    >"$scratch/b.out" 2>&1 || { fail "run with --save"; cat "$scratch/b.out"; }
have=$(cd "$scratch/ck" 2>/dev/null && ls -d step-* 2>/dev/null | sort -t- -k2 -n | tr '\n' ' ')
[ "$have" = "step-12 step-16 step-999 " ] && ok ||
    fail "--keep 2 left \"$have\", expected \"step-12 step-16 step-999 \""
[ "$(cat "$scratch/ck/step-999/notes.txt" 2>&1)" = "mine" ] && ok ||
    fail "the rotation touched step-999/notes.txt, which strata did not write"
cmp -s "$scratch/straight.bin" "$scratch/saved.bin" && ok || fail "saving changed the weights"
lines=$(grep -x "checkpoint: $scratch/ck/step-[0-9]*" "$scratch/b.out" | tr '\n' ' ')
want="checkpoint: $scratch/ck/step-4 checkpoint: $scratch/ck/step-8 checkpoint: $scratch/ck/step-12 checkpoint: $scratch/ck/step-16 "
[ "$lines" = "$want" ] && ok || { fail "checkpoint lines alone on their lines: got \"$lines\", expected \"$want\""; cat "$scratch/b.out"; }

# The same on a terminal, where the progress line ends in \r (util-linux script gives the run a pseudo-terminal).
if script -qec true /dev/null >/dev/null 2>&1; then
    script -qec "$(printf '%q ' "$bin" train --model tiny --batch 4 --seed 3 --threads 2 --steps 4 --save \
        "$scratch/tty" --save-every 2)" "$scratch/tty.out" >/dev/null 2>&1 || fail "run with --save on a terminal"
    lines=$(tr -d '\r' <"$scratch/tty.out" | grep -x "checkpoint: $scratch/tty/step-[0-9]*" | tr '\n' ' ')
    want="checkpoint: $scratch/tty/step-2 checkpoint: $scratch/tty/step-4 "
    [ "$lines" = "$want" ] && ok ||
        { fail "on a terminal: checkpoint lines alone on their lines: got \"$lines\", expected \"$want\""; cat -A "$scratch/tty.out"; }
else
    echo "skipped the terminal check: util-linux script is not installed"
fi

# Resume from the --save directory: its latest checkpoint, step-16, not step-999.
"$bin" "${common[@]}" --steps 17 --resume "$scratch/ck" >"$scratch/r.out" 2>&1 || { fail "resume from the --save directory"; cat "$scratch/r.out"; }
grep -qx "resumed from $scratch/ck/step-16 at step 16" "$scratch/r.out" && ok ||
    { fail "resume from the --save directory did not take step-16"; cat "$scratch/r.out"; }

# Resume from step 12 (a named checkpoint) and run to 16.
"$bin" "${common[@]}" --steps 16 --resume "$scratch/ck/step-12" --dump-weights "$scratch/resumed.bin" \
    >"$scratch/c.out" 2>&1 || { fail "resume run"; cat "$scratch/c.out"; }
grep -q "resumed from $scratch/ck/step-12 at step 12" "$scratch/c.out" || { fail "no resume line"; cat "$scratch/c.out"; }
grep -q "summary: 4 steps" "$scratch/c.out" || fail "the resumed run did not run 4 steps"
if cmp -s "$scratch/straight.bin" "$scratch/resumed.bin"; then
    echo "16 steps straight == 12 + resume 4: weights bit-identical"; ok
else
    fail "resumed weights differ from the straight run"; cmp "$scratch/straight.bin" "$scratch/resumed.bin"
fi

out=$("$bin" "${common[@]}" --steps 4 --resume "$scratch/nothing" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -qF -- "--resume \"$scratch/nothing\": no checkpoint there" <<<"$out" && ok ||
    { fail "resume from nothing: exit $rc"; echo "$out"; }

# SIGTERM in the middle: the current step finishes, a checkpoint is written, the exit code is 143.
"$bin" train --model tiny --batch 8 --seed 3 --threads 2 --steps 100000 --save "$scratch/sig" \
    --log-jsonl "$scratch/sig.jsonl" >"$scratch/sig.out" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -s "$scratch/sig.jsonl" ] && break; sleep 0.1; done
kill -TERM $pid
wait $pid; rc=$?
if [ $rc -eq 143 ] && grep -q "stopped by SIGTERM after step" "$scratch/sig.out" && ls -d "$scratch/sig"/step-* >/dev/null 2>&1; then
    echo "SIGTERM: $(grep 'stopped by' "$scratch/sig.out"); saved $(ls "$scratch/sig")"; ok
else
    fail "SIGTERM: exit $rc"; tail -5 "$scratch/sig.out"; ls "$scratch/sig" 2>&1
fi

cli_done cli_train_ckpt
