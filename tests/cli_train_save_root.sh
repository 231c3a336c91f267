#!/usr/bin/env bash
# `strata train --save ROOT`: the root is checked before the first step (a path that cannot be created, a regular
# file, a read-only directory: exit 2 naming it, no step trained); a second run on a root another run holds is
# refused at its start naming the holder (pid, host, start time), and a SIGKILLed holder leaves no stale lock;
# staging directories a killed save left (.step-N.tmp) are removed at start and said so, while a link of that name,
# other hidden names and the link's target are kept; rotation (--keep) never follows or removes a symbolic link
# ROOT/step-0 -> elsewhere, and elsewhere's files stay; with 2 ranks (mpirun) one run locks the root for all its
# ranks, and a second 2-rank run is refused; a lock file that is a link or a FIFO is refused, its target untouched.
set -u
bin=${STRATA_BIN:?STRATA_BIN must name the strata binary}
here=$(dirname "${BASH_SOURCE[0]}")
source "$here/helpers/cli.sh"
cli_scratch cli_train_save_root # its own trap below also cleans up
mounted=
cleanup() { [ -n "$mounted" ] && umount "$mounted" 2>/dev/null; rm -rf "$scratch"; }
trap cleanup EXIT
common=(train --model tiny --batch 2 --seq 16 --threads 1 --seed 4 --quiet)

# Roots that cannot take a checkpoint: refused before step 1 (no "summary:" line: nothing was trained).
touch "$scratch/file"
for bad in "/proc/strata-test-$$" "$scratch/file" "$scratch/missing/deeper"; do
    out=$("$bin" "${common[@]}" --steps 2 --save "$bad" 2>&1); rc=$?
    if [ $rc -eq 2 ] && grep -qF -- "--save \"$bad\"" <<<"$out" && ! grep -q "^summary:" <<<"$out"; then
        ok
    else
        fail "--save $bad: exit $rc (expected 2, refused before training); output:"; echo "$out"
    fi
done
grep -qF "exists and is not a directory" <<<"$("$bin" "${common[@]}" --steps 2 --save "$scratch/file" 2>&1)" &&
    ok || fail "--save of a regular file does not say it is not a directory"
# A read-only directory: root writes anywhere, so as root a read-only tmpfs stands in for it.
mkdir "$scratch/ro"
if [ "$(id -u)" -ne 0 ]; then
    chmod 555 "$scratch/ro"; ro_ok=1
elif mount -t tmpfs -o ro,size=64k tmpfs "$scratch/ro" 2>/dev/null; then
    mounted="$scratch/ro"; ro_ok=1
else
    ro_ok=0; echo "skipped the read-only part: as root, cannot mount a read-only tmpfs"
fi
if [ $ro_ok -eq 1 ]; then
    check "--save of a read-only directory" 2 "--save \"$scratch/ro\": creating a test file in it failed" -- \
        "$bin" "${common[@]}" --steps 2 --save "$scratch/ro"
    [ -n "$mounted" ] && umount "$mounted" && mounted=
fi

# Two runs on one root: the second is refused at its start, naming the first.
"$bin" "${common[@]}" --steps 1000000 --save "$scratch/lk" --save-every 1000 --log-jsonl "$scratch/lk.jsonl" \
    >"$scratch/lk.out" 2>&1 &
pid=$!
for _ in $(seq 200); do [ -s "$scratch/lk.jsonl" ] && break; sleep 0.05; done
check "a second run on a held root" 2 "--save \"$scratch/lk\" is in use by another run (pid $pid on host $(hostname)" -- \
    "$bin" "${common[@]}" --steps 2 --save "$scratch/lk"
kill -KILL $pid; wait $pid 2>/dev/null
check "a run after the holder was SIGKILLed" 0 "checkpoint: $scratch/lk/step-2" -- \
    "$bin" "${common[@]}" --steps 2 --save "$scratch/lk"

# A lock file that is not a regular file (a link, a FIFO) is refused, never followed or blocked on.
for what in link fifo; do
    mkdir "$scratch/lf-$what"
    if [ $what = link ]; then ln -s "$scratch/file" "$scratch/lf-$what/.strata.lock"; else mkfifo "$scratch/lf-$what/.strata.lock"; fi
    check "a $what as the lock file" 2 "--save \"$scratch/lf-$what\": opening its lock file .strata.lock failed" -- \
        timeout 30 "$bin" "${common[@]}" --steps 2 --save "$scratch/lf-$what"
done
[ ! -s "$scratch/file" ] && ok || fail "the lock file's link target \"$scratch/file\" was written"

# A killed save's staging directory goes at start; a link of that name, its target and other names stay.
mkdir -p "$scratch/st/.step-7.tmp" "$scratch/st/.mine.tmp" "$scratch/target"
head -c 100000 /dev/zero >"$scratch/st/.step-7.tmp/model.safetensors"
echo keep >"$scratch/target/model.safetensors"
ln -s "$scratch/target" "$scratch/st/.step-8.tmp"
out=$("$bin" "${common[@]}" --steps 2 --save "$scratch/st" 2>&1); rc=$?
[ $rc -eq 0 ] || { fail "run over a root with stale staging directories: exit $rc"; echo "$out"; }
grep -qF "removed \"$scratch/st/.step-7.tmp\", the staging directory of a save that was interrupted" <<<"$out" &&
    [ ! -e "$scratch/st/.step-7.tmp" ] && ok ||
    { fail "the stale .step-7.tmp was not removed (and said so)"; echo "$out"; ls -la "$scratch/st"; }
grep -qF "kept \"$scratch/st/.step-8.tmp\"" <<<"$out" && [ -L "$scratch/st/.step-8.tmp" ] && [ -d "$scratch/st/.mine.tmp" ] &&
    [ "$(cat "$scratch/target/model.safetensors")" = keep ] && ok ||
    { fail "a link named like a staging directory, its target or another hidden name was touched"; echo "$out"; ls -la "$scratch/st" "$scratch/target"; }

# Rotation and links: ROOT/step-0 -> elsewhere (a checkpoint) survives --keep 1, and so does elsewhere.
"$bin" "${common[@]}" --steps 1 --save "$scratch/src" >/dev/null 2>&1 || fail "making a checkpoint to link to"
mkdir "$scratch/rot" && cp -r "$scratch/src/step-1" "$scratch/elsewhere" && ln -s "$scratch/elsewhere" "$scratch/rot/step-0"
before=$(ls "$scratch/elsewhere" | tr '\n' ' ')
"$bin" "${common[@]}" --steps 4 --save "$scratch/rot" --save-every 1 --keep 1 >"$scratch/rot.out" 2>&1 ||
    { fail "run with --keep 1 beside a link"; cat "$scratch/rot.out"; }
after=$(ls "$scratch/elsewhere" 2>&1 | tr '\n' ' ')
have=$(cd "$scratch/rot" && ls -d step-* | tr '\n' ' ')
[ -L "$scratch/rot/step-0" ] && [ "$after" = "$before" ] && [ "$have" = "step-0 step-4 " ] && ok ||
    { fail "rotation with a link: root holds \"$have\" (expected \"step-0 step-4 \"), elsewhere \"$after\" (was \"$before\")"; cat "$scratch/rot.out"; }

# Ranks: one 2-rank run locks the root for both of its ranks; a second 2-rank run on it is refused.
if cli_mpi_strata "${common[@]}" --steps 1; then
    check "2 ranks save under one locked root" 0 "checkpoint: $scratch/rk/step-2" -- \
        timeout 120 bash "$here/helpers/mpi.sh" 2 "$bin" "${common[@]}" --steps 2 --save "$scratch/rk" --save-every 1
    timeout 300 bash "$here/helpers/mpi.sh" 2 "$bin" "${common[@]}" --steps 1000000 --save "$scratch/rk" \
        --save-every 1000 --log-jsonl "$scratch/rk.jsonl" >"$scratch/rk.out" 2>&1 &
    mpid=$!
    for _ in $(seq 400); do [ -s "$scratch/rk.jsonl" ] && break; sleep 0.05; done
    check "a second 2-rank run on a held root" 2 "--save \"$scratch/rk\" is in use by another run" -- \
        timeout 120 bash "$here/helpers/mpi.sh" 2 "$bin" "${common[@]}" --steps 2 --save "$scratch/rk"
    kill -TERM $mpid 2>/dev/null; pkill -KILL -P $mpid 2>/dev/null; wait $mpid 2>/dev/null
else
    echo "skipped the 2-rank part: mpirun missing or strata built without MPI"
fi

cli_done cli_train_save_root
