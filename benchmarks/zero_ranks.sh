#!/usr/bin/env bash
# ZeRO-3 across ranks: `mpirun -np N strata train` for N = 1, 2, 4 with the same global batch (grad-accum 4/N
# micro-batches per rank), parameters and optimizer state on NVMe. Per N: global tokens/s, and per rank the NVMe
# bytes read per step, the collectives' bytes per step and the device/host peaks. Figures are medians over the
# steps after the first two (order recording, warm-up); bytes are rank 0's, checked equal on every rank. #wrong
# counts final weights that differ from the 1-rank run by more than 1e-4 (N ranks x 4/N micro-batches train as 1
# rank x 4, up to the order of fp32 sums), so a fast wrong run cannot pass; `loss` is the world's last loss (the
# mean of the ranks' own). The host cache is off (strata.host_cache false): with it, the default, the small model's
# state sits in RAM and the NVMe reads the table is about are 0 at every N.
#
# usage: benchmarks/zero_ranks.sh [--json] [--steps N] [--dir DIR]
#   model: --layers 4 --hidden 256 --heads 4 --context 128, batch 4 x seq 128, fp32 (TRAIN_ARGS overrides it);
#   10 steps; swap files in DIR (default build/scratch/zero_ranks, removed at the end); threads per rank:
#   cores / N (at least 1). STRATA_BIN: the strata binary (default build/strata)
set -euo pipefail

. "$(dirname "$0")/lib.sh"
. "$here/tests/helpers/mpi.sh"
steps=10 dir=$here/build/scratch/zero_ranks
bench_args "$@"
command -v mpirun >/dev/null || { echo "zero_ranks.sh: mpirun not found (install openmpi-bin)" >&2; exit 2; }
mkdir -p "$dir"
out=$(mktemp -d)
trap 'rm -rf "$out" "$dir"/n*' EXIT INT TERM

model=(${TRAIN_ARGS:---layers 4 --hidden 256 --heads 4 --context 128 --batch 4 --seq 128})
seed=13 global_accum=4
echo '{"strata": {"host_cache": false}}' >"$out/uncached.json"
common=(train "${model[@]}" --steps "$steps" --seed "$seed" --warmup 2 --lr 3e-4 --offload nvme --config "$out/uncached.json"
    --quiet)

bench_machine
echo "build:   $bin; $(mpirun --version | head -1)"
echo "config:  ${model[*]}, $steps steps, seed $seed; global batch = $global_accum micro-batches (grad-accum 4/N per" \
    "rank); ZeRO stage 3, parameters + optimizer on NVMe in $dir ($(df -T "$dir" | awk 'NR==2{print $2}')), host cache" \
    "off (strata.host_cache = false)"
echo

# stats N -> "tokens_per_s nvme_read_per_step comm_per_step device_peak host_peak last_loss" from the ranks' logs
stats() {
    python3 - "$out/n$1.jsonl" "$1" <<'PY'
import json, statistics, sys
base, n = sys.argv[1], int(sys.argv[2])
ranks = [[json.loads(l) for l in open(base if r == 0 else f"{base}.rank{r}")] for r in range(n)]
med = lambda rows, k: statistics.median(x[k] for x in rows[2:])
for k in ("nvme_to_host_bytes", "comm_bytes"):
    v = {med(rows, k) for rows in ranks}
    assert len(v) == 1, f"N={n}: the ranks' {k} per step differ: {sorted(v)}"
peak = lambda k: max(rows[-1][k] for rows in ranks)
loss = sum(rows[-1]["loss"] for rows in ranks) / n
print(f'{med(ranks[0], "tokens_per_s"):.0f} {med(ranks[0], "nvme_to_host_bytes"):.0f} {med(ranks[0], "comm_bytes"):.0f}',
      peak("device_peak_bytes"), peak("host_peak_bytes"), f"{loss:.6f}")
PY
}
# wrong A B -> how many fp32 weights differ by more than 1e-4
wrong() {
    python3 -c "
import array, sys
a, b = (array.array('f', open(p, 'rb').read()) for p in sys.argv[1:])
print(abs(len(a) - len(b)) + sum(abs(x - y) > 1e-4 for x, y in zip(a, b)))" "$1" "$2"
}
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }

fmt='%-3s %8s %10s %18s %18s %14s %14s %10s %7s\n'
rows=()
printf "$fmt" N threads tokens/s "NVMe read B/step" "comm B/step" "device peak MiB" "host peak MiB" loss "#wrong"
for n in 1 2 4; do
    threads=$(($(nproc) / n)); [ "$threads" -ge 1 ] || threads=1
    mkdir -p "$dir/n$n"
    mpi_run "$n" "$bin" "${common[@]}" --grad-accum $((global_accum / n)) --threads "$threads" --nvme-dir "$dir/n$n" \
        --log-jsonl "$out/n$n.jsonl" --dump-weights "$out/n$n.bin" >"$out/n$n.out" 2>&1 ||
        { echo "N=$n failed:"; cat "$out/n$n.out"; exit 1; }
    read -r tps nvme comm dpeak hpeak loss <<<"$(stats "$n")"
    w=$(wrong "$out/n1.bin" "$out/n$n.bin")
    printf "$fmt" "$n" "$threads" "$tps" "$nvme" "$comm" "$(mib "$dpeak")" "$(mib "$hpeak")" "$loss" "$w"
    rows+=("{\"ranks\":$n,\"threads_per_rank\":$threads,\"tokens_per_s\":$tps,\"nvme_read_bytes_per_step\":$nvme,\"comm_bytes_per_step\":$comm,\"device_peak_bytes\":$dpeak,\"host_peak_bytes\":$hpeak,\"loss\":$loss,\"wrong\":$w}")
    total_wrong=$((${total_wrong:-0} + w))
done
if [ $json -eq 1 ]; then
    model_s="${model[*]}"
    (IFS=,; printf '{"model":"%s","steps":%s,"seed":%s,"global_micro_batches":%s,"rows":[%s]}\n' "$model_s" "$steps" \
        "$seed" "$global_accum" "${rows[*]}")
fi
[ "$total_wrong" -eq 0 ]
