#!/usr/bin/env bash
# Tokens/s of the same GPT model trained by `strata train` with everything in memory (device tier) and with
# parameters and optimizer state on NVMe, without and with the delayed update, and with the host cache of
# NVMe-homed state off (strata.host_cache false: every fetch and step reads the drive), in one run.
# Targets: NVMe/in-memory >= 0.97 with the host cache when the host budget holds the parameters (the default
# budget, 3/4 of RAM, holds this model's whole state), >= 0.8 without the cache, on a model whose compute per step
# is at least the time the NVMe needs for the step's I/O (the script measures both and says whether that holds).
# Speed is the median tokens/s over steps after the first two (order recording, warm-up). The machine is shared
# and noisy, so the three placements run interleaved in ROUNDS rounds and each ratio is the median of the
# per-round ratios. #wrong compares the final weights of the undelayed NVMe run with the in-memory run byte
# for byte (they must be identical); the delayed run's weights must differ (its update is one step late).
#
# usage: benchmarks/train_offload.sh [--json] [--steps N] [--rounds R] [--dir DIR]
#   model: --layers 4 --hidden 256 --heads 4 --context 128, batch 4 x seq 128 x grad-accum 4, fp32 (TRAIN_ARGS
#   overrides it); 12 steps per run, 7 rounds (the machine is shared: fewer rounds give a median that swings ±0.1)
#   STRATA_BIN: the strata binary (default build/strata)
set -euo pipefail

. "$(dirname "$0")/lib.sh"
steps=12 rounds=7 dir=$here/build/scratch/train_offload
bench_args "$@"
mkdir -p "$dir"
out=$(mktemp -d)
echo '{"strata": {"host_cache": false}}' >"$out/uncached.json"
trap 'rm -rf "$out" "$dir"/nvme-*' EXIT INT TERM

model=(${TRAIN_ARGS:---layers 4 --hidden 256 --heads 4 --context 128 --batch 4 --seq 128 --grad-accum 4})
seed=11
common=(train "${model[@]}" --steps "$steps" --seed "$seed" --threads "$(nproc)" --warmup 2 --lr 3e-4 --delayed-warmup 1)

bench_machine
echo "build:   $bin"
echo "model:   ${model[*]}, $steps steps, $rounds rounds, seed $seed; NVMe dir $dir ($(df -T "$dir" | awk 'NR==2{print $2}'))"
echo

# stats FILE -> "median_tokens_per_s median_step_s median_optimizer_s median_stall_s nvme_bytes_per_step"
stats() {
    python3 - "$1" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
med = lambda k: statistics.median(r[k] for r in rows)
io = statistics.median(r["nvme_to_host_bytes"] + r["host_to_nvme_bytes"] for r in rows)
print(f'{med("tokens_per_s"):.1f} {med("step_s"):.4f} {med("optimizer_s"):.4f} {med("stall_s"):.4f} {io:.0f}')
PY
}

r1s="" r2s="" r3s="" wrong=0 delayed_same=0
for r in $(seq "$rounds"); do
    bench_run device
    bench_run nvme --offload nvme --nvme-dir "$dir/nvme-nvme"
    bench_run delayed --offload nvme --nvme-dir "$dir/nvme-delayed" --delayed-update
    bench_run uncached --offload nvme --nvme-dir "$dir/nvme-uncached" --config "$out/uncached.json"
    read -r dev_tps dev_step dev_opt dev_stall _ <<<"$(stats "$out/device.jsonl")"
    read -r nv_tps nv_step nv_opt nv_stall nv_io <<<"$(stats "$out/nvme.jsonl")"
    read -r dl_tps dl_step dl_opt dl_stall dl_io <<<"$(stats "$out/delayed.jsonl")"
    read -r un_tps un_step un_opt un_stall un_io <<<"$(stats "$out/uncached.jsonl")"
    w=$(( $(cmp -l "$out/device.bin" "$out/nvme.bin" 2>/dev/null | wc -l || true) +
          $(cmp -l "$out/device.bin" "$out/uncached.bin" 2>/dev/null | wc -l || true) ))
    wrong=$((wrong + w))
    cmp -s "$out/nvme.bin" "$out/delayed.bin" && delayed_same=$((delayed_same + 1))
    r1=$(awk -v a="$nv_tps" -v b="$dev_tps" 'BEGIN {printf "%.3f", a / b}')
    r2=$(awk -v a="$dl_tps" -v b="$dev_tps" 'BEGIN {printf "%.3f", a / b}')
    r3=$(awk -v a="$un_tps" -v b="$dev_tps" 'BEGIN {printf "%.3f", a / b}')
    r1s="$r1s $r1" r2s="$r2s $r2" r3s="$r3s $r3"
    [ "$r" -eq 1 ] && printf '%-5s %-26s %10s %8s %11s %8s %13s %7s %7s\n' "round" "placement" "tokens/s" "step s" \
        "optimizer s" "stall s" "NVMe B/step" "ratio" "#wrong"
    printf '%-5s %-26s %10s %8s %11s %8s %13s %7s %7s\n' "$r" "everything in memory" "$dev_tps" "$dev_step" "$dev_opt" \
        "$dev_stall" 0 "1" "-"
    printf '%-5s %-26s %10s %8s %11s %8s %13s %7s %7s\n' "$r" "params+optimizer on NVMe" "$nv_tps" "$nv_step" "$nv_opt" \
        "$nv_stall" "$nv_io" "$r1" "$w"
    printf '%-5s %-26s %10s %8s %11s %8s %13s %7s %7s\n' "$r" "  + delayed update" "$dl_tps" "$dl_step" "$dl_opt" \
        "$dl_stall" "$dl_io" "$r2" "-"
    printf '%-5s %-26s %10s %8s %11s %8s %13s %7s %7s\n' "$r" "  host cache off" "$un_tps" "$un_step" "$un_opt" \
        "$un_stall" "$un_io" "$r3" "-"
done
r1=$(echo $r1s | median)
r2=$(echo $r2s | median)
r3=$(echo $r3s | median)
wrong_delayed=$([ $delayed_same -eq 0 ] && echo "differ (expected: the update is one step late)" || echo "SAME (the delayed update did not engage)")

# The NVMe's own speed for the I/O of one step: strata nvme-bench, 256 MiB, same dir.
bw=$("$bin" nvme-bench "$dir" --size 256MiB --bs 1MiB --qd 32 --threads 1 --modes write,read --seconds 0 --json 2>/dev/null |
    python3 -c '
import json, sys
d = json.load(sys.stdin)
rows = d if isinstance(d, list) else d.get("results", d.get("rows", []))
r = [x.get("gbps", x.get("GB/s", x.get("bandwidth_gbps", 0))) for x in rows if isinstance(x, dict)]
print(min(r) if r else 0)' 2>/dev/null || echo 0)
# Compute and I/O of the last round: the condition "compute per step >= the NVMe time of its I/O".
compute=$(awk -v s="$dev_step" -v o="$dev_opt" 'BEGIN {printf "%.4f", s - o}')
io_s=$(awk -v b="$un_io" -v g="$bw" 'BEGIN {if (g > 0) printf "%.4f", b / (g * 1e9); else print "n/a"}')

echo
echo "compute per step (in memory, without the optimizer): ${compute} s; NVMe I/O per step without the host cache at ${bw} GB/s (nvme-bench): ${io_s} s"
echo "ratio NVMe/in-memory (median of $rounds rounds): ${r1} (target >= 0.97 with the host cache); with the delayed update: ${r2}; host cache off: ${r3} (target >= 0.8)"
echo "weights: NVMe (cache on and off) vs in-memory #wrong bytes ${wrong}; delayed vs undelayed ${wrong_delayed}"
if [ $json -eq 1 ]; then
    printf '{"model":"%s","steps":%s,"rounds":'"$rounds"',"seed":%s,"device_tokens_per_s":%s,"nvme_tokens_per_s":%s,"delayed_tokens_per_s":%s,"uncached_tokens_per_s":%s,' \
        "${model[*]}" "$steps" "$seed" "$dev_tps" "$nv_tps" "$dl_tps" "$un_tps"
    printf '"ratio":%s,"ratio_delayed":%s,"ratio_uncached":%s,"nvme_bytes_per_step":%s,"uncached_nvme_bytes_per_step":%s,"compute_s":%s,"nvme_gbps":%s,"wrong":%s}\n' \
        "$r1" "$r2" "$r3" "$nv_io" "$un_io" "$compute" "${bw:-0}" "$wrong"
fi
[ "$wrong" -eq 0 ]
