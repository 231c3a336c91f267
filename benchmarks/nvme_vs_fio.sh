#!/usr/bin/env bash
# strata nvme-bench against fio with the same block size, queue depth, size, O_DIRECT and path.
#
# The disk here is virtual and its speed swings 35-50% between time windows, so the two tools
# run interleaved (strata, fio, strata, fio, ...) and the figure of merit is the median of the
# pairwise ratios strata/fio, for read and for write, plus CPU seconds per GB of each.
#
# usage: benchmarks/nvme_vs_fio.sh [DIR] [SIZE] [BS] [QD] [PAIRS]
#   defaults: DIR=/work/strata-nvme-vs-fio SIZE=2G BS=1M QD=32 PAIRS=5
#   STRATA_BIN: the strata binary (default build/strata)
set -euo pipefail

dir=${1:-/work/strata-nvme-vs-fio}
size=${2:-2G}
bs=${3:-1M}
qd=${4:-32}
pairs=${5:-5}
here=$(cd "$(dirname "$0")/.." && pwd)
strata=${STRATA_BIN:-$here/build/strata}

if ! command -v fio >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "fio not found: installing it from Debian" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y fio >/dev/null
    else
        echo "fio not found: install it (Debian: sudo apt-get install fio) and run again" >&2
        exit 2
    fi
fi
[ -x "$strata" ] || { echo "strata binary not found at $strata (set STRATA_BIN)" >&2; exit 2; }
mkdir -p "$dir"
out=$(mktemp -d)
trap 'rm -rf "$out" "$dir"/fio-test' EXIT INT TERM

echo "machine: $(uname -n), Linux $(uname -r), $(nproc) cores; fio $(fio --version); strata $("$strata" --version)"
echo "setup:   dir $dir ($(df -T "$dir" | awk 'NR==2{print $2}')), size $size, bs $bs, qd $qd, O_DIRECT, 1 thread, $pairs interleaved pairs"
echo "strata:  $strata nvme-bench $dir --size $size --bs $bs --qd $qd --threads 1 --modes write,read --seconds 0 --direct on --json"
echo "fio:     fio --name=X --filename=$dir/fio-test --size=$size --bs=$bs --iodepth=$qd --ioengine=io_uring --direct=1 --rw=write|read --output-format=json"
echo

# The same workload on both sides: strata nvme-bench fills its (new, private) file with 4 MiB
# writes at queue depth 32 and then measures a write pass and a read pass over it; fio gets the
# same unmeasured fill right before its measured write, and its read follows.
fill() {
    fio --name=fill --filename="$dir/fio-test" --size="$size" --bs=4M --iodepth=32 --ioengine=io_uring --direct=1 \
        --rw=write --output-format=json >/dev/null
}

for i in $(seq 1 "$pairs"); do
    "$strata" nvme-bench "$dir" --size "$size" --bs "$bs" --qd "$qd" --threads 1 --modes write,read \
        --seconds 0 --direct on --json >"$out/strata-$i.json"
    fill
    for rw in write read; do
        fio --name="$rw" --filename="$dir/fio-test" --size="$size" --bs="$bs" --iodepth="$qd" \
            --ioengine=io_uring --direct=1 --rw="$rw" --output-format=json >"$out/fio-$rw-$i.json"
    done
    rm -f "$dir/fio-test"
done

python3 - "$out" "$pairs" <<'PY'
import json, statistics, sys
out, pairs = sys.argv[1], int(sys.argv[2])
rows = {"read": [], "write": []}
for i in range(1, pairs + 1):
    s = json.load(open(f"{out}/strata-{i}.json"))
    if s["wrong"] or s["errors"]:
        sys.exit(f"strata run {i}: #wrong {s['wrong']} errors {s['errors']}")
    for rw in ("write", "read"):
        sr = next(r for r in s["results"] if r["mode"] == rw)
        job = json.load(open(f"{out}/fio-{rw}-{i}.json"))["jobs"][0]
        side = job[rw]
        gb = side["io_bytes"] / 1e9
        fio_gbps = side["bw_bytes"] / 1e9
        fio_cpu = (job["usr_cpu"] + job["sys_cpu"]) / 100 * job["job_runtime"] / 1000 / gb
        rows[rw].append((sr["gbps"], fio_gbps, sr["cpu_s_per_gb"], fio_cpu))
print(f"{'pair':>4} {'mode':>5} {'strata GB/s':>11} {'fio GB/s':>9} {'ratio':>6} {'strata cpu_s/GB':>15} {'fio cpu_s/GB':>12}")
for rw in ("write", "read"):
    for i, (s, f, sc, fc) in enumerate(rows[rw], 1):
        print(f"{i:>4} {rw:>5} {s:11.3f} {f:9.3f} {s / f:6.3f} {sc:15.3f} {fc:12.3f}")
print()
for rw in ("write", "read"):
    r = [s / f for s, f, _, _ in rows[rw]]
    sc = statistics.median(x[2] for x in rows[rw]); fc = statistics.median(x[3] for x in rows[rw])
    print(f"{rw:>5}: median strata/fio = {statistics.median(r):.3f} (min {min(r):.3f}, max {max(r):.3f}); "
          f"median cpu_s/GB strata {sc:.3f} vs fio {fc:.3f}")
PY
