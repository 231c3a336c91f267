#!/usr/bin/env bash
# Training quality with compressed Adam moments (strata.optimizer_moments): `strata train` on the built-in demo
# corpus with fp32, bf16 (stochastic rounding) and 8-bit (block-wise) moments, the same seeds, the optimizer state on
# NVMe so the moments take their form in every tier they cross (the host cache off). Each (form, seed) is one run; the
# seed sets the weights, the data order and bf16's rounding bits (strata.optimizer_moments_seed). The quality figure
# is the final loss: the mean loss of the last tenth of the steps. Compressed moments count as harmless when their
# difference to fp32 at the same seed is within the run-to-run noise, which the seeds show: the spread of fp32's final
# loss across seeds. #wrong counts non-finite losses of a run (a diverged run must not pass as a number).
#
# usage: benchmarks/moments_quality.sh [--json] [--steps N] [--dir DIR]
#   STRATA_BIN: the strata binary (default build/strata); MODEL: the shape flags (default: the demo's tiny model);
#   SEEDS: the seeds (default "1 2 3")
set -euo pipefail

. "$(dirname "$0")/lib.sh"
steps=400 dir=$here/build/scratch/moments_quality
bench_args "$@"
mkdir -p "$dir"
out=$(mktemp -d)
trap 'rm -rf "$out" "$dir"/nvme-*' EXIT INT TERM

read -r -a model <<<"${MODEL:---model tiny}"
read -r -a seeds <<<"${SEEDS:-1 2 3}"
forms=(fp32 bf16 8bit)
common=(train "${model[@]}" --steps "$steps" --lr 1e-3 --threads "$(nproc)" --offload nvme)

bench_machine
echo "build:   $bin"
echo "model:   ${model[*]}, demo corpus, $steps steps, --lr 1e-3 (warmup steps/10, cosine to lr/10), --offload nvme" \
    "(host cache off); seeds ${seeds[*]}; NVMe dir $dir"
echo

# final FILE -> "final_loss wrong": the mean loss of the last tenth of the steps, and the non-finite losses
final() {
    python3 - "$1" <<'PY'
import json, math, sys
loss = [json.loads(l)["loss"] for l in open(sys.argv[1])]
tail = loss[-max(1, len(loss) // 10):]
print(f"{sum(tail) / len(tail):.5f} {sum(not math.isfinite(x) for x in loss)}")
PY
}

declare -A fin
wrong=0
printf '%-6s %-5s %12s %14s %7s\n' "form" "seed" "final loss" "vs fp32 (same)" "#wrong"
for seed in "${seeds[@]}"; do
    for form in "${forms[@]}"; do
        printf '{"strata": {"host_cache": false, "optimizer_moments": "%s", "optimizer_moments_seed": %s}}\n' \
            "$form" "$seed" >"$out/$form-$seed.json"
        bench_run "$form-$seed" --seed "$seed" --config "$out/$form-$seed.json" --nvme-dir "$dir/nvme-$form-$seed"
        read -r f w <<<"$(final "$out/$form-$seed.jsonl")"
        fin[$form-$seed]=$f
        wrong=$((wrong + w))
        d=$(awk -v a="$f" -v b="${fin[fp32-$seed]}" 'BEGIN {printf "%+.5f", a - b}')
        printf '%-6s %-5s %12s %14s %7s\n' "$form" "$seed" "$f" "$d" "$w"
    done
done

# stats FORM -> "mean spread mean_diff max_abs_diff" over the seeds (spread: max - min of the final losses)
stats() {
    local vals="" diffs=""
    for seed in "${seeds[@]}"; do
        vals="$vals ${fin[$1-$seed]}"
        diffs="$diffs $(awk -v a="${fin[$1-$seed]}" -v b="${fin[fp32-$seed]}" 'BEGIN {print a - b}')"
    done
    echo "$vals" "|" "$diffs" | awk '{n = 0; for (i = 1; $i != "|"; i++) {v[++n] = $i}; s = 0; lo = v[1]; hi = v[1]
        for (k = 1; k <= n; k++) {s += v[k]; lo = v[k] < lo ? v[k] : lo; hi = v[k] > hi ? v[k] : hi}
        ds = 0; dm = 0; for (i++; i <= NF; i++) {ds += $i; a = $i < 0 ? -$i : $i; dm = a > dm ? a : dm}
        printf "%.5f %.5f %+.5f %.5f", s / n, hi - lo, ds / n, dm}'
}
echo
printf '%-6s %10s %12s %16s %16s\n' "form" "mean loss" "seed spread" "mean vs fp32" "max |vs fp32|"
json_forms=""
for form in "${forms[@]}"; do
    read -r m s d x <<<"$(stats "$form")"
    printf '%-6s %10s %12s %16s %16s\n' "$form" "$m" "$s" "$d" "$x"
    json_forms="$json_forms${json_forms:+,}\"$form\":{\"mean\":$m,\"spread\":$s,\"mean_diff\":${d#+},\"max_abs_diff\":$x}"
done
echo "#wrong (non-finite losses): $wrong"
if [ $json -eq 1 ]; then
    printf '{"model":"%s","steps":%s,"seeds":"%s","forms":{%s},"wrong":%s}\n' "${model[*]}" "$steps" "${seeds[*]}" \
        "$json_forms" "$wrong"
fi
[ "$wrong" -eq 0 ]
