#!/usr/bin/env bash
# The strata CLI as a user meets it: exit codes (0 ok, 2 bad input), messages on stderr, --help everywhere.
set -u
bin=${STRATA_BIN:?STRATA_BIN must name the strata binary}
source "$(dirname "${BASH_SOURCE[0]}")/helpers/cli.sh"
cli_scratch cli_basics

check "no command" 2 "usage: strata <command>" -- "$bin"
check "unknown command" 2 'unknown command "frobnicate"' -- "$bin" frobnicate
check "top help" 0 "commands:" -- "$bin" --help
check "version" 0 "strata 0.1.0" -- "$bin" --version
for cmd in info config nvme-bench bench estimate train ckpt; do
    check "$cmd --help" 0 "usage: strata $cmd" -- "$bin" "$cmd" --help
done

check "info" 0 "device backends" -- "$bin" info
check "info host backend" 0 "host" -- "$bin" info
check "info extra arg" 2 'unexpected argument "x"' -- "$bin" info x

check "config no args" 2 "usage: strata config" -- "$bin" config
check "config defaults" 0 "aio.queue_depth" -- "$bin" config defaults
check "config missing file" 2 "cannot open \"$scratch/none.json\": No such file or directory (ENOENT)" -- \
    "$bin" config check "$scratch/none.json"

cat >"$scratch/bad.json" <<'JSON'
{"zero_optimization": {"stage": 3, "sub_grup_size": 1e8, "offload_param": {"device": "gpu"}},
 "aio": {"queue_depth": 0}}
JSON
check "config unknown key" 2 "did you mean zero_optimization.sub_group_size?" -- "$bin" config check "$scratch/bad.json"
check "config bad enum" 2 'allowed: "none", "cpu", "nvme"' -- "$bin" config check "$scratch/bad.json"
check "config range" 2 "aio.queue_depth = 0 is out of range [1, 1024]" -- "$bin" config check "$scratch/bad.json"

cat >"$scratch/good.json" <<'JSON'
{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}},
 "aio": {"block_size": "4MiB", "queue_depth": 16}, "bf16": {"enabled": true}}
JSON
check "config good" 0 "good.json: ok" -- "$bin" config check "$scratch/good.json"
out=$("$bin" config check "$scratch/good.json")
grep -qE '^aio.block_size +4194304 \(4.00 MiB\) +changed$' <<<"$out" && ok ||
    { fail "resolved table row for aio.block_size; got:"; echo "$out"; }
grep -qE '^aio.single_submit +false +same$' <<<"$out" && ok ||
    { fail "resolved table row for aio.single_submit"; }

# estimate: the planner's arithmetic for a shape, without allocating; a placement the config names is estimated as it
# stands (without one the estimate places as "auto" does: tests/cli_estimate_gpu.sh)
echo '{"zero_optimization": {"offload_param": {"device": "none"}, "offload_optimizer": {"device": "none"}}}' \
    >"$scratch/on_device.json"
check "estimate over budget" 1 "device budget exceeded: the plan needs" -- \
    "$bin" estimate --model 124M --device-budget 1GiB --config "$scratch/on_device.json"
check "estimate names the knob" 1 'set zero_optimization.offload_param.device to "cpu" or "nvme"' -- \
    "$bin" estimate --model 124M --device-budget 1GiB --config "$scratch/on_device.json"
mkdir -p "$scratch/nvme"
cat >"$scratch/nvme.json" <<JSON
{"zero_optimization": {"offload_param": {"device": "nvme", "nvme_path": "$scratch/nvme"},
                       "offload_optimizer": {"device": "nvme", "nvme_path": "$scratch/nvme"}, "sub_group_size": 5e7},
 "bf16": {"enabled": true}, "strata": {"device_budget_bytes": "2GiB", "host_budget_bytes": "8GiB"}}
JSON
check "estimate 3B on NVMe fits" 0 "master weights + Adam moments (fp32)" -- "$bin" estimate --model 3B --config "$scratch/nvme.json"
out=$("$bin" estimate --model 3B --config "$scratch/nvme.json")
grep -qE '^device +[0-9.]+ [KMG]iB +2.00 GiB +yes$' <<<"$out" && grep -qE '^host +[0-9.]+ [KMG]iB +8.00 GiB +yes$' <<<"$out" &&
    ok || { fail "estimate 3B table:"; echo "$out"; }
# The gradient store stays in host memory when the host budget holds it (124M: 0.5 GB), else goes to NVMe (3B: 12 GB).
check "estimate 3B gradients on NVMe" 0 "optimizer state nvme, gradients nvme" -- "$bin" estimate --model 3B --config "$scratch/nvme.json"
check "estimate 124M gradients on host" 0 "optimizer state nvme, gradients host" -- \
    "$bin" estimate --model 124M --config "$scratch/nvme.json" --device-budget 4GiB
check "estimate bad preset" 2 '--model "7T" is not a preset; allowed: tiny, 124M' -- "$bin" estimate --model 7T
check "estimate custom needs hidden" 2 "a model of its own needs --layers and --hidden (--heads, --vocab 50257 and --seq 1024 are optional); to change one dimension of a preset, name it: e.g. --model 124M --seq 512" -- "$bin" estimate --layers 4
# A preset with dimensions changed, in either order: the same model as spelling every dimension out.
check "estimate preset + seq" 0 "model   gpt 124M, seq 512: 12 layers, hidden 768, vocab 50257, seq 512: 124 million" -- \
    "$bin" estimate --model 124M --seq 512
a=$("$bin" estimate --seq 512 --model 124M --layers 6 | sed -n 1p)
b=$("$bin" estimate --layers 6 --heads 12 --hidden 768 --vocab 50257 --seq 512 | sed -n 1p)
[ "${a#*: }" = "${b#*: }" ] && grep -qF "gpt 124M, layers 6, seq 512: 6 layers" <<<"$a" && ok ||
    fail "preset + dimensions \"$a\" differs from the spelled-out model \"$b\""
check "estimate preset hidden vs heads" 2 "--hidden 100 is not a multiple of 12 heads; give --heads that divides it" -- \
    "$bin" estimate --model 124M --hidden 100
check "estimate bad size" 2 '--device-budget "lots" is not a size' -- "$bin" estimate --device-budget lots

cli_done cli_basics
