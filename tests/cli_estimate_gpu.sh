#!/usr/bin/env bash
# `strata estimate` for a GPU user: with no placement in the config it places as "auto" does (a 7B model in bf16
# fits an 80 GB GPU and 120 GiB of host memory with the optimizer state in host memory, ZeRO-Offload's answer), a
# placement the config names is kept, --dtype overrides the config, a plan that does not fit lists the moves that make
# it fit with the optimizer state first, then the gradients, then the parameters, and --tflops / --adam-rate give the
# batch that hides Adam behind compute, checked against this test's own arithmetic for fresh inputs each run. Bad
# values of the new flags are usage errors (exit 2) that name what is allowed.
set -u
bin=${STRATA_BIN:?STRATA_BIN must name the strata binary}
source "$(dirname "${BASH_SOURCE[0]}")/helpers/cli.sh"
cli_scratch cli_estimate_gpu

expect() { # expect NAME GOT WANT
    [ "$2" = "$3" ] && ok || fail "$1: expected $3, got $2"
}
# field ARGS... -- PYTHON_EXPR: one value of `strata estimate --json ARGS` (d is the object)
field() {
    local args=()
    while [ "$1" != -- ]; do args+=("$1"); shift; done
    "$bin" estimate --json "${args[@]}" |
        python3 -c "import json, sys; d = json.load(sys.stdin); v = ($2); print(v if isinstance(v, str) else repr(v))"
}

# (a) The issue's case: no config, so auto; a device budget, so a GPU; bf16 parameters stay on it.
issue=(--params 7e9 --device-budget 78GiB --host-budget 120GiB --dtype bf16)
check "7B plans auto and fits" 0 "auto: parameters device + optimizer host, gradients host" -- \
    "$bin" estimate "${issue[@]}"
check "7B says why auto" 0 "the config names no placement" -- "$bin" estimate "${issue[@]}"
check "7B plans for a GPU" 0 "device  cuda (a device budget was given" -- "$bin" estimate "${issue[@]}"
expect "7B placement" "$(field "${issue[@]}" -- \
    'tuple(d["placement"][k] for k in ("backend", "dtype", "params", "optimizer", "auto", "fits"))')" \
    "('cuda', 'bf16', 'device', 'host', True, True)"
# Its own arithmetic: 70 modules of 100M, each padded to 4096 elements; bf16 parameters (2 bytes) on the device,
# fp32 master weights and moments (12) and the fp32 gradient store (4) in host memory, within the budgets.
python3 - "$("$bin" estimate --json "${issue[@]}")" <<'EOF' && ok ||
import json, sys
d = json.loads(sys.argv[1])
n = 70 * (-(-100000000 // 4096) * 4096)
lines = {l["what"]: (l["tier"], l["bytes"]) for l in d["plan_lines"]}
want = {"parameters": ("device", 2 * n), "master weights + Adam moments (fp32)": ("host", 12 * n),
        "gradient store (fp32)": ("host", 4 * n)}
for k, v in want.items():
    print(f"{k}: expected {v}, got {lines.get(k)}")
    assert lines.get(k) == v
t = d["tier_bytes"]
print(f"device {t['device']} <= {78 * 2**30}, host {t['host']} <= {120 * 2**30}")
assert 2 * n <= t["device"] <= 78 * 2**30 and 16 * n <= t["host"] <= 120 * 2**30
EOF
    fail "7B tier bytes against 2 / 12 + 4 bytes per element"
# Without --dtype the config's fp32 fits too (28 GB of parameters), and the estimate says train on cuda takes bf16.
check "7B fp32 fits" 0 "--dtype bf16 plans that" -- \
    "$bin" estimate --params 7e9 --device-budget 78GiB --host-budget 120GiB
# --dtype overrides the config's bf16.enabled.
echo '{"bf16": {"enabled": true}}' >"$scratch/bf16.json"
expect "--dtype over the config" "$(field --params 1e9 --config "$scratch/bf16.json" --dtype fp32 -- \
    'd["placement"]["dtype"], [l["bytes"] for l in d["plan_lines"] if l["what"] == "parameters"]')" \
    "('fp32', [$((4 * 10 * 100003840))])"
expect "the config's dtype" "$(field --params 1e9 --config "$scratch/bf16.json" -- 'd["placement"]["dtype"]')" bf16
# A placement the config names is estimated as it stands, not as auto's.
echo '{"zero_optimization": {"offload_param": {"device": "none"}, "offload_optimizer": {"device": "none"}}}' \
    >"$scratch/on_device.json"
expect "a named placement is kept" "$(field --device host --params 1e9 --config "$scratch/on_device.json" -- \
    'd["placement"]["params"], d["placement"]["optimizer"], d["placement"]["auto"]')" "('device', 'device', False)"
# --device host plans the host backend, whose device memory is RAM: auto keeps the optimizer there.
expect "--device host" "$(field --device host --params 1e9 --device-budget 78GiB -- \
    'd["placement"]["backend"], d["placement"]["optimizer"]')" "('host', 'device')"

# (b) The advice for a plan that does not fit: everything on a host backend's 8 GiB device, 20 GiB of host memory,
# gradients kept off NVMe: the optimizer state leaves the device first, then host memory, then the gradient store,
# and only then the parameters.
cat >"$scratch/tight.json" <<'JSON'
{"zero_optimization": {"offload_param": {"device": "none"}, "offload_optimizer": {"device": "none"}},
 "strata": {"gradients_on_nvme": false}}
JSON
tight=(--device host --config "$scratch/tight.json" --params 7e9 --module-params 50M --dtype bf16
    --device-budget 8GiB --host-budget 20GiB)
out=$("$bin" estimate "${tight[@]}" 2>&1)
rc=$?
expect "misfit exit" "$rc" 1
got=$(grep -E '^        [0-9]\. ' <<<"$out" | sed -E 's/^ +[0-9]\. (the [a-zA-Z ]+) \(.*$/\1/' | paste -sd ';')
order="the optimizer state to host memory;the optimizer state to NVMe;the gradient store to NVMe"
expect "moves, cheapest first" "$got" "$order;the parameters to host memory"
grep -qF "moves   cheapest first (the optimizer state, then the gradients, then the parameters)" <<<"$out" && ok ||
    { fail "misfit: no moves line; got:"; echo "$out"; }
last=$(grep -E '^        4\. ' <<<"$out")
grep -q ": fits$" <<<"$last" && ok || fail "the last move: expected it to fit, got: $last"
# Each move frees what it moves: the optimizer state (12 bytes per element) leaves the device, then host memory.
python3 - "$("$bin" estimate --json "${tight[@]}")" <<'EOF' && ok || fail "the moves' bytes"
import json, sys
d = json.loads(sys.argv[1])
m, t = d["moves"], d["tier_bytes"]
n = 140 * (-(-50000000 // 4096) * 4096)
print(f"device {t['device']} -> {m[0]['device_bytes']}: expected {12 * n} less")
assert t["device"] - m[0]["device_bytes"] == 12 * n
print(f"host {m[0]['host_bytes']} -> {m[1]['host_bytes']}: expected at least {12 * n - 20 * 2**30} less")
assert m[0]["host_bytes"] - m[1]["host_bytes"] >= 12 * n - 20 * 2**30
assert [x["fits"] for x in m] == [False, False, False, True], m
assert m[1]["needs"] == "zero_optimization.offload_optimizer.nvme_path", m[1]
EOF
# On a GPU, with no placement: auto's closest misses the host budget, and the first move is the optimizer to NVMe.
out=$("$bin" estimate --params 7e9 --device-budget 78GiB --host-budget 60GiB --dtype bf16 2>&1)
got=$(grep -E '^        1\. ' <<<"$out" | sed -E 's/^ +1\. (the [a-zA-Z ]+) \(.*$/\1/')
expect "GPU misfit: the first move" "$got" "the optimizer state to NVMe"

# (c) The batch that hides Adam, for two fresh (tflops, rate) pairs, against this test's own formula: compute
# 6·N·tokens/(T·1e12) (x 4/3 with checkpointing), Adam E/(R·1e6), the smallest batch whose overlap holds Adam (all
# of compute for the delayed update, backward's 2/3 or 3/4 of it for the step in backward).
seed=${STRATA_TEST_SEED:-$(date +%s)}
echo "cli_estimate_gpu: seed $seed (STRATA_TEST_SEED=$seed repeats it)"
read -r t1 r1 b1 t2 r2 b2 < <(python3 -c "
import random; g = random.Random($seed)
print(round(g.uniform(40, 900), 3), round(g.uniform(400, 9000), 2), g.randint(1, 16),
      round(g.uniform(40, 900), 3), round(g.uniform(400, 9000), 2), g.randint(1, 16))")
L=32 H=4096 V=50304 T=1024
shape=(--layers $L --hidden $H --heads 32 --vocab $V --seq $T --device-budget 78GiB --host-budget 112GiB --dtype bf16)
for pair in "$t1 $r1 $b1 ckpt" "$t2 $r2 $b2 keep"; do
    read -r tf rate batch mode <<<"$pair"
    flags=(--tflops "$tf" --adam-rate "$rate" --batch "$batch")
    [ "$mode" = ckpt ] && flags+=(--activation-checkpointing)
    json=$("$bin" estimate --json "${shape[@]}" "${flags[@]}")
    text=$("$bin" estimate "${shape[@]}" "${flags[@]}")
    python3 - "$json" "$text" "$tf" "$rate" "$batch" "$mode" $L $H $V $T <<'EOF' && ok ||
import json, math, re, sys
d, text = json.loads(sys.argv[1]), sys.argv[2]
tf, rate, batch, mode = float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
L, H, V, T = map(int, sys.argv[7:])
n = L * (12 * H * H + 13 * H) + (V + T) * H + 2 * H  # GPT-2: blocks, token and position embeddings, final norm
s = d["speed"]
e = s["adam_elements"]  # the padded layout: every element once, plus at most 4096 per tensor and per module
assert n <= e <= n + 4096 * (13 * L + 8), (n, e)
f = (8 if mode == "ckpt" else 6) * n
share = 6 / 8 if mode == "ckpt" else 4 / 6
compute = f * batch * T / (tf * 1e12)
adam = e / (rate * 1e6)
per_seq = f * T / (tf * 1e12)
want = {"compute_s": compute, "adam_s": adam, "after_backward": compute + adam,
        "step_in_backward": compute + max(0, adam - share * compute), "delayed_update": max(compute, adam)}
got = {"compute_s": s["compute_s"], "adam_s": s["adam_s"], **s["step_s"]}
hide = {"after_backward": math.ceil(adam / per_seq), "step_in_backward": math.ceil(adam / (per_seq * share)),
        "delayed_update": math.ceil(adam / per_seq)}
hide = {k: max(1, v) for k, v in hide.items()}
bad = [k for k in want if not math.isclose(got[k], want[k], rel_tol=1e-9)]
bad += [k for k in hide if s["hide_adam_batch"][k] != hide[k]]
rows = {k: re.search(r"^%s .* s  (\d+)" % re.escape(k), text, re.M) for k in
        ("after backward (default)", "step in backward", "delayed update")}
shown = [int(m.group(1)) if m else None for m in rows.values()]
if shown != list(hide.values()):
    bad.append("table")
print(f"tflops {tf}, rate {rate}, batch {batch}, {mode}: expected {want} hide {hide}; "
      f"got {got} hide {s['hide_adam_batch']} table {shown}")
sys.exit(1 if bad else 0)
EOF
        fail "hide-Adam batch, tflops $tf, rate $rate, batch $batch, $mode"
done
expect "the default Adam rate" "$(field "${issue[@]}" --tflops 300 -- 'd["speed"]["adam_rate_melem_s"]')" 5000.0
check "no --tflops: Adam's seconds only" 0 "give --tflops" -- "$bin" estimate "${issue[@]}" --adam-rate 4000
out=$("$bin" estimate "${issue[@]}")
grep -q "^SPEED" <<<"$out" && fail "a SPEED block without --tflops or --adam-rate" || ok
check "the help says where the Adam rate comes from" 0 "the fp32 step on a 16-core" -- "$bin" estimate --help

# (d) Bad values: usage errors that name what is allowed.
check "bad --dtype" 2 '--dtype "fp8": allowed: fp32, bf16, fp16' -- "$bin" estimate "${issue[@]/bf16/fp8}"
check "bad --adam-rate" 2 '--adam-rate "fast" is not a rate in (0, 10000000]' -- \
    "$bin" estimate "${issue[@]}" --adam-rate fast
check "zero --adam-rate" 2 '--adam-rate "0" is not a rate in (0, 10000000]' -- \
    "$bin" estimate "${issue[@]}" --adam-rate 0
check "bad --tflops" 2 '--tflops "-3" is not a rate in (0, 1000000]' -- "$bin" estimate "${issue[@]}" --tflops -3
check "bad --device" 2 '--device "tpu": allowed: auto, host, cuda' -- "$bin" estimate "${issue[@]}" --device tpu

cli_done cli_estimate_gpu
