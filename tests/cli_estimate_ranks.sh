#!/usr/bin/env bash
# `strata estimate` for worlds it cannot start: the ZeRO paper's seeds (Ψ = 7.5B, N = 64) come out exactly,
# ZeRO-3's model states scale as 1/N, the paper's communication is 2Ψ/2Ψ/2Ψ/3Ψ (and kΨ + ... with accumulation)
# while the engine's (comm_*, what comm_bytes logs: cli_estimate_comm.sh) adds only its padding, world 1 is the
# plain plan, a bare --params count is planned as modules of a stated size and says so, every tier that does not fit
# names its budget and knob, and bad inputs name the flag, the value and the range.
set -u
bin=${STRATA_BIN:?STRATA_BIN must name the strata binary}
source "$(dirname "${BASH_SOURCE[0]}")/helpers/cli.sh"

# json KEY ARGS...: one number from --json (python3 reads it; no jq needed)
json() {
    local key=$1; shift
    "$bin" estimate --json "$@" | python3 -c "import json,sys; v=json.load(sys.stdin)['$key']; print(v if isinstance(v,int) else repr(v))"
}
expect() { # expect NAME GOT WANT
    [ "$2" = "$3" ] && ok || fail "$1: got $2, want $3"
}

seeds=(120000000000 31406250000 16640625000 1875000000)
gb=(120.0 31.4 16.6 1.9)
for s in 0 1 2 3; do
    expect "seeds stage $s bytes" "$(json model_states_per_rank_bytes --params 7.5e9 --world-size 64 --stage $s)" "${seeds[$s]}"
    out=$("$bin" estimate --params 7.5B --world-size 64 --stage $s)
    grep -qE "^$s \*? +[a-z+ ()]+ +[0-9]+ +[0-9]+ +[0-9]+ +${seeds[$s]} +${gb[$s]}$" <<<"$out" &&
        ok || { fail "seeds table row stage $s:"; echo "$out"; }
done
expect "seeds stage 1 optimizer" "$(json optimizer_per_rank_bytes --params 7500M --world-size 64 --stage 1)" 1406250000
expect "seeds stage 2 grads" "$(json grads_per_rank_bytes --params 7500000000 --world-size 64 --stage 2)" 234375000

psi=7500000000
comm=(2 2 2 3)
for s in 0 1 2 3; do
    expect "comm stage $s" "$(json paper_comm_elements_per_step --params 7.5e9 --world-size 64 --stage $s)" \
        $((comm[s] * psi))
    # the engine's count: 75 modules of 100M, each padded to 64 shards of 4096-element blocks
    padded=$(json comm_elements_per_step --params 7.5e9 --world-size 64 --stage $s)
    [ "$padded" -ge $((comm[s] * psi)) ] && [ "$padded" -le $((comm[s] * (psi + 75 * 64 * 4096))) ] &&
        ok || fail "engine comm stage $s: $padded is not the paper's ${comm[s]}Ψ plus padding"
done
# bytes: fp32 gradients; stage 0 all-reduces fp32, later stages gather parameters in their dtype (fp32 default)
expect "comm bytes stage 3" "$(json paper_comm_bytes_per_step --params 7.5e9 --world-size 64 --stage 3)" $((12 * psi))
# accumulation over k = 4 micro-batches: stage 0/1 reduce once (2Ψ), stage 2 kΨ + Ψ, stage 3 kΨ + 2kΨ
acc=(2 2 5 12)
for s in 0 1 2 3; do
    expect "comm k=4 stage $s" "$(json paper_comm_elements_per_step --params 7.5e9 --world-size 64 --stage $s --grad-accum 4)" \
        $((acc[s] * psi))
done
expect "world 1 moves nothing" "$(json comm_elements_per_step --params 7.5e9 --world-size 1 --stage 3)" 0

# ZeRO-3: 16Ψ/N exactly where N divides Ψ, and strata's partitioned plan lines shrink with it
p=1073741824
for n in 1 2 4 8 1024; do
    expect "zero-3 N=$n" "$(json model_states_per_rank_bytes --params $p --world-size $n --stage 3)" $((16 * p / n))
done
one=$(json tier_bytes --model 1.5B --world-size 1 --stage 3)
for n in 2 8 64; do
    "$bin" estimate --json --model 1.5B --world-size $n --stage 3 | python3 -c "
import json, sys
d = {l['what']: l['bytes'] for l in json.load(sys.stdin)['plan_lines']}
one = {l['what']: l['bytes'] for l in json.loads(sys.argv[1])}
for k in ('parameters', 'master weights + Adam moments (fp32)', 'gradient store (fp32)'):
    # each module's slice is rounded up to 4096 elements, so at most 4096 elements per module more than 1/N
    assert one[k] / $n <= d[k] <= one[k] / $n + 50 * 4096 * 12, (k, one[k], d[k])
assert d['gradient buffers of one module'] == one['gradient buffers of one module']
" "$("$bin" estimate --json --model 1.5B | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["plan_lines"]))')" &&
        ok || fail "zero-3 plan lines shrink at N=$n"
done
[ -n "$one" ] || fail "tier_bytes missing"

# world 1 is today's plan: the same tables as a plain estimate
# (the world's header line first, its own blocks after the tier table)
plain=$("$bin" estimate --model 350M)
world1=$("$bin" estimate --model 350M --world-size 1 | sed -n '2,/^nvme/p')
[ "$(wc -l <<<"$plain")" -gt 10 ] && [ "$plain" = "$world1" ] && ok ||
    { fail "world 1 differs from the plain estimate:"; diff <(echo "$plain") <(echo "$world1"); }

# the bandwidth analysis: 6·Ψ·tokens flops; the overlap bound is the slowest of compute and the link
out=$("$bin" estimate --json --params 7.5e9 --world-size 64 --stage 3 --link-gbps 100 --tflops 70 --tokens 1024)
python3 -c "
import json, sys
d = json.loads(sys.argv[1])
assert d['flops_per_step'] == 6 * 7.5e9 * 1024
assert abs(d['comm_time_s'] - d['comm_bytes_per_step'] / 12.5e9) < 1e-9
assert d['step_time_lower_bound_s'] == max(d['compute_time_s'], d['comm_time_s'])
assert abs(d['link_efficiency_ait'] - d['efficiency_no_overlap']) < 1e-12   # the paper's form agrees
" "$out" && ok || { fail "bandwidth analysis:"; echo "$out"; }
check "bandwidth table" 0 "step, perfect overlap (max)" -- "$bin" estimate --params 7.5e9 --world-size 64 --link-gbps 100

check "world 0" 2 '--world-size "0" is not a whole number in [1, 1000000]' -- "$bin" estimate --world-size 0
check "stage 4" 2 '--stage "4" is not a whole number in [0, 3]; ZeRO stages' -- "$bin" estimate --stage 4
check "params abc" 2 '--params "abc" is not a whole number in [1, 1000000000000000]; write a parameter count like 7.5e9' -- \
    "$bin" estimate --params abc
check "link rate" 2 '--link-gbps "-1" is not a rate in (0, 1000000]' -- "$bin" estimate --link-gbps -1

# A bare count is never one module: its plan holds modules of --module-params (default 100M), and it says so.
check "params as modules" 0 "model   7500000000 parameters as 75 modules of 100000000 (--module-params): a bare count has no layers, so the plan takes equal modules, no tied embeddings and no activations" -- \
    "$bin" estimate --params 7.5e9 --world-size 64 --stage 3
check "module params" 0 "as 38 modules of 200000000" -- "$bin" estimate --params 7.5e9 --module-params 200M --world-size 64
big=$("$bin" estimate --json --params 7.5e9 --world-size 64 --stage 3 | python3 -c "
import json, sys
d = {l['what']: l['bytes'] for l in json.load(sys.stdin)['plan_lines']}
print(d['gradient buffers of one module'])")
[ "$big" -lt $((2 * 4 * 100100000)) ] && ok ||
    fail "7.5B x 64: one module's gradient buffers take $big bytes: the plan still holds the whole model as one module"
check "module params without params" 2 "--module-params cuts a bare --params count into modules" -- \
    "$bin" estimate --model tiny --module-params 1M
# A tier that does not fit says which budget and which knob, whether or not a device budget was given (everything
# placed on the device: without a placement the estimate would place as "auto" does).
on_device=$(mktemp)
echo '{"zero_optimization": {"offload_param": {"device": "none"}, "offload_optimizer": {"device": "none"}}}' >"$on_device"
out=$("$bin" estimate --params 1T --world-size 64 --stage 3 --device-budget 80GiB --host-budget 16GiB \
    --config "$on_device" 2>&1)
for text in "why     device: device budget exceeded" "strata.device_budget_bytes allows 80.00 GiB" \
    "why     host: host budget exceeded" "strata.host_budget_bytes allows 16.00 GiB; raise strata.host_budget_bytes"; do
    grep -qF -- "$text" <<<"$out" && ok || { fail "1T FITS NO lacks \"$text\":"; echo "$out"; }
done
out=$("$bin" estimate --params 7.5e9 --host-budget 1GiB 2>&1)
grep -q "^host .* NO$" <<<"$out" && grep -qF "why     host: host budget exceeded" <<<"$out" && ok ||
    { fail "host NO without a device budget gives no reason:"; echo "$out"; }

# LoRA's case: a 7B base frozen, 4.2M adapter parameters trained. The frozen modules take parameters only: the
# optimizer state (12 bytes) and the gradient store (4) are the trained part's, padded to its own modules.
lora=$(mktemp)
echo '{"bf16":{"enabled":true},"zero_optimization":{"stage":3,"offload_param":{"device":"cpu"},"offload_optimizer":{"device":"cpu"}}}' >"$lora"
out=$("$bin" estimate --params 7e9 --trainable-params 4.2M --host-budget 20GiB --config "$lora" 2>&1)
grep -qF "frozen  4200000 of them trained (--trainable-params; 4202496 elements padded), the other 6995800000 frozen" \
    <<<"$out" && grep -qE "^host +master weights \+ Adam moments \(fp32\) +48\.09 MiB$" <<<"$out" &&
    grep -qE "^host +gradient store \(fp32\) +16\.03 MiB$" <<<"$out" && grep -qE "^host .* yes$" <<<"$out" && ok ||
    { fail "7B with 4.2M trained: the frozen base counts parameters only (4202496 x 12 B, x 4 B) and fits 20 GiB:"
      echo "$out"; }
out=$("$bin" estimate --params 7e9 --host-budget 20GiB --config "$lora" 2>&1)
grep -qE "^host +master weights \+ Adam moments \(fp32\) +78\.23 GiB$" <<<"$out" && grep -qE "^host .* NO$" <<<"$out" &&
    ok || { fail "7B all trained: 78.23 GiB of optimizer state, which 20 GiB does not hold:"; echo "$out"; }
rm -f "$lora" "$on_device"
check "trainable without params" 2 "--trainable-params is the trained part of a bare --params count" -- \
    "$bin" estimate --model tiny --trainable-params 1M
check "trainable above params" 2 "(at most it)" -- "$bin" estimate --params 1M --trainable-params 2M

cli_done cli_estimate_ranks
