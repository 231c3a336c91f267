#!/usr/bin/env bash
# The checks and runs of tools/gpu/check.sh that are built from `strata train` on the GPU (it runs them, with
# STRATA_BIN, STRATA_GPU_WORK and Open MPI's environment set):
#   runs.sh checkpointing | twin_flow | ranks | norm_pass
#                                                 exactness checks; each prints a FIGURE line and fails when inexact
#   runs.sh flagship NAME ARGS...                 a timed run; FIGURE: tokens/s, TFLOPS and the step's split
#   runs.sh kernels SKIP COUNT ARGS...            GPU time per kernel (Nsight Compute) of launches SKIP..SKIP+COUNT
#   runs.sh twin_speed ARGS...                    optimizer seconds per step at offload_optimizer.ratio 1, 0.5, 0
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=${STRATA_BIN:?} work=${STRATA_GPU_WORK:?}
. "$ROOT/tests/helpers/mpi.sh"

# train NAME ARGS...: strata train on the GPU, its per-step log in $work/NAME.jsonl and final weights in NAME.bin.
train() {
    local name=$1
    shift
    "$bin" train --seed 7 --quiet --log-jsonl "$work/$name.jsonl" --dump-weights "$work/$name.bin" "$@"
}
# same A B WHAT: FIGURE line comparing two runs' weights and losses; fails unless bit-identical.
same() {
    python3 "$ROOT/tools/gpu/compare_runs.py" --exact "$work/$1" "$work/$2" "$3"
}
small=(--layers 4 --hidden 512 --heads 8 --context 256 --seq 256 --batch 8 --steps 6 --device cuda --dtype bf16)

checkpointing() { # the activation store on CUDA streams: checkpointing and its offload change no bit
    train act-plain "${small[@]}" --offload device &&
        train act-ckpt "${small[@]}" --offload device --activation-checkpointing &&
        train act-host "${small[@]}" --offload device --activation-checkpointing --offload-activations host &&
        same act-plain act-ckpt "checkpointing" && same act-plain act-host "checkpointing + offload to host"
}
twin_flow() { # the device Adam (gpu/cuda/adam.cu) for part or all of the step, against the CPU's
    for r in 1 0.5 0; do
        train "twin-$r" "${small[@]}" --offload device --config "$(ratio_config $r)" || return 1
    done
    same twin-1 twin-0.5 "ratio 0.5" && same twin-1 twin-0 "ratio 0"
}
ranks() { # 2 ranks on one GPU (MPI staging through pinned memory) against 1 rank with 2 micro-batches
    train rank1 "${small[@]}" --offload host --batch 4 --grad-accum 2 &&
        mpi_run 2 "$bin" train --seed 7 --quiet --log-jsonl "$work/rank2.jsonl" --dump-weights "$work/rank2.bin" \
            "${small[@]}" --offload host --batch 4 &&
        python3 "$ROOT/tools/gpu/compare_runs.py" --tolerance 1e-5 "$work/rank1" "$work/rank2" "2 ranks vs 1"
}
norm_pass() { # clipping in backward on CUDA: speculating and after a norm pass (the CUDA backward run twice must
    # give the same gradients bit for bit, or the step fails naming the module), against the ordinary step
    echo '{"gradient_clipping": 1.0}' >"$work/clip.json"
    mkdir -p "$work/np-o" "$work/np-s" "$work/np-n"
    train clip-ordinary "${small[@]}" --offload nvme --nvme-dir "$work/np-o" --config "$work/clip.json" &&
        train clip-sib "${small[@]}" --offload nvme --nvme-dir "$work/np-s" --config "$work/clip.json" \
            --step-in-backward &&
        train clip-np "${small[@]}" --offload nvme --nvme-dir "$work/np-n" --config "$work/clip.json" \
            --step-in-backward --norm-pass &&
        same clip-ordinary clip-sib "step in backward, clipping 1.0" &&
        same clip-ordinary clip-np "step in backward after a norm pass, clipping 1.0"
}
# ratio_config R: the path of a config with offload_optimizer.ratio R.
ratio_config() {
    echo "{\"zero_optimization\": {\"offload_optimizer\": {\"ratio\": $1}}}" >"$work/ratio-$1.json"
    echo "$work/ratio-$1.json"
}
# flagship NAME ARGS...: a timed strata train on the GPU; FIGURE: tokens/s, TFLOPS and the step's split (medians
# of the steps after the first).
flagship() {
    local name=$1
    shift
    "$bin" train --seed 7 --log-jsonl "$work/$name.jsonl" "$@" | tee "$work/$name.out" || return 1
    local up
    up=$(sed -n 's/.*after \([0-9.]*\) s of start-up (\(.*\))$/\1 s (\2)/p' "$work/$name.out")
    python3 "$ROOT/tools/gpu/compare_runs.py" --stats "$work/$name.jsonl" |
        sed "s|^FIGURE: |FIGURE: start-up ${up:-?}; |"
}

# kernels SKIP COUNT ARGS...: a strata train run under Nsight Compute, timing launches SKIP .. SKIP + COUNT (about
# one step: the first steps warm up); the table sums GPU time per kernel name.
kernels() {
    local skip=$1 count=$2
    shift 2
    command -v ncu >/dev/null || { echo "SKIP: ncu (Nsight Compute) is not on PATH"; exit 77; }
    ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip "$skip" --launch-count "$count" \
        --log-file "$work/kernels.csv" "$bin" train --seed 7 --quiet "$@" &&
        python3 "$ROOT/tools/gpu/compare_runs.py" --kernels "$work/kernels.csv"
}
# twin_speed ARGS...: the optimizer's seconds per step (median after the first) with the CPU doing all of it, half,
# none.
twin_speed() {
    local fig=""
    for r in 1 0.5 0; do
        "$bin" train --seed 7 --quiet --log-jsonl "$work/speed-$r.jsonl" "$@" --config "$(ratio_config $r)" ||
            return 1
        fig+="ratio $r: $(python3 "$ROOT/tools/gpu/compare_runs.py" --stats "$work/speed-$r.jsonl" |
            sed -E 's/.*step ([0-9.]+) s = .*optimizer ([0-9.]+) .*/step \1 s, optimizer \2 s/'); "
    done
    echo "FIGURE: $fig"
}

case ${1:-} in
checkpointing | twin_flow | ranks | norm_pass | flagship | kernels | twin_speed) "$@" ;;
*) echo "usage: runs.sh checkpointing|twin_flow|ranks|norm_pass|flagship|kernels|twin_speed ARGS..." >&2; exit 2 ;;
esac
