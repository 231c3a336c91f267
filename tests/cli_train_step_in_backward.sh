#!/usr/bin/env bash
# `strata train` with {"strata": {"step_in_backward": true}}: the GPT model (its embeddings handed over twice a step,
# at the tied head and in backward) ends with weights bit-identical to the ordinary step's and the same losses, with
# everything in host memory (fp32 and bf16) and with parameters, optimizer state and the gradient store on NVMe,
# where a step writes 4 bytes per parameter less to the drive (the store is never written), and on NVMe with gradient
# clipping (the updates speculate; a step where it triggers is redone, counted in the log), and with 2 ranks at stage 3;
# fp16 (a step whose gradients overflow is skipped, the updates made in backward undone); --grad-accum 2 and the delayed
# update
# are refused with their messages; --step-in-backward sets the key. With strata.norm_pass (each step's forward and
# backward run twice, the first measuring the norm) the clipped runs end with the same weights, nothing redone, less
# written to the drive than speculating, and the summary and log count the passes.
set -u
bin=${STRATA_BIN:?STRATA_BIN must name the strata binary}
here=$(dirname "${BASH_SOURCE[0]}")
source "$here/helpers/cli.sh"
cli_scratch cli_train_step_in_backward

seed=${STRATA_TEST_SEED:-$RANDOM}
echo "seed $seed (set STRATA_TEST_SEED to reproduce)"
printf '{}' >"$scratch/ordinary.json"
printf '{"strata": {"step_in_backward": true}}' >"$scratch/sib.json"
printf '{"strata": {"host_cache": false, "gradients_on_nvme": true}}' >"$scratch/ordinary-nvme.json"
printf '{"strata": {"host_cache": false, "gradients_on_nvme": true, "step_in_backward": true}}' >"$scratch/sib-nvme.json"
printf '{"gradient_clipping": %s}' "${STRATA_TEST_CLIP:-1.0}" >"$scratch/ordinary-clip.json"
printf '{"gradient_clipping": %s, "strata": {"step_in_backward": true}}' "${STRATA_TEST_CLIP:-1.0}" >"$scratch/sib-clip.json"
printf '{"gradient_clipping": %s, "strata": {"step_in_backward": true, "norm_pass": true}}' "${STRATA_TEST_CLIP:-1.0}" \
    >"$scratch/np-clip.json"
common=(train --model tiny --steps 4 --batch 2 --seq 32 --seed "$seed" --threads 2 --device host --quiet)

check "grad-accum 2" 1 "the module's gradients were already handed over in this step and its update has started" -- \
    "$bin" "${common[@]}" --grad-accum 2 --config "$scratch/sib.json"
# --step-in-backward is the key's flag: the header says so, and the key's refusals hold for it.
check "the flag" 0 "delayed update off; step in backward" -- "$bin" "${common[@]}" --step-in-backward --steps 1
check "the flag with the delayed update" 1 "strata.step_in_backward = true with strata.delayed_update = true" -- \
    "$bin" "${common[@]}" --delayed-update --step-in-backward
# --norm-pass is strata.norm_pass's flag: the header says so, and it is refused without clipping.
printf '{"gradient_clipping": 1.0}' >"$scratch/clip-only.json"
check "the norm pass's flag" 0 "delayed update off; step in backward after a norm pass" -- \
    "$bin" "${common[@]}" --step-in-backward --norm-pass --config "$scratch/clip-only.json" --steps 1
check "the norm pass without clipping" 1 "strata.norm_pass = true without gradient_clipping or fp16" -- \
    "$bin" "${common[@]}" --step-in-backward --norm-pass --steps 1

mkdir -p "$scratch/nvme-ordinary" "$scratch/nvme-sib"
# NAME SUFFIX FLAGS...
places=("fp32 '' --dtype fp32" "bf16 '' --dtype bf16" "fp16 '' --dtype fp16" "nvme -nvme --dtype bf16 --offload nvme --nvme-dir $scratch/nvme-MODE"
        "clip -clip --dtype bf16 --offload nvme --nvme-dir $scratch/nvme-MODE")
for place in "${places[@]}"; do
    eval "set -- $place"
    name=$1 suffix=$2
    shift 2
    for mode in ordinary sib; do
        out="$scratch/$name-$mode"
        flags=("${@//MODE/$mode}")
        "$bin" "${common[@]}" "${flags[@]}" --config "$scratch/$mode$suffix.json" --dump-weights "$out.bin" \
            --log-jsonl "$out.jsonl" >"$out.txt" 2>&1 || { fail "$name $mode: exit $?"; cat "$out.txt"; }
    done
    python3 - "$scratch/$name" "$name" <<'EOF' && ok || fail "$name: step in backward differs"
import json, sys
base, name = sys.argv[1], sys.argv[2]
runs = ("ordinary", "sib")
raw = {s: open(f"{base}-{s}.bin", "rb").read() for s in runs}
log = {s: [json.loads(l) for l in open(f"{base}-{s}.jsonl")] for s in runs}
loss = {s: [l["loss"] for l in log[s]] for s in runs}
wr = {s: log[s][-1]["host_to_nvme_bytes"] for s in runs}
print(f"{name}: weights {'bit-identical' if raw['ordinary'] == raw['sib'] else 'DIFFERENT'} ({len(raw['sib'])} "
      f"bytes); losses {loss['ordinary']} vs {loss['sib']}; NVMe written in the last step {wr['ordinary']} vs "
      f"{wr['sib']} B (ordinary vs step in backward)")
assert len(raw["sib"]) > 0 and raw["ordinary"] == raw["sib"], "weights differ"
assert loss["ordinary"] == loss["sib"], "losses differ"
if name == "clip":
    redone = [l["redone"] for l in log["sib"]]
    summary = open(f"{base}-sib.txt").read()
    print(f"clip: steps redone {redone}; summary: {[l for l in summary.splitlines() if 'redone' in l]}")
    assert f"redone      {sum(redone)} of {len(redone)} steps" in summary, "the summary's redone line"
    assert all(not l["redone"] for l in log["ordinary"]), "the ordinary step logged a redo"
if name == "nvme":
    params = len(raw["sib"]) // 4
    # The store is padded per module: at least 4 bytes per parameter less.
    assert wr["ordinary"] - wr["sib"] >= 4 * params, f"NVMe writes {wr['ordinary']} vs {wr['sib']}: the store's are left"
EOF
done

# The norm pass on NVMe with clipping: the clip run's weights and losses, no step redone, every step's pass counted,
# and less written to the drive than the speculating run (no second copy and no kept gradients).
mkdir -p "$scratch/nvme-np"
"$bin" "${common[@]}" --dtype bf16 --offload nvme --nvme-dir "$scratch/nvme-np" --config "$scratch/np-clip.json" \
    --dump-weights "$scratch/clip-np.bin" --log-jsonl "$scratch/clip-np.jsonl" >"$scratch/clip-np.txt" 2>&1 ||
    { fail "norm pass: exit $?"; cat "$scratch/clip-np.txt"; }
python3 - "$scratch/clip" <<'EOF' && ok || fail "norm pass: differs from the ordinary step"
import json, sys
base = sys.argv[1]
raw = {s: open(f"{base}-{s}.bin", "rb").read() for s in ("ordinary", "np")}
log = {s: [json.loads(l) for l in open(f"{base}-{s}.jsonl")] for s in ("ordinary", "sib", "np")}
summary = open(f"{base}-np.txt").read()
written = {s: sum(l["host_to_nvme_bytes"] for l in log[s]) for s in log}
print(f"norm pass: weights {'bit-identical' if raw['ordinary'] == raw['np'] else 'DIFFERENT'}; losses "
      f"{[l['loss'] for l in log['ordinary']]} vs {[l['loss'] for l in log['np']]}; redone "
      f"{[l['redone'] for l in log['np']]}; norm pass s {[l['norm_pass_s'] for l in log['np']]}; NVMe written "
      f"{written} B; summary: {[l for l in summary.splitlines() if 'norm pass' in l]}")
assert len(raw["np"]) > 0 and raw["ordinary"] == raw["np"], "weights differ"
assert [l["loss"] for l in log["ordinary"]] == [l["loss"] for l in log["np"]], "losses differ"
assert not any(l["redone"] for l in log["np"]), "a norm-pass step was redone"
assert all(l["norm_pass_s"] > 0 for l in log["np"]), "a step without its norm pass's time"
assert f"norm pass   {len(log['np'])} of {len(log['np'])} steps" in summary, "the summary's norm pass line"
assert written["np"] < written["sib"], "the norm pass wrote no less than speculating"
EOF

# 2 ranks at stage 3 with clipping (the embeddings, tied to the head, reduce-scattered at both hand-overs and their
# parts summed): the same weights as the ordinary step of the same 2 ranks. Skipped without MPI.
if cli_mpi_strata "${common[@]}" --steps 1; then
    for mode in ordinary sib np; do
        timeout 120 bash "$here/helpers/mpi.sh" 2 "$bin" "${common[@]}" --offload host --config "$scratch/$mode-clip.json" \
            --dump-weights "$scratch/ranks-$mode.bin" --log-jsonl "$scratch/ranks-$mode.jsonl" >"$scratch/ranks-$mode.txt" \
            2>&1 || { fail "2 ranks, $mode: exit $?"; cat "$scratch/ranks-$mode.txt"; }
    done
    if cmp -s "$scratch/ranks-ordinary.bin" "$scratch/ranks-sib.bin" && [ -s "$scratch/ranks-sib.bin" ]; then
        echo "2 ranks, stage 3, clipping: weights bit-identical; redone per step:" \
            "$(python3 -c 'import json,sys; print([json.loads(l)["redone"] for l in open(sys.argv[1])])' "$scratch/ranks-sib.jsonl")"
        ok
    else
        fail "2 ranks, stage 3, clipping: step in backward's weights differ from the ordinary step's"
    fi
    if cmp -s "$scratch/ranks-ordinary.bin" "$scratch/ranks-np.bin" && [ -s "$scratch/ranks-np.bin" ]; then
        echo "2 ranks, stage 3, clipping, norm pass: weights bit-identical"
        ok
    else
        fail "2 ranks, stage 3, clipping: the norm pass's weights differ from the ordinary step's"
    fi
else
    echo "2 ranks: skipped (no mpirun, or strata built without MPI)"
fi

cli_done cli_train_step_in_backward
