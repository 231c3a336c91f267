#!/usr/bin/env bash
# `strata train` end to end on the tiny preset: bad arguments exit 2 naming the argument; the loss on the
# built-in corpus falls below a stated value; NVMe offload and everything on the device tier end with
# bit-identical weights; the summary, the JSONL log and the trace are written.
set -u
bin=${STRATA_BIN:?STRATA_BIN must name the strata binary}
source "$(dirname "${BASH_SOURCE[0]}")/helpers/cli.sh"
cli_scratch cli_train

: >"$scratch/empty.txt"
printf 'short text' >"$scratch/short.txt"
check "help" 0 "usage: strata train" -- "$bin" train --help
check "unknown preset" 2 '--model "huge" is not a preset; allowed: tiny' -- "$bin" train --model huge
check "data missing" 2 "--data \"$scratch/none.txt\": cannot open: No such file or directory" -- \
    "$bin" train --data "$scratch/none.txt"
check "data empty" 2 "--data \"$scratch/empty.txt\": the file is empty" -- "$bin" train --data "$scratch/empty.txt"
check "seq larger than data" 2 "--seq 32 is larger than the data" -- \
    "$bin" train --data "$scratch/short.txt" --seq 32
check "seq longer than context" 2 "--seq 100 is longer than the model's context 64" -- "$bin" train --seq 100
check "zero steps" 2 '--steps "0" must be a whole number of at least 1' -- "$bin" train --steps 0
check "bad batch" 2 '--batch "x" must be a whole number' -- "$bin" train --batch x
check "unknown option" 2 'unknown option --frobnicate' -- "$bin" train --frobnicate 1
check "nvme without dir" 2 '--offload "nvme": needs --nvme-dir DIR' -- "$bin" train --offload nvme
check "bad offload" 2 '--offload "gpu": allowed: device, host, nvme' -- "$bin" train --offload gpu
check "bad heads" 2 "hidden 64 is not a multiple of heads 3" -- "$bin" train --heads 3
check "bad budget" 2 '--device-budget "lots": is not a size' -- "$bin" train --device-budget lots
printf '{"zero_optimization": {"stage": 3, "sub_grup_size": 1e8}}' >"$scratch/bad.json"
check "bad config" 2 "--config \"$scratch/bad.json\"" -- "$bin" train --config "$scratch/bad.json"
check "bad config names the key" 2 "sub_grup_size" -- "$bin" train --config "$scratch/bad.json"
head -c 3000 "$0" >"$scratch/text.txt"
check "own data file" 0 "summary: 2 steps" -- "$bin" train --data "$scratch/text.txt" --steps 2 --batch 2 --seq 32
check "budget too small" 1 "device budget exceeded" -- "$bin" train --device-budget 1MiB --steps 1
check "bad activation format" 2 'STRATA_MODEL_ACTS must be "fp32"' -- env STRATA_MODEL_ACTS=fp16 "$bin" train --steps 1
check "bf16 activations on the host" 2 "STRATA_MODEL_ACTS=bf16 needs the CUDA backend" -- \
    env STRATA_MODEL_ACTS=bf16 "$bin" train --steps 1
check "bf16 activations with fp32 parameters" 2 "needs bf16 parameters (param_dtype bf16, --dtype bf16)" -- \
    env STRATA_MODEL_ACTS=bf16 "$bin" train --device cuda --dtype fp32 --steps 1

# The loss of the tiny model on the built-in corpus: ln(256) = 5.55 at the start, below 2.7 (mean of the last
# 10 of 150 steps; 2.3 measured) at the end.
out=$("$bin" train --model tiny --steps 150 --batch 8 --seed 1 --threads 2 --log-jsonl "$scratch/log.jsonl" \
    --trace "$scratch/trace.json" 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
    fail "train tiny: exit $rc"; echo "$out"
else
    lines=$(wc -l <"$scratch/log.jsonl")
    first=$(head -1 "$scratch/log.jsonl" | sed 's/.*"loss":\([0-9.]*\).*/\1/')
    tail10=$(tail -10 "$scratch/log.jsonl" | sed 's/.*"loss":\([0-9.]*\).*/\1/' | awk '{s += $1} END {printf "%.4f", s / NR}')
    echo "tiny: $lines steps logged, first loss $first, mean of the last 10 $tail10"
    [ "$lines" -eq 150 ] || fail "log has $lines lines, expected 150"
    awk -v f="$first" 'BEGIN {exit !(f > 5.0)}' || fail "first loss $first is not near ln(256)"
    awk -v t="$tail10" 'BEGIN {exit !(t < 2.7)}' || fail "loss did not fall below 2.7 in 150 steps: $tail10"
    for text in "summary: 150 steps" "throughput" "optimizer step" "peak        device" "trace       $scratch/trace.json"; do
        grep -qF -- "$text" <<<"$out" || fail "summary lacks \"$text\""
    done
    /usr/bin/python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$scratch/trace.json" 2>/dev/null ||
        grep -q '"traceEvents"\|"ph"' "$scratch/trace.json" || fail "trace.json is not a trace"
    ok
fi

# Placement must not change what is computed: NVMe offload under a device budget that forces refetches,
# host offload, and everything on the device tier end with bit-identical master weights.
mkdir -p "$scratch/nvme"
common=(train --model tiny --steps 12 --batch 4 --seed 7 --threads 2 --quiet)
"$bin" "${common[@]}" --dump-weights "$scratch/w_device.bin" >"$scratch/device.out" 2>&1 || fail "device run"
"$bin" "${common[@]}" --offload host --dump-weights "$scratch/w_host.bin" >"$scratch/host.out" 2>&1 || fail "host run"
"$bin" "${common[@]}" --offload nvme --nvme-dir "$scratch/nvme" --device-budget 4MiB \
    --dump-weights "$scratch/w_nvme.bin" >"$scratch/nvme.out" 2>&1 || { fail "nvme run"; cat "$scratch/nvme.out"; }
# The state written to NVMe is read back from the drive or from its host cache's mirror.
if grep -q "nvme->host 0 B" "$scratch/nvme.out" && ! grep -q "host cache .* served [1-9]" "$scratch/nvme.out"; then
    fail "the NVMe run read nothing back from NVMe or its host cache"
fi
size=$(stat -c %s "$scratch/w_device.bin" 2>/dev/null || echo 0)
[ "$size" -gt 0 ] || fail "no weights dumped"
if cmp -s "$scratch/w_device.bin" "$scratch/w_nvme.bin" && cmp -s "$scratch/w_device.bin" "$scratch/w_host.bin"; then
    echo "weights after 12 steps: device, host and NVMe placements bit-identical ($size bytes)"
    ok
else
    fail "weights differ between placements:"; cmp "$scratch/w_device.bin" "$scratch/w_nvme.bin"
    cmp "$scratch/w_device.bin" "$scratch/w_host.bin"
fi
# A different seed must give different weights (the comparison above can fail).
"$bin" train --model tiny --steps 2 --batch 4 --seed 8 --quiet --dump-weights "$scratch/w_other.bin" >/dev/null 2>&1
cmp -s "$scratch/w_device.bin" "$scratch/w_other.bin" && fail "different seeds gave identical weights"

cli_done cli_train
