#!/usr/bin/env bash
# Activations (issue 14), in one run.
#
# (a) What checkpointing and offload cost: the GPT of the issue (4 layers, hidden 256, 4 heads, seq 128, batch 8,
#     fp32, everything else in device memory on the host backend) trained keeping every activation, with
#     checkpointing, and with the block inputs offloaded to host memory and to NVMe, interleaved per round. Speed is
#     the median tokens/s of the steps after the first two; each ratio is against keeping every activation in the
#     same round, and the reported ratio is the median over rounds. "act stall" is the time backward waited in
#     strata_act_pop per step (median), "act moved" the bytes offloaded per step. #wrong compares the final weights
#     with keeping every activation's, byte for byte (they must be identical: the recompute is deterministic).
# (b) What fits: for the 124M preset at seq 1024 under a fixed device budget (parameters and optimizer state in host
#     memory), `strata estimate`'s largest batch for each way of keeping activations, each confirmed by training
#     one step at that batch and being refused at one more (--fit-steps 0 skips the runs; they take minutes on
#     2 cores).
#
# usage: benchmarks/train_activations.sh [--json] [--steps N] [--rounds R] [--dir DIR]
#   STRATA_BIN: the strata binary (default build/strata); FIT_BUDGET (default 2GiB), FIT_STEPS (default 1)
set -euo pipefail

. "$(dirname "$0")/lib.sh"
steps=12 rounds=3 dir=$here/build/scratch/train_activations
bench_args "$@"
fit_budget=${FIT_BUDGET:-2GiB}
fit_steps=${FIT_STEPS:-1}
mkdir -p "$dir"
out=$(mktemp -d)
trap 'rm -rf "$out" "$dir"/nvme-*' EXIT INT TERM
echo '{"strata": {"backend": "host"}}' >"$out/device.json"
echo '{"zero_optimization": {"offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}},
 "strata": {"backend": "host"}}' >"$out/fit.json"

model=(--layers 4 --hidden 256 --heads 4 --context 128 --seq 128 --batch 8)
seed=11
common=(train "${model[@]}" --steps "$steps" --seed "$seed" --lr 6e-4 --threads "$(nproc)" --config "$out/device.json")

bench_machine
echo "build:   $bin"
echo "speed:   ${model[*]}, fp32, host backend, everything in device memory, $steps steps, $rounds rounds, seed $seed;" \
    "NVMe dir $dir ($(df -T "$dir" | awk 'NR==2{print $2}'))"
echo "fit:     --model 124M --seq 1024, parameters and optimizer in host memory, device budget $fit_budget," \
    "$fit_steps step(s) per confirming run"
echo

# stats FILE -> "median_tokens_per_s median_act_stall_ms act_offload_bytes_per_step device_peak_bytes"
stats() {
    python3 - "$1" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
tail = rows[2:]
med = lambda k: statistics.median(r[k] for r in tail)
print(f'{med("tokens_per_s"):.1f} {1e3 * med("act_stall_s"):.3f} {med("act_offload_bytes"):.0f} '
      f'{rows[-1]["device_peak_bytes"]}')
PY
}

names=(keep checkpointing offload-host offload-nvme)
declare -A flags=([keep]="" [checkpointing]="--activation-checkpointing" [offload-host]="--offload-activations host"
    [offload-nvme]="--offload-activations nvme --nvme-dir $dir/nvme-offload-nvme")
declare -A ratios peak_of stall_of
wrong=0
printf '%-5s %-14s %10s %13s %15s %16s %7s %7s\n' "round" "activations" "tokens/s" "act stall ms" \
    "act moved/step" "device peak B" "ratio" "#wrong"
for r in $(seq "$rounds"); do
    base=""
    for name in "${names[@]}"; do
        # shellcheck disable=SC2086
        bench_run "$name" ${flags[$name]}
        read -r tps stall moved peak <<<"$(stats "$out/$name.jsonl")"
        [ "$name" = keep ] && base=$tps
        ratio=$(awk -v a="$tps" -v b="$base" 'BEGIN {printf "%.3f", a / b}')
        w=$(cmp -l "$out/keep.bin" "$out/$name.bin" 2>/dev/null | wc -l || true)
        wrong=$((wrong + w))
        ratios[$name]="${ratios[$name]:-} $ratio"
        peak_of[$name]=$peak stall_of[$name]="${stall_of[$name]:-} $stall"
        printf '%-5s %-14s %10s %13s %15s %16s %7s %7s\n' "$r" "$name" "$tps" "$stall" "$moved" "$peak" "$ratio" "$w"
    done
done
echo
summary=""
for name in "${names[@]}"; do
    rm_=$(echo ${ratios[$name]} | median)
    st=$(echo ${stall_of[$name]} | median)
    # The predicted drop of the device peak from keeping every activation: the header's activation sizes (MiB, two
    # decimals) less, when offloaded, the restore window of two block inputs.
    pred=$(awk -v off="$([ "${name#offload}" != "$name" ] && echo 1 || echo 0)" '
        /activation checkpointing:/ { for (i = 1; i <= NF; i++) { if ($i == "input") one = substr($(i + 1), 2) + 0
            if ($i == "activations") mine = $(i + 1); if ($i == "of") keep = $(i + 1) } }
        END { if (keep) printf "%.2f", keep - mine - (off ? 2 * one : 0); else printf "0" }' "$out/$name.out")
    drop=$(awk -v a="${peak_of[keep]}" -v b="${peak_of[$name]}" 'BEGIN {printf "%.2f", (a - b) / 1048576}')
    summary="$summary\"$name\":{\"ratio\":$rm_,\"act_stall_ms\":$st,\"device_peak_bytes\":${peak_of[$name]},"
    summary="$summary\"peak_drop_mib\":$drop,\"predicted_drop_mib\":$pred},"
    printf 'tokens/s %-14s / keep every activation: %s (median of %s rounds); act stall %s ms/step; device peak %s B,' \
        "$name" "$rm_" "$rounds" "$st" "${peak_of[$name]}"
    printf ' %s MiB below keeping every activation (predicted %s MiB)\n' "$drop" "$pred"
done
echo "weights vs keeping every activation: #wrong bytes $wrong"

# (b) What fits under the budget, and a run at each estimate.
echo
est=("$bin" estimate --model 124M --batch 1 --seq-len 1024 --config "$out/fit.json" --device-budget "$fit_budget"
    --offload-activations host)
"${est[@]}" | sed -n '/^ACTIVATIONS/,$p'
fit_json=""
printf '\n%-26s %12s %16s %18s\n' "activations" "batch fits" "train at it" "train at one more"
for row in "every activation" "checkpointing" "checkpointing + offload"; do
    n=$("${est[@]}" | awk -v r="$row  " 'index($0, r) == 1 { print $(NF - ($NF ~ /above/ ? 4 : 0)) }')
    f=()
    [ "$row" = "checkpointing" ] && f=(--activation-checkpointing)
    [ "$row" = "checkpointing + offload" ] && f=(--offload-activations host)
    fit=(train --model 124M --seq 1024 --threads "$(nproc)" --config "$out/fit.json" --device-budget "$fit_budget"
        --quiet "${f[@]}")
    at="skipped" more="skipped"
    if [ "$fit_steps" -gt 0 ] && [ "$n" -gt 0 ]; then
        "$bin" "${fit[@]}" --steps "$fit_steps" --batch "$n" >"$out/fit.out" 2>&1 && at="trains" ||
            at="FAILS: $(tail -1 "$out/fit.out")"
    fi
    if "$bin" "${fit[@]}" --steps 1 --batch $((n + 1)) >"$out/more.out" 2>&1; then
        more="TRAINS (estimate too low)"
    else
        grep -q "device budget exceeded" "$out/more.out" && more="refused by the plan" || more="fails otherwise"
    fi
    printf '%-26s %12s %16s %18s\n' "$row" "$n" "$at" "$more"
    fit_json="$fit_json\"$row\":{\"batch\":$n,\"at\":\"$at\",\"one_more\":\"$more\"},"
done
if [ $json -eq 1 ]; then
    printf '{"model":"%s","steps":%s,"rounds":%s,"speed":{%s},"wrong":%s,"fit_budget":"%s","fit":{%s}}\n' \
        "${model[*]}" "$steps" "$rounds" "${summary%,}" "$wrong" "$fit_budget" "${fit_json%,}"
fi
[ "$wrong" -eq 0 ]
