#!/usr/bin/env bash
# The layer-wise micro-batch schedule (`strata train --schedule layerwise`) against the ordinary one, in one run:
# the demo's model with parameters and optimizer state on NVMe, gradient accumulation 4, with the host cache of
# NVMe-homed state off (every fetch reads the drive, the case the schedule is for) and on. The ordinary schedule
# fetches every module forward and backward once per micro-batch; the layer-wise one once per step, so its NVMe
# reads per step should fall toward 1/4 with the cache off. The device budget is 192 MiB: the layer-wise schedule
# keeps all four micro-batches' activations of a module (strata train's header states the cost), which the demo's
# 96 MiB does not hold.
# Speed is the median tokens/s of the steps after the first two; the runs are interleaved per round and each ratio
# is the median of the per-round ratios (the machine is shared). #wrong compares each layer-wise run's final
# weights with the ordinary run's of the same placement byte for byte (they must be identical).
#
# usage: benchmarks/train_schedule.sh [--json] [--steps N] [--rounds R] [--dir DIR]
#   STRATA_BIN: the strata binary (default build/strata)
set -euo pipefail

. "$(dirname "$0")/lib.sh"
steps=16 rounds=3 dir=$here/build/scratch/train_schedule
bench_args "$@"
mkdir -p "$dir"
out=$(mktemp -d)
trap 'rm -rf "$out" "$dir"/nvme-*' EXIT INT TERM
echo '{"strata": {"host_cache": false}}' >"$out/uncached.json"
echo '{"strata": {"host_cache": true}}' >"$out/cached.json"

model=(--layers 6 --hidden 512 --heads 8 --context 64 --batch 2 --seq 64 --grad-accum 4)
seed=7
common=(train "${model[@]}" --steps "$steps" --seed "$seed" --lr 6e-4 --threads "$(nproc)" --offload nvme
    --device-budget 192MiB --prefetch 16MiB)

bench_machine
echo "build:   $bin"
echo "model:   ${model[*]}, --offload nvme --device-budget 192MiB --prefetch 16MiB, $steps steps, $rounds rounds," \
    "seed $seed; NVMe dir $dir ($(df -T "$dir" | awk 'NR==2{print $2}'))"
echo

run() { # run NAME extra-args...: every run on its own swap directory
    bench_run "$1" --nvme-dir "$dir/nvme-$1" "${@:2}"
}
# stats FILE -> "median_tokens_per_s median_stall_s nvme_read_bytes_per_step nvme_written_bytes_per_step"
stats() {
    python3 - "$1" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
med = lambda k: statistics.median(r[k] for r in rows)
print(f'{med("tokens_per_s"):.1f} {med("stall_s"):.4f} {med("nvme_to_host_bytes"):.0f} {med("host_to_nvme_bytes"):.0f}')
PY
}

declare -A ratios tps_of read_of
wrong=0
printf '%-5s %-10s %-11s %10s %8s %14s %14s %7s %7s\n' "round" "host cache" "schedule" "tokens/s" "stall s" \
    "NVMe read/step" "NVMe wr/step" "ratio" "#wrong"
for r in $(seq "$rounds"); do
    for cache in uncached cached; do
        run "$cache-ordinary" --config "$out/$cache.json" --schedule ordinary
        run "$cache-layerwise" --config "$out/$cache.json" --schedule layerwise
        read -r o_tps o_stall o_rd o_wr <<<"$(stats "$out/$cache-ordinary.jsonl")"
        read -r l_tps l_stall l_rd l_wr <<<"$(stats "$out/$cache-layerwise.jsonl")"
        w=$(cmp -l "$out/$cache-ordinary.bin" "$out/$cache-layerwise.bin" 2>/dev/null | wc -l || true)
        wrong=$((wrong + w))
        ratio=$(awk -v a="$l_tps" -v b="$o_tps" 'BEGIN {printf "%.3f", a / b}')
        ratios[$cache]="${ratios[$cache]:-} $ratio"
        read_of[$cache-ordinary]=$o_rd read_of[$cache-layerwise]=$l_rd
        onoff=$([ "$cache" = cached ] && echo on || echo off)
        printf '%-5s %-10s %-11s %10s %8s %14s %14s %7s %7s\n' "$r" "$onoff" "ordinary" "$o_tps" "$o_stall" "$o_rd" \
            "$o_wr" "1" "-"
        printf '%-5s %-10s %-11s %10s %8s %14s %14s %7s %7s\n' "$r" "$onoff" "layerwise" "$l_tps" "$l_stall" "$l_rd" \
            "$l_wr" "$ratio" "$w"
    done
done
r_off=$(echo ${ratios[uncached]} | median)
r_on=$(echo ${ratios[cached]} | median)
echo
echo "tokens/s layerwise / ordinary (median of $rounds rounds): host cache off ${r_off}, on ${r_on}"
echo "NVMe read per step (last round), cache off: ordinary ${read_of[uncached-ordinary]}, layerwise" \
    "${read_of[uncached-layerwise]} bytes"
echo "weights: layerwise vs ordinary #wrong bytes ${wrong}"
if [ $json -eq 1 ]; then
    printf '{"model":"%s","steps":%s,"rounds":%s,"seed":%s,"ratio_uncached":%s,"ratio_cached":%s,' \
        "${model[*]}" "$steps" "$rounds" "$seed" "$r_off" "$r_on"
    printf '"nvme_read_ordinary":%s,"nvme_read_layerwise":%s,"wrong":%s}\n' "${read_of[uncached-ordinary]}" \
        "${read_of[uncached-layerwise]}" "$wrong"
fi
[ "$wrong" -eq 0 ]
