#!/usr/bin/env bash
# `strata train --schedule layerwise`: a bad value exits 2 naming the allowed values; the header states the
# activation memory the schedule holds; with --grad-accum 3 it ends with weights bit-identical to the ordinary
# schedule's (and the same losses) on the device tier and with parameters on NVMe under a small device budget, and
# under `mpirun -np 2`; every step fetches each module 3 times less often (the JSONL log's "fetches").
set -u
bin=${STRATA_BIN:?STRATA_BIN must name the strata binary}
here=$(dirname "${BASH_SOURCE[0]}")
source "$here/helpers/cli.sh"
cli_scratch cli_train_schedule

check "help" 0 "--schedule S       ordinary (default)" -- "$bin" train --help
check "bad schedule" 2 '--schedule "vertical": allowed: ordinary, layerwise' -- "$bin" train --schedule vertical
check "header, ordinary" 0 "schedule ordinary: one micro-batch at a time through all modules; activations" -- \
    "$bin" train --steps 1 --batch 2 --seq 32 --grad-accum 3 --quiet
check "header, layerwise" 0 "schedule layerwise: 3 micro-batches through each module together; activations 3 x" -- \
    "$bin" train --steps 1 --batch 2 --seq 32 --grad-accum 3 --quiet --schedule layerwise

seed=${STRATA_TEST_SEED:-$RANDOM}
echo "seed $seed (set STRATA_TEST_SEED to reproduce)"
common=(train --model tiny --steps 4 --batch 2 --seq 32 --grad-accum 3 --seed "$seed" --threads 2 --quiet)
mkdir -p "$scratch/nvme"
# NAME LAYERS FLAGS...: on NVMe, 6 blocks under a device budget that holds layerwise's activations (3 micro-batches)
# and a few modules beside them, so modules are dropped and fetched again within a step; no host cache, so those
# fetches read the drive.
no_cache="$scratch/no_cache.json"
printf '{"strata": {"host_cache": false}}' >"$no_cache"
places=("device 2"
    "nvme 6 --offload nvme --nvme-dir $scratch/nvme --device-budget 7MiB --prefetch 64KiB --config $no_cache")
for place in "${places[@]}"; do
    read -r name layers flags_text <<<"$place"
    read -r -a flags <<<"$flags_text --layers $layers"
    for schedule in ordinary layerwise; do
        out="$scratch/$name-$schedule"
        "$bin" "${common[@]}" "${flags[@]}" --schedule "$schedule" --dump-weights "$out.bin" --log-jsonl "$out.jsonl" \
            >"$out.txt" 2>&1 || { fail "$name $schedule: exit $?"; cat "$out.txt"; }
    done
    python3 - "$scratch/$name" "$name" "$layers" <<'EOF' && ok || fail "$name: the schedules differ"
import array, json, sys
base, name, layers = sys.argv[1], sys.argv[2], int(sys.argv[3])
runs = ("ordinary", "layerwise")
raw = {s: open(f"{base}-{s}.bin", "rb").read() for s in runs}
w = {s: array.array("f", raw[s]) for s in runs}
log = {s: [json.loads(l) for l in open(f"{base}-{s}.jsonl")] for s in runs}
loss = {s: [l["loss"] for l in log[s]] for s in runs}
fetches = {s: [l["fetches"] for l in log[s]] for s in runs}
nvme = {s: sum(l["nvme_to_host_bytes"] for l in log[s]) / len(log[s]) for s in runs}
print(f"{name}: weights {'bit-identical' if raw['ordinary'] == raw['layerwise'] else 'DIFFERENT'} "
      f"({len(raw['ordinary'])} bytes); losses {loss['ordinary']} vs {loss['layerwise']}; fetches per step "
      f"{fetches['ordinary']} vs {fetches['layerwise']}; NVMe read per step {nvme['ordinary']:.0f} vs "
      f"{nvme['layerwise']:.0f} B (ordinary vs layerwise)")
n = len(w["ordinary"])
assert n > 0 and n == len(w["layerwise"]), f"weights: {n} vs {len(w['layerwise'])} floats"
bits = lambda s, i: raw[s][4 * i:4 * i + 4]
first = next((i for i in range(n) if bits("ordinary", i) != bits("layerwise", i)), None)
assert first is None, f"weights differ; first at {first}: {w['ordinary'][first]!r} vs {w['layerwise'][first]!r}"
assert loss["ordinary"] == loss["layerwise"], f"losses differ: {loss['ordinary']} vs {loss['layerwise']}"
# The embeddings, the blocks and ln_f forward, the head (the embeddings again), and back: 2 (layers + 2) + 1 a pass.
per_pass = 2 * (layers + 2) + 1
got = fetches["layerwise"], fetches["ordinary"]
assert got == ([per_pass] * 4, [3 * per_pass] * 4), f"fetches per step {got}, want {per_pass} and {3 * per_pass}"
if name == "nvme":
    assert nvme["ordinary"] > 0 and nvme["layerwise"] > 0, f"NVMe read per step {nvme}: the drive was not read"
EOF
done

# Two ranks split each step's micro-batches round robin under either schedule: the same weights again.
if cli_mpi_strata "${common[@]}" --steps 1; then
    for schedule in ordinary layerwise; do
        timeout 120 bash "$here/helpers/mpi.sh" 2 "$bin" "${common[@]}" --offload host --schedule "$schedule" \
            --dump-weights "$scratch/ranks-$schedule.bin" >"$scratch/ranks-$schedule.txt" 2>&1 ||
            { fail "2 ranks $schedule: exit $?"; cat "$scratch/ranks-$schedule.txt"; }
    done
    if cmp -s "$scratch/ranks-ordinary.bin" "$scratch/ranks-layerwise.bin" && [ -s "$scratch/ranks-ordinary.bin" ]; then
        echo "2 ranks: weights bit-identical under both schedules"
        ok
    else
        fail "2 ranks: the schedules' weights differ:"; cmp "$scratch/ranks-ordinary.bin" "$scratch/ranks-layerwise.bin"
    fi
else
    echo "mpirun missing or strata built without MPI: the 2-rank comparison is left out"
fi

cli_done cli_train_schedule
