#!/usr/bin/env bash
# Offload device "auto" in `strata estimate` and `strata train`: the estimate places the state classes as training
# would (the fastest placement that fits the budgets) and prints the placement and why in its tiers section; when
# nothing fits it says auto tried every placement (and that NVMe was not tried without an nvme_path); the train
# header prints the placement finalize chose.
set -u
bin=${STRATA_BIN:?STRATA_BIN must name the strata binary}
source "$(dirname "${BASH_SOURCE[0]}")/helpers/cli.sh"
cli_scratch cli_estimate_auto
mkdir "$scratch/nvme"

auto() { # auto FILE BACKEND [NVME_DIR]: a config with both devices "auto"
    local paths=""
    [ -n "${3:-}" ] && paths=", \"nvme_path\": \"$3\""
    cat >"$1" <<JSON
{"zero_optimization": {"stage": 3, "sub_group_size": 4194304, "stage3_prefetch_bucket_size": 1000000,
  "offload_param": {"device": "auto"$paths}, "offload_optimizer": {"device": "auto"$paths}},
 "strata": {"backend": "$2"}}
JSON
}
auto "$scratch/host.json" host
auto "$scratch/cuda.json" cuda
auto "$scratch/nvme.json" host "$scratch/nvme"
estimate() { # estimate CONFIG DEVICE_BUDGET HOST_BUDGET: the 124M preset under $scratch/CONFIG.json
    "$bin" estimate --model 124M --config "$scratch/$1.json" --device-budget "$2" --host-budget "$3"
}

check "all on the device" 0 "auto: parameters device + optimizer device, gradients host: the fastest placement" -- \
    estimate host 8GiB 16GiB
check "cuda keeps the optimizer off the GPU" 0 "the optimizer runs on the CPU" -- estimate cuda 8GiB 16GiB
check "optimizer to the host" 0 \
    "auto: parameters device + optimizer host, gradients host: faster placements ruled out: parameters device + optimizer device: needs" -- \
    estimate host 1GiB 16GiB
# With a small prefetch window the parameters off the device need less there (two of the 150 MiB embedding and
# one gradient buffer, 454 MiB) than on it (625 MiB).
check "parameters to the host" 0 "tiers   parameters host (fp32), optimizer state host, gradients host" -- \
    estimate host 500MiB 16GiB
check "no nvme_path: nothing fits" 1 "NVMe was not tried" -- estimate host 1GiB 1GiB
check "nothing fits names the closest" 1 'offload device "auto" tried every placement and none fits' -- \
    estimate host 1GiB 1GiB
check "optimizer to NVMe, mirrored" 0 "auto: parameters device + optimizer nvme" -- estimate nvme 1GiB 1GiB
check "the host cache in the reason" 0 "the host cache mirrors" -- estimate nvme 1GiB 1GiB
check "parameters host, optimizer NVMe" 0 "auto: parameters host + optimizer nvme, gradients nvme" -- \
    estimate nvme 500MiB 1200MiB
check "all on NVMe" 0 "auto: parameters nvme + optimizer nvme, gradients nvme" -- estimate nvme 500MiB 1100MiB

# The train header: "auto" as configured, then the placement finalize chose.
check "train header" 0 "placement auto: parameters device + optimizer device" -- \
    "$bin" train --config "$scratch/host.json" --device host --steps 1 --quiet
check "train header configured" 0 "params fp32 auto, optimizer auto" -- \
    "$bin" train --config "$scratch/host.json" --device host --steps 1 --quiet

cli_done cli_estimate_auto
