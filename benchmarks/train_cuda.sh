#!/usr/bin/env bash
# The GPT model on the CUDA backend (needs a GPU; exits 77 without one):
#  1. loss match: the 124M preset trained for a few steps on CUDA in bf16 and on the host in fp32, same seed and
#     data; the per-step losses must agree within bf16 tolerance (|diff| <= 0.05, the same bar as 2.5 bf16 ulps of
#     a loss near 10);
#  2. speed: the 124M preset on CUDA with parameters and optimizer in host memory (ZeRO-Offload) and on NVMe
#     (ZeRO-Infinity): median tokens/s and model TFLOPS (6 x parameters + 12 x layers x seq x hidden FLOPs per
#     token) over the steps after the first two.
#
# usage: benchmarks/train_cuda.sh [--json] [--steps N] [--dir DIR]
#   STRATA_BIN: the strata binary (default build/strata); MATCH_ARGS / SPEED_ARGS override the shapes below.
set -euo pipefail

. "$(dirname "$0")/lib.sh"
steps=20 dir=$here/build/scratch/train_cuda
bench_args "$@"
info=$("$bin" info)
if ! grep -qE '^  cuda {2,}' <<<"$info" || grep -qE '^  cuda {2,}unavailable' <<<"$info"; then
    echo "train_cuda.sh: no usable CUDA device here:"; grep -E '^  cuda {2,}' <<<"$info"; exit 77
fi
mkdir -p "$dir"
out=$(mktemp -d)
trap 'rm -rf "$out" "$dir"/nvme-*' EXIT INT TERM

match=(${MATCH_ARGS:---model 124M --batch 4 --seq 256 --steps 8 --warmup 2 --lr 3e-4})
speed=(${SPEED_ARGS:---model 124M --batch 8 --seq 1024 --warmup 2 --lr 3e-4})
seed=5

bench_machine
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu:     /' || true
echo "match:   ${match[*]} (cuda bf16 vs host fp32), seed $seed"
echo "speed:   ${speed[*]}, $steps steps, seed $seed"
echo

run() { # run NAME args...
    local name=$1; shift
    "$bin" train --seed "$seed" --quiet --log-jsonl "$out/$name.jsonl" "$@" >"$out/$name.out" 2>&1 ||
        { echo "run $name failed:"; cat "$out/$name.out"; exit 1; }
}

# 1. loss match
run match-cuda "${match[@]}" --device cuda --dtype bf16 --offload host
run match-host "${match[@]}" --device host --dtype fp32 --offload host --device-budget 4GiB
read -r max_diff match_ok <<<"$(python3 - "$out/match-cuda.jsonl" "$out/match-host.jsonl" <<'PY'
import json, sys
cuda = [json.loads(l)["loss"] for l in open(sys.argv[1])]
host = [json.loads(l)["loss"] for l in open(sys.argv[2])]
print(f"{'step':>4} {'loss cuda bf16':>15} {'loss host fp32':>15} {'|diff|':>8}", file=sys.stderr)
for i, (c, h) in enumerate(zip(cuda, host)):
    print(f"{i + 1:>4} {c:>15.5f} {h:>15.5f} {abs(c - h):>8.5f}", file=sys.stderr)
worst = max(abs(c - h) for c, h in zip(cuda, host))
print(f"{worst:.5f} {'yes' if worst <= 0.05 and len(cuda) == len(host) else 'NO'}")
PY
)"
echo "loss match: max |diff| $max_diff (limit 0.05): $match_ok"
echo

# 2. speed
# stats FILE -> "median_tokens_per_s median_tflops median_step_s median_stall_s median_optimizer_s"
stats() {
    python3 - "$1" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
med = lambda k: statistics.median(r[k] for r in rows)
print(f'{med("tokens_per_s"):.0f} {med("tflops"):.2f} {med("step_s"):.4f} {med("stall_s"):.4f} {med("optimizer_s"):.4f}')
PY
}
mkdir -p "$dir/nvme-speed"
run speed-host "${speed[@]}" --steps "$steps" --device cuda --offload host
run speed-nvme "${speed[@]}" --steps "$steps" --device cuda --offload nvme --nvme-dir "$dir/nvme-speed"
printf '%-34s %10s %8s %8s %8s %11s\n' "placement (cuda, bf16)" "tokens/s" "TFLOPS" "step s" "stall s" "optimizer s"
read -r h_tps h_tf h_step h_stall h_opt <<<"$(stats "$out/speed-host.jsonl")"
read -r n_tps n_tf n_step n_stall n_opt <<<"$(stats "$out/speed-nvme.jsonl")"
printf '%-34s %10s %8s %8s %8s %11s\n' "params+optimizer in host memory" "$h_tps" "$h_tf" "$h_step" "$h_stall" "$h_opt"
printf '%-34s %10s %8s %8s %8s %11s\n' "params+optimizer on NVMe" "$n_tps" "$n_tf" "$n_step" "$n_stall" "$n_opt"
if [ $json -eq 1 ]; then
    printf '{"match":"%s","speed":"%s","steps":%s,"max_loss_diff":%s,"host_tokens_per_s":%s,"host_tflops":%s,' \
        "${match[*]}" "${speed[*]}" "$steps" "$max_diff" "$h_tps" "$h_tf"
    printf '"nvme_tokens_per_s":%s,"nvme_tflops":%s}\n' "$n_tps" "$n_tf"
fi
[ "$match_ok" = yes ]
