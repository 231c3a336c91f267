#!/usr/bin/env bash
# The GPU call's tools that run without a GPU (tools/gpu/): plan.sh finds every flagship run within the lent
# machines' memory and disk and refuses one that is not (the 6.7B run with the delayed update needs a second fp32
# gradient store: 125 GiB of host memory); check.sh says there is no GPU and exits 77 (or, on a GPU, is not run here);
# compare_runs.py calls two runs of the same seed bit-identical and two of different seeds different, and fails then.
set -u
bin=${STRATA_BIN:?STRATA_BIN must name the strata binary}
here=$(dirname "${BASH_SOURCE[0]}")
root=$(cd "$here/.." && pwd)
source "$here/helpers/cli.sh"
cli_scratch cli_gpu_tools
. "$root/tools/gpu/items.sh"

out=$(bash "$root/tools/gpu/plan.sh" 2>&1)
rc=$?
runs=$(grep -c '^check [a-zA-Z0-9_.]* ' "$root/tools/gpu/plan.sh") # one row per run plan.sh checks
if [ $rc -eq 0 ] && [ "$(grep -c ' yes$' <<<"$out")" -eq "$runs" ]; then ok; else
    fail "plan.sh (exit $rc), want $runs runs that fit:"; echo "$out"
fi
# A set STRATA_GPU_ONLY names must exist: a typo is refused before anything runs.
STRATA_GPU_ONLY=@no_such_set bash "$root/tools/gpu/check.sh" "$scratch/check-set" >"$scratch/set.out" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "no set @no_such_set; sets: @flagship @peers" "$scratch/set.out" && ok ||
    { fail "check.sh with an unknown set: exit $rc"; cat "$scratch/set.out"; }
out=$(bash "$root/tools/gpu/plan.sh" z7b_delayed "${RUN_ZERO_OFFLOAD_7B[@]}" --delayed-update 2>&1)
rc=$?
if [ $rc -eq 1 ] && grep -qE '^z7b_delayed .* 125\.[0-9] / 112 .* NO$' <<<"$out"; then ok; else
    fail "plan.sh let the delayed 6.7B run through (exit $rc):"; echo "$out"
fi

if ! "$bin" info | grep -E '^  cuda {2,}' | grep -vq unavailable; then
    STRATA_GPU_PACK=$scratch/no-pack bash "$root/tools/gpu/check.sh" "$scratch/check" >"$scratch/check.out" 2>&1
    rc=$?
    [ $rc -eq 77 ] && grep -q "no usable GPU here" "$scratch/check.out" && ok ||
        { fail "check.sh without a GPU: exit $rc"; cat "$scratch/check.out"; }
fi

run() { "$bin" train --model tiny --steps 2 --batch 2 --seq 16 --threads 1 --quiet --device host --seed "$2" \
    --log-jsonl "$scratch/$1.jsonl" --dump-weights "$scratch/$1.bin" >/dev/null; }
run a 3 && run b 3 && run c 4 || fail "strata train failed"
check "compare_runs.py: same seed" 0 "bit-identical" -- python3 "$root/tools/gpu/compare_runs.py" --exact \
    "$scratch/a" "$scratch/b" "same seed"
check "compare_runs.py: other seed" 1 "DIFFERENT" -- python3 "$root/tools/gpu/compare_runs.py" --exact \
    "$scratch/a" "$scratch/c" "other seed"
cli_done cli_gpu_tools
