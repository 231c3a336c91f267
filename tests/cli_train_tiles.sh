#!/usr/bin/env bash
# `strata train` computes the tied token embedding and head in vocabulary tiles when the whole embedding does not fit
# the device budget: the header says so (how many tiles, their size, what the whole embedding would need), and the
# run ends with the losses and weights, bit for bit, of a budget that fits everything: parameters on the host and on
# NVMe, activations checkpointed to NVMe, bf16, the step in backward with clipping, and two ranks at stage 3. A
# checkpoint saved tiled resumes untiled and one saved untiled resumes tiled, each ending where the straight run ends.
# A budget below what even the tiles need is refused by the plan, the header saying what is still fetched whole.
# The layer-wise schedule, which would keep each micro-batch's head gradient whole, is refused naming the way out.
# The corpus's byte-level tokens all fall in the first tile; tests/t_model_tiles.c looks up tokens in every tile.
set -u
bin=${STRATA_BIN:?STRATA_BIN must name the strata binary}
here=$(dirname "${BASH_SOURCE[0]}")
source "$here/helpers/cli.sh"
cli_scratch cli_train_tiles

seed=${STRATA_TEST_SEED:-$RANDOM}
echo "seed $seed (set STRATA_TEST_SEED to reproduce)"
# A vocabulary of 8192 at width 64: the embedding (2 MiB) is ten times a block, and whole it needs 7.38 MiB.
model=(train --layers 2 --heads 2 --hidden 64 --vocab 8192 --batch 2 --seq 16 --seed "$seed" --threads 2 --quiet)
tiled=(--device-budget 4MiB)
whole=(--device-budget 64MiB)
mkdir -p "$scratch/nvme"

check "header, tiled" 0 "token embedding in 4 vocabulary tiles of 2048 rows (the last 2048), 0.50 MiB each: whole it \
needs at least 7.38 MiB of the 4.00 MiB device budget" -- "$bin" "${model[@]}" --steps 1 --offload host "${tiled[@]}"
out=$("$bin" "${model[@]}" --steps 1 --offload host "${tiled[@]}" 2>&1)
grep -q "still needs" <<<"$out" && { fail "a budget the tiles fit says they still do not:"; echo "$out"; } || ok
# At 2 MiB even one-piece tiles (0.5 MiB, 3 of them and the activations) do not fit: the header says why, the plan
# refuses.
check "tiles that do not fit" 1 "tiled it still needs at least 2.08 MiB: each tile (0.50 MiB, one 2048-row piece at \
the least) is fetched whole" -- "$bin" "${model[@]}" --steps 1 --offload host --device-budget 2MiB
out=$("$bin" "${model[@]}" --steps 1 --offload host "${whole[@]}" 2>&1)
grep -q "vocabulary tiles" <<<"$out" && { fail "a budget that holds the embedding tiled it:"; echo "$out"; } || ok
check "layerwise refused" 2 "--schedule layerwise: with the token embedding whole the plan needs at least" -- \
    "$bin" "${model[@]}" --steps 1 --offload host "${tiled[@]}" --schedule layerwise --grad-accum 2

# same NAME RUN_A_PREFIX... -- RUN_B_PREFIX...: the two runs' losses (JSONL) and weights are bit-identical.
same() {
    local name=$1; shift
    local a=() b=()
    while [ "$1" != -- ]; do a+=("$1"); shift; done
    shift; b=("$@")
    for side in a b; do
        local -n cmd=$side
        "${cmd[@]}" --dump-weights "$scratch/$name-$side.bin" --log-jsonl "$scratch/$name-$side.jsonl" \
            >"$scratch/$name-$side.txt" 2>&1 || { fail "$name ($side): exit $?"; cat "$scratch/$name-$side.txt"; return; }
    done
    python3 - "$scratch/$name" "$name" <<'EOF' && ok || fail "$name: tiled and whole differ"
import array, json, sys
base, name = sys.argv[1], sys.argv[2]
raw = {s: open(f"{base}-{s}.bin", "rb").read() for s in "ab"}
loss = {s: [json.loads(l)["loss"] for l in open(f"{base}-{s}.jsonl")] for s in "ab"}
print(f"{name}: losses {loss['a']} vs {loss['b']}; weights "
      f"{'bit-identical' if raw['a'] == raw['b'] else 'DIFFERENT'} ({len(raw['a'])} bytes)")
assert len(raw["a"]) > 0 and len(raw["a"]) == len(raw["b"]), f"weights: {len(raw['a'])} vs {len(raw['b'])} bytes"
w = {s: array.array("f", raw[s]) for s in "ab"}
first = next((i for i in range(len(w["a"])) if raw["a"][4 * i:4 * i + 4] != raw["b"][4 * i:4 * i + 4]), None)
assert first is None, f"weights differ; first at float {first}: {w['a'][first]!r} vs {w['b'][first]!r}"
assert loss["a"] == loss["b"] and len(loss["a"]) > 0, f"losses differ: {loss['a']} vs {loss['b']}"
EOF
}

# NAME FLAGS...: each run tiled (4 MiB) against whole (64 MiB).
clip="$scratch/clip.json"
printf '{"gradient_clipping": 0.05}' >"$clip"
runs=("host --offload host"
    "nvme --offload nvme --nvme-dir $scratch/nvme"
    "acts-nvme --offload nvme --nvme-dir $scratch/nvme --activation-checkpointing --offload-activations nvme"
    "bf16 --offload host --dtype bf16"
    "step-in-backward --offload host --step-in-backward --norm-pass --config $clip")
for run in "${runs[@]}"; do
    read -r name flags_text <<<"$run"
    read -r -a flags <<<"$flags_text"
    same "$name" "$bin" "${model[@]}" --steps 4 "${flags[@]}" "${tiled[@]}" -- \
        "$bin" "${model[@]}" --steps 4 "${flags[@]}" "${whole[@]}"
done
grep -q "vocabulary tiles" "$scratch/nvme-a.txt" 2>/dev/null || fail "the 4 MiB NVMe run did not tile"

# Checkpoints cross between the layouts: 2 steps saved one way, resumed the other for 2 more, end as 4 straight.
for from in tiled whole; do
    to=$([ $from = tiled ] && echo whole || echo tiled)
    local_from=("${tiled[@]}"); [ $from = whole ] && local_from=("${whole[@]}")
    local_to=("${tiled[@]}"); [ $to = whole ] && local_to=("${whole[@]}")
    "$bin" "${model[@]}" --steps 4 --offload host "${local_from[@]}" --save "$scratch/ck-$from" --save-every 2 \
        >"$scratch/save-$from.txt" 2>&1 || { fail "save $from: exit $?"; cat "$scratch/save-$from.txt"; continue; }
    "$bin" "${model[@]}" --steps 4 --offload host "${local_to[@]}" --resume "$scratch/ck-$from/step-2" \
        --dump-weights "$scratch/resumed-$to.bin" >"$scratch/resume-$to.txt" 2>&1 ||
        { fail "resume $from -> $to: exit $?"; cat "$scratch/resume-$to.txt"; continue; }
    if cmp -s "$scratch/host-b.bin" "$scratch/resumed-$to.bin"; then
        echo "saved $from at step 2, resumed $to: weights bit-identical to 4 steps straight"; ok
    else
        fail "saved $from at step 2, resumed $to: weights differ from 4 steps straight"
        cmp "$scratch/host-b.bin" "$scratch/resumed-$to.bin"
    fi
done

# Two ranks at stage 3, each with its own shard of every tile: the same weights as two ranks whole.
if cli_mpi_strata "${model[@]}" --steps 1 --offload host; then
    mpi=(timeout 120 bash "$here/helpers/mpi.sh" 2 "$bin" "${model[@]}" --steps 3 --offload host)
    same "2-ranks" "${mpi[@]}" "${tiled[@]}" -- "${mpi[@]}" "${whole[@]}"
else
    echo "mpirun missing or strata built without MPI: the 2-rank comparison is left out"
fi

cli_done cli_train_tiles
