#!/usr/bin/env bash
# Activation checkpointing and offloaded activations in `strata train`: the weights after a few optimizer steps are
# byte for byte those of keeping every activation (checkpointing alone, block inputs offloaded to host memory and to
# NVMe, with the layer-wise schedule too); the header says what is kept; and `strata estimate`'s largest batch that
# fits a device budget is what training fits: that batch trains, one more is refused at the plan.
set -u
bin=${STRATA_BIN:?STRATA_BIN must name the strata binary}
source "$(dirname "${BASH_SOURCE[0]}")/helpers/cli.sh"
cli_scratch cli_train_activations
mkdir "$scratch/nvme"
# The placement strata train takes by default, named, so that the estimate below plans it rather than "auto"'s.
echo '{"strata": {"backend": "host"}, "zero_optimization": {"offload_param": {"device": "none"},
  "offload_optimizer": {"device": "none"}}}' >"$scratch/host.json"
model=(--layers 4 --heads 2 --hidden 64 --vocab 256 --context 64 --seq 64)
train=("$bin" train "${model[@]}" --config "$scratch/host.json" --steps 3 --batch 2 --grad-accum 2 --threads 2 --quiet)

check "keep every activation" 0 "" -- "${train[@]}" --dump-weights "$scratch/keep.bin"
check "checkpointing" 0 "activation checkpointing: each block keeps its input" -- \
    "${train[@]}" --activation-checkpointing --dump-weights "$scratch/ckpt.bin"
check "offloaded to host" 0 "the block inputs are offloaded" -- \
    "${train[@]}" --offload-activations host --dump-weights "$scratch/host.bin"
check "offloaded to nvme" 0 "the block inputs are offloaded" -- \
    "${train[@]}" --offload-activations nvme --nvme-dir "$scratch/nvme" --dump-weights "$scratch/nvme.bin"
check "offloaded, layer-wise" 0 "" -- \
    "${train[@]}" --offload-activations host --schedule layerwise --dump-weights "$scratch/layerwise.bin"
for run in ckpt host nvme layerwise; do
    if cmp -s "$scratch/keep.bin" "$scratch/$run.bin"; then
        ok
    else
        fail "$run: the weights differ from keeping every activation ($(cmp "$scratch/keep.bin" "$scratch/$run.bin" 2>&1))"
    fi
done
check "bad tier" 2 '--offload-activations "disk": allowed: host, nvme, auto' -- "${train[@]}" --offload-activations disk
check "nvme without a directory" 2 "needs a swap directory" -- "${train[@]}" --offload-activations nvme

# The estimate's largest batch under a device budget is training's.
budget=6MiB
fits() { # fits ROW [FLAGS...]: the estimate's largest batch of the row whose first words are ROW
    local row=$1; shift
    "$bin" estimate --layers 4 --heads 2 --hidden 64 --vocab 256 --seq 64 --batch 1 --config "$scratch/host.json" \
        --device-budget $budget "$@" | awk -v r="$row" 'index($0, r) == 1 { print $(NF - ($NF ~ /above/ ? 4 : 0)) }'
}
for mode in keep offload; do
    flags=() row="every activation"
    [ $mode = offload ] && flags=(--offload-activations host) row="checkpointing + offload"
    n=$(fits "$row" "${flags[@]}")
    if ! [ "${n:-0}" -gt 0 ] 2>/dev/null; then
        fail "$mode: no largest batch in the estimate (got \"$n\")"
        continue
    fi
    run=("$bin" train "${model[@]}" --config "$scratch/host.json" --steps 1 --threads 2 --quiet \
        --device-budget $budget "${flags[@]}")
    check "$mode: batch $n fits, as estimated" 0 "" -- "${run[@]}" --batch "$n"
    check "$mode: batch $((n + 1)) does not" 1 "device budget exceeded" -- "${run[@]}" --batch $((n + 1))
    echo "$mode: the estimate's largest batch under $budget is $n"
done
keep_n=$(fits "every activation") off_n=$(fits "checkpointing + offload" --offload-activations host)
[ "${off_n:-0}" -gt "${keep_n:-0}" ] && ok ||
    fail "offloading fits batch $off_n, keeping every activation $keep_n: expected more"
cli_done cli_train_activations
