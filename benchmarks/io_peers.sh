#!/usr/bin/env bash
# The NVMe I/O engine against every peer in one run: strata_aio (benchmarks/b_aio, the public handle), fio with
# ioengine=libaio and with ioengine=io_uring, DeepSpeed's aio_handle where `deepspeed` loads its async_io op
# (optional peer), and `strata nvme-bench` (the CLI's sweep: its unverified figure, reads timed only, is the column
# beside the peers; its verified figure, every block read checked, is shown as nvme-bench-vfy). Supersedes
# nvme_vs_fio.sh, which compared nvme-bench with fio alone.
#
# Same file system, one thread each, O_DIRECT everywhere, reads and writes at the engine's block size and queue
# depth (aio.block_size 1 MiB, aio.queue_depth 32 by default: nvme/io.c, nvme_aio_defaults). The disk here is
# virtual and its speed swings between time windows, so the peers run interleaved: each round runs every peer's
# write, then every peer's read, in an order that rotates by one peer per round; the page cache is dropped before
# each timed pass where that is permitted. The figure is the median over rounds; the ratio is to the median of the
# best peer (fio or DeepSpeed, not strata's own rows) for the same op, block and queue depth.
#
# usage: benchmarks/io_peers.sh [--json] [--rounds R] [--dir DIR] [--size SIZE] [--block LIST] [--qd LIST]
#                               [--layout overwrite|fallocated|new] [--ds-python PYTHON]
#   defaults: --rounds 5 --dir build/scratch/io-peers --size 1GiB --block 1MiB --qd 32 --layout overwrite
#   --layout overwrite: every file is written in full once before round 1, so each timed write overwrites
#                       allocated blocks (what the swap files see after their first step);
#            fallocated: each timed write goes to a new file preallocated with fallocate(1) (unwritten extents, what
#                       nvme/swap.c's posix_fallocate gives the swap files' first write);
#            new:       each timed write goes to a file deleted just before (blocks allocated as written).
#   --ds-python: the Python that has deepspeed (default python3; STRATA_DS_PYTHON also sets it).
#   STRATA_BIN: the strata binary (default build/strata); b_aio is looked for beside it.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

rounds=5
dir=$here/build/scratch/io-peers
size=1GiB
blocks=1MiB
qds=32
layout=overwrite
ds_python=${STRATA_DS_PYTHON:-python3}
usage="usage: $0 [--json] [--rounds R] [--dir DIR] [--size SIZE] [--block LIST] [--qd LIST] [--layout overwrite|fallocated|new] [--ds-python PYTHON]"
while [ $# -gt 0 ]; do
    case $1 in
    --json) json=1 ;;
    --rounds) rounds=$2; shift ;;
    --dir) dir=$2; shift ;;
    --size) size=$2; shift ;;
    --block) blocks=$2; shift ;;
    --qd) qds=$2; shift ;;
    --layout) layout=$2; shift ;;
    --ds-python) ds_python=$2; shift ;;
    *) echo "$usage" >&2; exit 2 ;;
    esac
    shift
done
case $layout in overwrite | fallocated | new) ;; *) echo "$usage" >&2; exit 2 ;; esac
b_aio=$(dirname "$bin")/b_aio
for x in "$bin" "$b_aio"; do
    [ -x "$x" ] || { echo "$x not found: build first (cmake --build build), or set STRATA_BIN" >&2; exit 2; }
done
command -v fio >/dev/null || { echo "fio not found: install it (Debian: apt-get install fio; tools/run installs it)" >&2; exit 2; }
# bytes SIZE: 1MiB, 1M and 1048576 alike (binary units, as fio and strata read them).
bytes() { local s=${1%B}; numfmt --from=iec "${s%i}"; }
size_b=$(bytes "$size")
mkdir -p "$dir"
out=$(mktemp -d)
trap 'rm -rf "$out" "$dir"/io-peers-*.bin "$dir"/strata-nvme-bench-*' EXIT INT TERM

peers=(strata_aio fio-libaio fio-io_uring)
# (DeepSpeed prints its warnings on stdout: the verdict is the last line.)
ds_note=$("$ds_python" "$here/benchmarks/io_peers_ds.py" --check 2>/dev/null | tail -1) && peers+=(deepspeed) ||
    ds_note="skipped: $ds_python cannot load DeepSpeed's async_io op (${ds_note:-no output})"
peers+=(nvme-bench)
if (echo 3 >/proc/sys/vm/drop_caches) 2>/dev/null; then
    drop_note="dropped (sync; echo 3 > /proc/sys/vm/drop_caches) before every timed pass"
    drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
else
    drop_note="not dropped (/proc/sys/vm/drop_caches is not writable here); every peer uses O_DIRECT, which bypasses it"
    drop() { sync; }
fi

{
    bench_machine
    echo "fio:     $(fio --version); deepspeed: $ds_note"
    echo "config:  dir $dir ($(df -T "$dir" | awk 'NR==2 {print $2 " on " $1}')), $size per file, block $blocks," \
        "queue depth $qds, 1 thread, $rounds interleaved rounds, layout $layout; page cache $drop_note"
    echo "peers:"
    echo "  strata_aio    b_aio: the public strata_aio handle, direct=on (O_DIRECT), one buffer from strata_aio_buffer_alloc"
    echo "                (registered with the ring), a fixed file, the whole file as one request cut into block pieces,"
    echo "                queue depth of them in flight on one ring; a read is verified (a stamp per 4 KiB) after the clock"
    echo "  fio-libaio    fio ioengine=libaio direct=1 numjobs=1 iodepth=QD bs=BLOCK, fio's own buffers; no verification"
    echo "  fio-io_uring  fio ioengine=io_uring direct=1, same shape; fio's defaults: fixedbufs=0 registerfiles=0"
    echo "                sqthread_poll=0 hipri=0; no verification"
    echo "  deepspeed     aio_handle(BLOCK, QD, single_submit=False, overlap_events=True, intra_op_parallelism=1)"
    echo "                .sync_pwrite/.sync_pread of one new_cpu_locked_tensor; libaio, O_DIRECT; no validation"
    echo "  nvme-bench    strata nvme-bench --threads 1 --seconds 0 --direct on: one pass over its own new private"
    echo "                file (filled unmeasured first), reads timed only (its unverified figure); its writes overwrite"
    echo "                that file whatever the layout"
    echo "  nvme-bench-vfy  the same invocation's read pass run again with every block checked as it completes (its"
    echo "                verified figure; the difference is the check's cost on the clock)"
    if [ "$layout" = overwrite ]; then
        echo "files:   one per peer, written in full before round 1 (fio, 4 MiB, O_DIRECT): timed writes overwrite allocated blocks"
    elif [ "$layout" = fallocated ]; then
        echo "files:   each timed write goes to a new file preallocated by fallocate(1): blocks allocated, extents unwritten"
    else
        echo "files:   each timed write goes to a new file (the old one deleted; fio --fallocate=none): blocks allocated as written"
    fi
    echo
} >&$([ "$json" = 1 ] && echo 2 || echo 1)

file_of() { echo "$dir/io-peers-$1.bin"; }

# run_peer PEER OP BLOCK QD: one timed pass; prints GB/s (nvme-bench: its unverified GB/s and, for a read, the verified).
run_peer() {
    local peer=$1 op=$2 bs=$3 qd=$4 f
    f=$(file_of "$peer")
    if [ "$op" = write ] && [ "$layout" != overwrite ]; then rm -f "$f"; fi
    if [ "$op" = write ] && [ "$layout" = fallocated ]; then fallocate -l "$size_b" "$f"; fi
    drop
    case $peer in
    strata_aio)
        "$b_aio" --file "$f" --op "$op" --size "$size_b" --block "$bs" --qd "$qd" --direct on \
            $([ "$op" = read ] && echo --verify) | python3 -c 'import json, sys; print(json.load(sys.stdin)["gbps"])' ;;
    fio-*)
        fio --name=p --filename="$f" --size="$size_b" --bs="$bs" --iodepth="$qd" --ioengine="${peer#fio-}" \
            --direct=1 --rw="$op" --fallocate=none --output-format=json |
            python3 -c "import json, sys; print(json.load(sys.stdin)['jobs'][0]['$op']['bw_bytes'] / 1e9)" ;;
    deepspeed)
        # DeepSpeed logs its warnings to stdout: the figure is the JSON line.
        "$ds_python" "$here/benchmarks/io_peers_ds.py" "$f" "$op" "$size_b" "$bs" "$qd" 2>/dev/null | grep '^{' |
            python3 -c 'import json, sys; print(json.load(sys.stdin)["gbps"])' ;;
    nvme-bench)
        mkdir -p "$dir/strata-nvme-bench-$op"
        "$bin" nvme-bench "$dir/strata-nvme-bench-$op" --size "$size_b" --bs "$bs" --qd "$qd" --threads 1 \
            --modes "$op" --seconds 0 --direct on --json |
            python3 -c 'import json, sys; j = json.load(sys.stdin); assert not (j["wrong"] or j["errors"]), j
r = j["results"][0]; print(r["gbps"], r["gbps_verified"] or "")' ;;
    esac
}

IFS=, read -ra block_list <<<"$blocks"
IFS=, read -ra qd_list <<<"$qds"
if [ "$layout" = overwrite ]; then
    for peer in "${peers[@]}"; do
        [ "$peer" = nvme-bench ] && continue
        fio --name=fill --filename="$(file_of "$peer")" --size="$size_b" --bs=4M --iodepth=32 --ioengine=libaio \
            --direct=1 --rw=write --output-format=json >/dev/null
    done
fi
n=${#peers[@]}
for bs_h in "${block_list[@]}"; do
    bs=$(bytes "$bs_h")
    for qd in "${qd_list[@]}"; do
        for r in $(seq 1 "$rounds"); do
            for op in write read; do
                for k in $(seq 0 $((n - 1))); do
                    peer=${peers[$(((k + r - 1) % n))]}
                    gbps=$(run_peer "$peer" "$op" "$bs" "$qd") || { echo "$peer $op (block $bs, qd $qd) failed" >&2; exit 1; }
                    read -r gbps gbps_verified <<<"$gbps"
                    echo "$peer $op $bs $qd $r $gbps" >>"$out/runs"
                    if [ -n "$gbps_verified" ]; then echo "$peer-vfy $op $bs $qd $r $gbps_verified" >>"$out/runs"; fi
                done
            done
        done
    done
done

python3 - "$out/runs" "$json" <<'PY'
import json, statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
runs = {}
for peer, op, bs, qd, r, gbps in rows:
    runs.setdefault((op, int(bs), int(qd)), {}).setdefault(peer, []).append(float(gbps))
table = []
for (op, bs, qd), per_peer in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0] != "write")):
    med = {p: statistics.median(v) for p, v in per_peer.items()}
    # The peers are the other engines; nvme-bench is strata's own tool (and its writes always overwrite its file).
    best = max(v for p, v in med.items() if p not in ("strata_aio", "nvme-bench", "nvme-bench-vfy"))
    for p, v in per_peer.items():
        table.append({"peer": p, "op": op, "block": bs, "qd": qd, "gbps_median": round(med[p], 4),
                      "gbps_min": round(min(v), 4), "gbps_max": round(max(v), 4), "ratio_to_best": round(med[p] / best, 3),
                      "rounds": v})
if sys.argv[2] == "1":
    print(json.dumps({"bench": "io_peers", "results": table}))
else:
    print(f"{'peer':<15} {'op':<5} {'block':>8} {'qd':>4} {'GB/s median':>11} {'min':>6} {'max':>6} {'ratio':>6}")
    for t in table:
        print(f"{t['peer']:<15} {t['op']:<5} {t['block'] >> 10:>6}Ki {t['qd']:>4} {t['gbps_median']:>11.3f} "
              f"{t['gbps_min']:>6.2f} {t['gbps_max']:>6.2f} {t['ratio_to_best']:>6.3f}")
PY
