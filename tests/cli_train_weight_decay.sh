#!/usr/bin/env bash
# `strata train --weight-decay X`: GPT-2's recipe, as two optimizer parameter groups ("decay", "no_decay").
#   - The oracle, one step (its gradients come from the initial weights, before any update, so they are the same
#     whatever the decay): with X every no-decay tensor (biases, LayerNorms, embeddings) is bit-identical to the run
#     with weight decay 0, and every 2-D weight is the decay-0 run's update added to fl32(w0 * fl32(1 - lr X)), within
#     the two runs' roundings (|residual| <= (ulp(a) + ulp(b)) / 2, where the decay itself moves the weights by
#     lr X |w0|, thousands of ulps); --decay-embeddings moves the embeddings into the decayed ones. w0 is a one-step
#     run at lr 0 (a schedule that ends at 0, --min-lr 0), which also shows that lr 0 is 0, not the peak lr.
#   - The schedule drives both groups: two steps whose second has lr 0 end where one step ends, also with
#     --step-in-backward (the groups' lr set before strata_step_begin); the step in backward's weights are the
#     ordinary step's; the config's optimizer.params.weight_decay is the recipe's value (the flag wins, said in the
#     header); the checkpoint records the groups; the header and --help state the recipe.
#   - Resume: 6 steps == 3 + save + resume 3, bit for bit; a resume with another recipe (no decay, or the embeddings
#     decayed) is refused with exit 2 naming both; another value is taken and said.
#   - strata estimate --weight-decay lays out the groups as training does (the logged device_to_host bytes).
#   - 2 ranks: the one-step oracle holds (no-decay tensors bit-identical to decay 0), 2 ranks x grad-accum 1 end where
#     1 rank x grad-accum 2 ends (within fp32 sums), and ranks given another recipe fail naming it.
set -u
bin=${STRATA_BIN:?STRATA_BIN must name the strata binary}
here=$(dirname "${BASH_SOURCE[0]}")
source "$here/helpers/cli.sh"
cli_scratch cli_train_weight_decay

lr=0.01 wd=0.5
common=(train --model tiny --batch 2 --seq 32 --seed 11 --threads 2 --quiet)
one=("${common[@]}" --steps 1 --warmup 0 --lr "$lr" --min-lr "$lr")

check "help states the recipe" 0 "X on every 2-D weight matrix (attention qkv and proj, MLP fc and proj), 0 on" -- \
    "$bin" train --help
check "help: --decay-embeddings" 0 "--decay-embeddings with a weight decay: decay the token embedding" -- "$bin" train --help
check "estimate takes the flag" 0 "--weight-decay X" -- "$bin" estimate --help
check "--decay-embeddings alone" 2 "--decay-embeddings decays the embeddings by the weight decay, which is 0 here" -- \
    "$bin" "${common[@]}" --steps 1 --decay-embeddings
check "negative weight decay" 2 '--weight-decay "-1": must be a weight decay in [0, 1000000]' -- \
    "$bin" "${common[@]}" --steps 1 --weight-decay -1
check "estimate of a bare count" 2 "the weight decay's parameter groups need a model shape" -- \
    "$bin" estimate --params 1B --weight-decay 0.1
check "header without decay" 0 "  weight decay 0: one parameter group (--weight-decay X decays the 2-D weights)" -- \
    "$bin" "${common[@]}" --steps 1
check "header with decay" 0 "  weight decay 0.1 (--weight-decay) on 2-D weights (8 tensors, 98304 params); 0 on biases, norms, embeddings (20 tensors, 22272 params); parameter groups \"decay\" and \"no_decay\"" -- \
    "$bin" "${common[@]}" --steps 1 --weight-decay 0.1
check "header with the embeddings" 0 "on 2-D weights and embeddings (10 tensors, 118784 params); 0 on biases, norms (18 tensors, 1792 params)" -- \
    "$bin" "${common[@]}" --steps 1 --weight-decay 0.1 --decay-embeddings
printf '{"optimizer": {"type": "AdamW", "params": {"weight_decay": %s}}}' "$wd" >"$scratch/wd.json"
check "header: the config's value" 0 "  weight decay 0.5 (the config's optimizer.params.weight_decay) on 2-D weights" -- \
    "$bin" "${common[@]}" --steps 1 --config "$scratch/wd.json"
check "header: the flag wins" 0 "  weight decay 0 (--weight-decay; the config's optimizer.params.weight_decay 0.5 is overridden): one parameter group" -- \
    "$bin" "${common[@]}" --steps 1 --config "$scratch/wd.json" --weight-decay 0

# run NAME ARGS...: strata ARGS --dump-weights $scratch/NAME.bin, failing the test with its output when it fails.
run() {
    local name=$1; shift
    "$@" --dump-weights "$scratch/$name.bin" >"$scratch/$name.out" 2>&1 || { fail "$name: exit $?"; cat "$scratch/$name.out"; }
}
same() { # same A B WHAT: A.bin and B.bin bit-identical
    cmp -s "$scratch/$1.bin" "$scratch/$2.bin" && ok || fail "$3: $1 and $2 differ"
}
run w0 "$bin" "${common[@]}" --steps 1 --warmup 0 --lr "$lr" --min-lr 0
run w0b "$bin" "${common[@]}" --steps 1 --warmup 0 --lr 0.02 --min-lr 0 --weight-decay "$wd"
same w0 w0b "lr 0 (--min-lr 0) leaves the weights as initialized whatever the peak lr and the decay"
run a "$bin" "${one[@]}" --save "$scratch/ck_a"
run b "$bin" "${one[@]}" --weight-decay "$wd" --save "$scratch/ck_b"
run e "$bin" "${one[@]}" --weight-decay "$wd" --decay-embeddings
run c "$bin" "${one[@]}" --config "$scratch/wd.json"
same b c "the config's weight decay is the recipe's"
run c0 "$bin" "${one[@]}" --config "$scratch/wd.json" --weight-decay 0
same a c0 "--weight-decay 0 over the config's"

# oracle DIR A B W0 LR WD EMBEDDINGS: the one-step check of B (decay WD) against A (decay 0) from W0, by tensor (the
# names and sizes of a checkpoint of the same model in DIR, in the dump's order).
oracle() {
    python3 - "$@" <<'EOF'
import array, json, math, struct, sys
ckpt, pa, pb, p0, lr, wd, emb = sys.argv[1:8]
lr, wd, emb = float(lr), float(wd), emb == "1"
m = json.load(open(ckpt + "/manifest.json"))
tensors = [(t["name"], t["elements"][1]) for t in m["tensors"] if t["file"].startswith("model.")]
load = lambda p: array.array("f", open(p, "rb").read())
a, b, w0 = load(pa), load(pb), load(p0)
assert len(a) == len(b) == len(w0) == sum(n for _, n in tensors), (len(a), sum(n for _, n in tensors))
f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]
ulp = lambda x: 2.0 ** (math.frexp(abs(x))[1] - 24) if abs(x) >= 2.0 ** -126 else 2.0 ** -149
d = f32(1.0 - lr * wd)  # adam_consts_init: (float)(1 - lr * weight_decay)
decays = lambda n: n.endswith(("attn.qkv.weight", "attn.proj.weight", "mlp.fc.weight", "mlp.proj.weight")) or \
    (emb and n in ("embeddings.wte", "embeddings.wpe"))
at, report = 0, {"decay": [0, 0, 0.0], "no_decay": [0, 0, 0.0]}
for name, n in tensors:
    xa, xb, x0 = a[at:at + n], b[at:at + n], w0[at:at + n]
    at += n
    if not decays(name):
        assert xa.tobytes() == xb.tobytes(), f"{name} (not decayed) differs from the decay-0 run"
        report["no_decay"][0] += 1; report["no_decay"][1] += n
        continue
    moved = 0
    for ya, yb, y0 in zip(xa, xb, x0):
        bound = (ulp(ya) + ulp(yb)) / 2
        r = yb - f32(y0 * d) - (ya - y0)  # exact in doubles: the update of the decay-0 run, decayed w0
        assert abs(r) <= bound, f"{name}: {yb!r} is not the decayed {y0!r} + the update {ya - y0!r} ({r} > {bound})"
        moved += abs(yb - ya) > 4 * bound  # the decay's own move, far beyond the roundings
        report["decay"][2] = max(report["decay"][2], abs(r) / bound if bound else 0)
    assert moved >= 0.9 * n, f"{name}: only {moved} of {n} elements moved by the decay"
    report["decay"][0] += 1; report["decay"][1] += n
print(f"one step, lr {lr}, weight decay {wd}{' with the embeddings' if emb else ''}: {report['no_decay'][0]} tensors "
      f"({report['no_decay'][1]} elements) bit-identical to decay 0; {report['decay'][0]} tensors ({report['decay'][1]} "
      f"elements) = fl32(w0 x {d!r}) + the decay-0 update, worst residual {report['decay'][2]:.2f} of its rounding bound")
EOF
}
oracle "$scratch/ck_b/step-1" "$scratch/a.bin" "$scratch/b.bin" "$scratch/w0.bin" "$lr" "$wd" 0 && ok ||
    fail "the one-step oracle of --weight-decay $wd"
oracle "$scratch/ck_b/step-1" "$scratch/a.bin" "$scratch/e.bin" "$scratch/w0.bin" "$lr" "$wd" 1 && ok ||
    fail "the one-step oracle of --weight-decay $wd --decay-embeddings"
python3 - "$scratch/ck_b/step-1/manifest.json" "$wd" <<'EOF' && ok || fail "the checkpoint's parameter groups"
import json, sys
groups, wd = json.load(open(sys.argv[1]))["param_groups"], float(sys.argv[2])
assert [g["name"] for g in groups] == ["default", "decay", "no_decay"], groups
assert groups[1]["weight_decay"] == wd and groups[2]["weight_decay"] == 0, groups
want = [f"block{i}.{p}.weight" for i in range(2) for p in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")]
assert groups[1]["params"] == want, groups[1]["params"]
assert len(groups[2]["params"]) == 20 and "embeddings.wte" in groups[2]["params"], groups[2]["params"]
EOF

# Each step's lr reaches both groups: a second step at lr 0 (the cosine's end, --min-lr 0) moves nothing.
run two "$bin" "${common[@]}" --steps 2 --warmup 0 --lr "$lr" --min-lr 0 --weight-decay "$wd"
same b two "two steps, the second at lr 0, against one step"
run two_sib "$bin" "${common[@]}" --steps 2 --warmup 0 --lr "$lr" --min-lr 0 --weight-decay "$wd" --step-in-backward
same b two_sib "--step-in-backward: two steps, the second at lr 0, against one step"
run ord "$bin" "${common[@]}" --steps 4 --warmup 1 --weight-decay "$wd" --decay-embeddings
run sib "$bin" "${common[@]}" --steps 4 --warmup 1 --weight-decay "$wd" --decay-embeddings --step-in-backward
same ord sib "--step-in-backward against the ordinary step"

# Resume: 6 steps straight == 3 + save + resume 3.
wdr=(--steps 6 --warmup 2 --weight-decay "$wd" --decay-embeddings)
run straight "$bin" "${common[@]}" "${wdr[@]}"
run saved "$bin" "${common[@]}" "${wdr[@]}" --save "$scratch/ck" --save-every 3
run resumed "$bin" "${common[@]}" "${wdr[@]}" --resume "$scratch/ck/step-3"
grep -qx "resumed from $scratch/ck/step-3 at step 3" "$scratch/resumed.out" || fail "no resume line"
same straight resumed "6 steps straight against 3 + resume 3"
check "resume without the decay" 2 "--resume \"$scratch/ck/step-3\": the checkpoint was trained with --weight-decay 0.5 --decay-embeddings, this run has --weight-decay 0 (one group, \"default\"); the parameter groups must be the same to resume" -- \
    "$bin" "${common[@]}" --steps 6 --resume "$scratch/ck/step-3"
check "resume without --decay-embeddings" 2 "the checkpoint was trained with --weight-decay 0.5 --decay-embeddings, this run has --weight-decay 0.5 (groups \"default\", \"decay\", \"no_decay\")" -- \
    "$bin" "${common[@]}" --steps 6 --weight-decay "$wd" --resume "$scratch/ck/step-3"
check "resume of a run without decay, with it" 2 "the checkpoint was trained with --weight-decay 0, this run has --weight-decay 0.5" -- \
    "$bin" "${common[@]}" --steps 2 --weight-decay "$wd" --resume "$scratch/ck_a"
check "resume with another value" 0 "  weight decay 0.2 from here on; the checkpoint's run had 0.5" -- \
    "$bin" "${common[@]}" --steps 6 --weight-decay 0.2 --decay-embeddings --resume "$scratch/ck/step-3"

# strata estimate lays out the groups as training does: each hand-over copies the padded module off the device.
printf '{"zero_optimization": {"stage": 3}}' >"$scratch/s3.json"
for x in 0 "$wd"; do
    "$bin" train --model tiny --config "$scratch/s3.json" --steps 1 --batch 1 --seq 8 --threads 1 --quiet \
        --weight-decay "$x" --log-jsonl "$scratch/est$x.jsonl" >/dev/null 2>&1 || fail "train for estimate, decay $x"
    "$bin" estimate --json --model tiny --config "$scratch/s3.json" --weight-decay "$x" >"$scratch/est$x.json" 2>&1 ||
        fail "estimate --weight-decay $x"
done
python3 - "$scratch" "$wd" <<'EOF' && ok || fail "strata estimate --weight-decay against the run"
import json, sys
d, wd = sys.argv[1], sys.argv[2]
got = {x: json.loads(open(f"{d}/est{x}.jsonl").readline())["device_to_host_bytes"] for x in ("0", wd)}
est = {x: json.load(open(f"{d}/est{x}.json"))["offload_bytes_per_step"]["device_to_host"] for x in ("0", wd)}
print(f"device_to_host bytes per step, decay 0 / {wd}: logged {got['0']} / {got[wd]}, estimated {est['0']} / {est[wd]}")
assert got == est and got[wd] > got["0"], (got, est)
EOF

# 2 ranks (stage 3: each rank holds a shard of every module, cut across the groups' padded boundaries).
if cli_mpi_strata "${common[@]}" --steps 1; then
    mpi2() { # mpi2 NAME ARGS...: 2 ranks, dumping the weights
        local name=$1; shift
        timeout 90 bash "$here/helpers/mpi.sh" 2 "$bin" "$@" --dump-weights "$scratch/$name.bin" >"$scratch/$name.out" 2>&1 ||
            { fail "$name: 2 ranks, exit $?"; cat "$scratch/$name.out"; }
    }
    mpi2 r2a "${one[@]}"
    mpi2 r2b "${one[@]}" --weight-decay "$wd"
    oracle "$scratch/ck_b/step-1" "$scratch/r2a.bin" "$scratch/r2b.bin" "$scratch/w0.bin" "$lr" "$wd" 0 && ok ||
        fail "2 ranks: the one-step oracle of --weight-decay $wd"
    mpi2 r2 "${common[@]}" --steps 4 --warmup 1 --weight-decay "$wd" --decay-embeddings --offload host
    run r1 "$bin" "${common[@]}" --steps 4 --warmup 1 --weight-decay "$wd" --decay-embeddings --grad-accum 2
    python3 - "$scratch/r1.bin" "$scratch/r2.bin" <<'EOF' && ok || fail "2 ranks against 1 rank x grad-accum 2"
import array, sys
a, b = (array.array("f", open(p, "rb").read()) for p in sys.argv[1:3])
diff = max(abs(x - y) for x, y in zip(a, b))
print(f"--weight-decay, 4 steps: 2 ranks vs 1 rank x grad-accum 2, max weight diff {diff:.2e}")
assert len(a) == len(b) and diff < 1e-4, diff
EOF
    # Ranks given another recipe: finalize compares the configs (the value) and the groups (which tensors decay).
    disagree() { # disagree NAME TEXT RANK1_ARGS...: rank 0 has --weight-decay $wd, rank 1 the arguments given
        local name=$1 text=$2; shift 2
        local out rc
        out=$(timeout 60 bash "$here/helpers/mpi.sh" 1 "$bin" "${common[@]}" --steps 2 --weight-decay "$wd" : -np 1 \
            "$bin" "${common[@]}" --steps 2 "$@" 2>&1)
        rc=$?
        [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -qF -- "$text" <<<"$out" && ok ||
            { fail "$name: exit $rc, or the output lacks \"$text\":"; echo "$out"; }
    }
    disagree "ranks: no decay on rank 1" "the ranks' configs differ: optimizer.params.weight_decay is"
    disagree "ranks: --decay-embeddings on rank 1" 'parameter "embeddings.wte" is in group "no_decay" on rank 0 but in "decay" on rank 1' \
        --weight-decay "$wd" --decay-embeddings
else
    echo "skipped the 2-rank checks: no mpirun, or strata was built without MPI"
fi

cli_done cli_train_weight_decay
