#!/usr/bin/env bash
# `mpirun -np 2 strata train`: only rank 0 prints (the header says 2 ranks); each rank writes its own trace and logs its own JSONL whose
# comm_bytes per step is the formula of its ZeRO stage, for stages 0..3; 2 ranks x grad-accum 1 end where 1 rank x
# grad-accum 2 ends (loss within 1e-5 relative, weights within the order of fp32 sums); a failure on one rank alone
# ends the job at once instead of hanging; a log that one rank cannot write fails the job (exit 1) once all have
# finished.
set -u
bin=${STRATA_BIN:?STRATA_BIN must name the strata binary}
here=$(dirname "${BASH_SOURCE[0]}")
source "$here/helpers/cli.sh"
cli_mpi_scratch cli_train_ranks

common=(train --model tiny --steps 3 --batch 2 --seq 32 --threads 1 --seed 5)
cli_mpi_strata "${common[@]}" --steps 1 --quiet || { echo "SKIP: strata was built without MPI"; exit 77; }

# Who prints: --tag-output marks each line [job,rank]<stream>; every stdout line must be rank 0's.
out=$(timeout 60 bash "$here/helpers/mpi.sh" 2 --tag-output "$bin" "${common[@]}" --offload host 2>&1)
rc=$?
stdout=$(grep '<stdout>' <<<"$out")
if [ $rc -ne 0 ]; then
    fail "2 ranks: exit $rc"; echo "$out"
elif grep -v '^\[[0-9]*,0\]<stdout>' <<<"$stdout" | grep -q .; then
    fail "a rank other than 0 printed:"; echo "$out"
elif grep -q '<stderr>' <<<"$out"; then
    fail "stderr without an error:"; echo "$out"
else
    for text in "world 2 ranks (MPI), ZeRO stage 3; this is rank 0" "x 2 ranks = 128 tokens/step" "step 3/3" \
        "summary: 3 steps, 384 tokens" "moved and peak are rank 0's, per rank; loss, tokens and throughput are the world's" "comm  "; do
        [ "$(grep -cF -- "$text" <<<"$stdout")" -eq 1 ] || fail "rank 0's output lacks \"$text\" (or has it twice)"
    done
    ok
fi

# Ψ: the engine's padded partition, every module cut into 2 shards of whole 4096-element blocks. The GPT's modules
# are the embeddings ((vocab + context) x hidden), each block (12 h^2 + 13 h) and the final LayerNorm (2 h); the
# sum must agree with the stage-3 parameters line of `strata estimate` (per rank, fp32).
read -r psi psi_emb < <(python3 -c "
pad = lambda n: -(-(-(-n // 2)) // 4096) * 4096 * 2
v, c, h, layers = 256, 64, 64, 2
emb = pad((v + c) * h)
print(emb + layers * pad(12 * h * h + 13 * h) + pad(2 * h), emb)")
est=$("$bin" estimate --json --model tiny --world-size 2 --stage 3 |
    python3 -c "import json,sys; print(2 * next(l['bytes'] for l in json.load(sys.stdin)['plan_lines'] if l['what'] == 'parameters') // 4)")
[ "$est" = "$psi" ] && ok || fail "padded Ψ: the layout gives $psi, strata estimate $est"

# comm_bytes per step (k = 1, fp32 parameters, p = 4 bytes): stage 0 all-reduces the fp32 gradients (2 x 4Ψ);
# stage 1 reduce-scatters them once per step (4Ψ) and all-gathers the updated parameters (pΨ); stage 2 reduce-scatters
# each module's gradients as they are handed over and stage 3 also all-gathers each module at every fetch. The GPT
# ties its output layer to the embeddings, which it fetches and hands gradients over for a second time per
# micro-batch: + (4 + p) x Ψ_emb at stage 3, + 4 x Ψ_emb at stage 2.
want=($((8 * psi)) $((8 * psi)) $((8 * psi + 4 * psi_emb)) $((12 * psi + 8 * psi_emb)))
for stage in 0 1 2 3; do
    if [ $stage -eq 3 ]; then place=(--offload host); else
        printf '{"zero_optimization": {"stage": %d}}' $stage >"$scratch/s$stage.json"; place=(--config "$scratch/s$stage.json")
    fi
    log="$scratch/stage$stage.jsonl"
    if ! o=$(timeout 60 bash "$here/helpers/mpi.sh" 2 "$bin" "${common[@]}" "${place[@]}" --quiet --log-jsonl "$log" 2>&1); then
        fail "stage $stage: training failed"; echo "$o"; continue
    fi
    python3 - "$log" "${want[$stage]}" "$stage" <<'EOF' && ok || fail "stage $stage: comm_bytes"
import json, sys
log, want, stage = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for rank, path in ((0, log), (1, log + ".rank1")):
    lines = [json.loads(l) for l in open(path)]
    got = [l["comm_bytes"] for l in lines]
    assert len(lines) == 3 and all(l["rank"] == rank and l["world_size"] == 2 for l in lines), (path, lines[0])
    assert all(k in lines[0] for k in ("device_peak_bytes", "host_peak_bytes", "nvme_peak_bytes")), lines[0]
    assert got == [want] * 3, f"rank {rank}: comm_bytes per step {got}, the formula gives {want}"
print(f"stage {stage}: comm_bytes {want} per step and rank, as the formula says")
EOF
done

# One --trace for the world: rank 0 writes the path, rank 1 PATH.rank1, each a whole trace of its own rank (before,
# both ranks wrote one file).
if ! o=$(timeout 60 bash "$here/helpers/mpi.sh" 2 "$bin" "${common[@]}" --steps 2 --quiet --trace "$scratch/t.json" 2>&1); then
    fail "2 ranks with --trace failed"; echo "$o"
elif python3 -c "
import json, sys
for p in sys.argv[1:]:
    events = json.load(open(p))
    events = events['traceEvents'] if isinstance(events, dict) else events
    assert len(events) > 10, (p, len(events))
" "$scratch/t.json" "$scratch/t.json.rank1"; then
    ok
else
    fail "2 ranks with one --trace: rank 0's and rank 1's traces are not both whole JSON files"; ls -la "$scratch"
fi

# 2 ranks x grad-accum 1 = 1 rank x grad-accum 2: the world's loss (the mean of the ranks' losses) and the weights.
"$bin" "${common[@]}" --steps 4 --grad-accum 2 --quiet --log-jsonl "$scratch/one.jsonl" \
    --dump-weights "$scratch/one.bin" >/dev/null 2>&1 || fail "1 rank x grad-accum 2 failed"
for place in "--offload host" "--config $scratch/s1.json"; do
    # shellcheck disable=SC2086 # $place is two words on purpose
    if ! o=$(timeout 60 bash "$here/helpers/mpi.sh" 2 "$bin" "${common[@]}" --steps 4 $place --quiet \
        --log-jsonl "$scratch/two.jsonl" --dump-weights "$scratch/two.bin" 2>&1); then
        fail "2 ranks ($place) failed"; echo "$o"; continue
    fi
    python3 - "$scratch" "$place" <<'EOF' && ok || fail "2 ranks ($place) differ from 1 rank"
import array, json, sys
d, place = sys.argv[1], sys.argv[2]
last = lambda p: json.loads(open(p).read().splitlines()[-1])["loss"]
one, two = last(d + "/one.jsonl"), (last(d + "/two.jsonl") + last(d + "/two.jsonl.rank1")) / 2
w = lambda p: array.array("f", open(p, "rb").read())
a, b = w(d + "/one.bin"), w(d + "/two.bin")
diff = max(abs(x - y) for x, y in zip(a, b))
print(f"2 ranks ({place}) vs 1 rank x 2: last loss {two:.6f} vs {one:.6f}, max weight diff {diff:.2e}")
assert abs(one - two) <= 1e-5 * abs(one), (one, two)
assert len(a) == len(b) and diff < 1e-4, diff
EOF
done

# Checkpoints of a world (sharded) are cli_ckpt_ranks.sh's.

# Rank 1 alone fails (its log path is a directory) while rank 0 waits in a collective: the job ends at once.
mkdir -p "$scratch/bad.jsonl.rank1"
t0=$(date +%s)
# Rank 1 fails on its own (exit 2) and aborts the world; rank 0's collective fails (exit 1); mpirun reports
# whichever ended first.
out=$(timeout 60 bash "$here/helpers/mpi.sh" 2 "$bin" "${common[@]}" --log-jsonl "$scratch/bad.jsonl" 2>&1)
rc=$?
if [ "$rc" -ne 1 ] && [ "$rc" -ne 2 ]; then fail "one rank fails: exit $rc, expected 1 or 2"; echo "$out"
elif ! grep -qF "rank 1: strata train: --log-jsonl \"$scratch/bad.jsonl.rank1\": cannot open" <<<"$out"; then
    fail "one rank fails: rank 1's message is missing"; echo "$out"
else ok; fi
[ $(($(date +%s) - t0)) -lt 30 ] || fail "one rank's failure took $(($(date +%s) - t0)) s to end the job"

# Rank 1's log cannot be written (a full disk: /dev/full) while rank 0's can: rank 1 warns at the step it fails, both
# ranks train to the end (rank 0 prints its summary), then agree, and the job exits 1 without an abort.
ln -s /dev/full "$scratch/full.jsonl.rank1"
out=$(timeout 60 bash "$here/helpers/mpi.sh" 2 "$bin" "${common[@]}" --quiet --log-jsonl "$scratch/full.jsonl" 2>&1)
rc=$?
if [ "$rc" -ne 1 ]; then fail "rank 1's log on a full disk: exit $rc, expected 1"; echo "$out"
elif ! grep -qF "rank 1: strata train: warning: --log-jsonl \"$scratch/full.jsonl.rank1\": writing failed at step 1: No space left on device" <<<"$out"; then
    fail "rank 1's log on a full disk: its warning is missing"; echo "$out"
elif ! grep -q "^summary: 3 steps" <<<"$out" || grep -q "comm_abort_world\|rank 1 failed" <<<"$out"; then
    fail "rank 1's log on a full disk: rank 0 did not finish, or the world was aborted"; echo "$out"
elif [ "$(wc -l <"$scratch/full.jsonl")" -ne 3 ]; then fail "rank 0's log does not hold its 3 steps"
else ok; fi

cli_done cli_train_ranks
