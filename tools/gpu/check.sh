#!/usr/bin/env bash
# tools/run gpu [OUTDIR]: every CUDA path strata has, then the flagship runs, in one call on a GPU machine; one table
# on stdout, and OUTDIR (default build/gpu-check) gets check.log (every program's output), table.txt and
# gpu_check.json. Exits 77 without a GPU, 1 when a check failed, else 0.
#
# The programs come from the pack that tools/run gpu-pack makes on a build machine (.gpu/strata-gpu.tar.xz, or
# STRATA_GPU_PACK=DIR), unpacked under /tmp; without one, from the build tree (STRATA_BUILD_DIR, default build/).
# The whole call keeps within STRATA_GPU_SECONDS (480): each item has its own limit, cut to what is left, and an
# item that no longer fits is listed as not run. STRATA_GPU_ONLY=name,name runs only the items named; @set names
# the items of a set of tools/gpu/items.sh (GPU_SET_set), e.g. STRATA_GPU_ONLY=@flagship.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
. "$ROOT/tools/gpu/items.sh"
# STRATA_GPU_ONLY's names, a set's (@flagship: GPU_SET_flagship in items.sh) spelled out.
only=""
for n in ${STRATA_GPU_ONLY:+${STRATA_GPU_ONLY//,/ }}; do
    if [[ $n == @* ]]; then
        set_var=GPU_SET_${n#@}
        [ -n "${!set_var:-}" ] || { echo "STRATA_GPU_ONLY: no set $n; sets: $(compgen -v GPU_SET_ | sed 's/GPU_SET_/@/' |
            paste -sd' ')"; exit 2; }
        n=${!set_var}
    fi
    only+=${only:+,}$n
done
out=${1:-$ROOT/build/gpu-check}
deadline=$((SECONDS + ${STRATA_GPU_SECONDS:-480}))
mkdir -p "$out"
log=$out/check.log
: >"$log"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# ---------------------------------------------------------------- the programs and their libraries
pack=${STRATA_GPU_PACK:-$ROOT/.gpu}/strata-gpu.tar.xz
if [ -f "$pack" ]; then
    unpacked=/tmp/strata-gpu-pack
    rm -rf "$unpacked" && mkdir -p "$unpacked" && xz -dc "$pack" | tar -C "$unpacked" -xf - ||
        { echo "cannot unpack $pack"; exit 1; }
    bin_dir=$unpacked/bin lib=$unpacked/lib/libstrata.so
    ompi_lib=$unpacked/ompi/usr/lib/x86_64-linux-gnu/openmpi/lib
    export LD_LIBRARY_PATH=$unpacked/lib:$ompi_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    for f in "$unpacked"/lib-fallback/*; do
        ldconfig -p | grep -q "^[[:space:]]*$(basename "$f") " || cp "$f" "$unpacked/lib/"
    done
    if [ -x "$unpacked/ompi/usr/bin/orterun" ]; then
        export OPAL_PREFIX=$unpacked/ompi/usr PMIX_INSTALL_PREFIX=$unpacked/ompi/usr/lib/x86_64-linux-gnu/pmix2
        export PATH=$unpacked/ompi/usr/bin:$PATH
    fi
else
    bin_dir=${STRATA_BUILD_DIR:-$ROOT/build}
    lib=$bin_dir/libstrata.so
fi
bin=$bin_dir/strata
# cuBLAS 13 and NCCL from the machine: torch's own copies first (the Python checks load torch and strata in one
# process), then the CUDA toolkit's.
cuda_libs=$(
    { python3 -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))' 2>/dev/null |
        xargs -r -I{} find {}/nvidia -name 'lib*.so*' -printf '%h\n'
      find /usr/local/cuda/ /usr/local/cuda/lib64/ /usr/lib/x86_64-linux-gnu -maxdepth 3 \
        \( -name 'libcublas.so.*' -o -name 'libnccl.so.*' \) -printf '%h\n'; } 2>/dev/null | awk '!seen[$0]++' |
        paste -sd:)
LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}${cuda_libs:+:$cuda_libs}
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH#:}
# Open MPI on one host: shared memory only; plugins for networks this machine lacks are passed over quietly.
export OMPI_MCA_mca_base_component_show_load_errors=0
export STRATA_BIN=$bin STRATA_SOURCE_DIR=$ROOT STRATA_BUILD_DIR=$bin_dir STRATA_SCRATCH=$work/scratch
export STRATA_LIB=$lib PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$STRATA_SCRATCH"

info=$("$bin" info 2>&1) || { echo "$bin does not run here:"; echo "$info"; exit 1; }
if ! grep -E '^  cuda {2,}' <<<"$info" | grep -vq unavailable; then
    echo "tools/run gpu: no usable GPU here:"
    grep -E '^  cuda' <<<"$info"
    exit 77
fi

# ---------------------------------------------------------------- the table
rows=$work/rows.tsv
: >"$rows"
failed=0
# item NAME LIMIT_S CMD...: runs CMD (output to the log) within LIMIT_S seconds and what is left of the call; its
# row: pass (0), skip (77), FAIL, TIMEOUT or "not run", the seconds, and the figure: the last line CMD prints that
# starts with "FIGURE: ", else the test library's "N checks, M failed" line.
item() {
    local name=$1 limit=$2
    shift 2
    if [ -n "$only" ] && [[ ",$only," != *",$name,"* ]]; then
        return
    fi
    local left=$((deadline - SECONDS))
    if [ "$left" -lt 20 ]; then
        printf '%s\tnot run\t0\tno time left in this call\n' "$name" >>"$rows"
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    local t0=$SECONDS rc=0 o=$work/$name.out
    timeout -k 10 "$limit" "$@" >"$o" 2>&1 || rc=$?
    { echo "==== $name: $* (exit $rc, $((SECONDS - t0)) s)"; cat "$o"; } >>"$log"
    local status fig
    case $rc in
    0) status=pass ;;
    77) status=skip ;;
    124 | 137) status=TIMEOUT failed=1 ;;
    *) status=FAIL failed=1 ;;
    esac
    fig=$(grep '^FIGURE: ' "$o" | tail -1 | sed 's/^FIGURE: //')
    [ -n "$fig" ] || fig=$(grep -E '^[0-9]+ checks, [0-9]+ failed|^SKIP' "$o" | tail -1)
    [ -n "$fig" ] || fig=$(grep -v '^\s*$' "$o" | tail -1 | cut -c1-110)
    printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$((SECONDS - t0))" "$fig" >>"$rows"
    printf '%-26s %-8s %5s s  %s\n' "$name" "$status" "$((SECONDS - t0))" "$fig"
}

# ---------------------------------------------------------------- the items
{
    echo "gpu:     $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null)"
    echo "build:   $(cat "${unpacked:-/nonexistent}/BUILD" 2>/dev/null || echo "the build tree $bin_dir")"
    echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM," \
        "$(df -h --output=avail /tmp | tail -1 | tr -d ' ') free in /tmp; $("$bin" --version);" \
        "$(python3 -c 'import torch; print("torch", torch.__version__)' 2>/dev/null)"
} | tee -a "$log"
grep -E '^  (cuda|cpu|memory|numa)' <<<"$info" | tee -a "$log"
echo
printf '%-26s %-8s %7s  %s\n' item status time figure
for t in "${GPU_C_TESTS[@]}"; do
    item "$t" 240 "$bin_dir/$t"
done
# The CUDA model with its linear layers' operands rounded to bf16 (STRATA_MODEL_GEMM, model/cuda/gpt_ops_cuda.c).
item t_model_cuda_gemm_bf16 120 env STRATA_MODEL_GEMM=bf16 "$bin_dir/t_model_cuda"
# Issue 35's speed, early in the call: the 124M step in bf16 activations against PyTorch (the whole step), then
# forward + backward of two blocks of hidden 4096 against the bf16 peak, then where the new step's time goes.
peer=(--device cuda --strata "$bin" --layers 12 --hidden 768 --heads 12 --vocab 50304 --seq 1024 --batch 8 --steps 8
    --rounds 2 --lr 3e-4)
item torch_peer_124M_acts_bf16 240 env STRATA_MODEL_ACTS=bf16 python3 "$ROOT/benchmarks/gpt_speed.py" "${peer[@]}"
item torch_peer_h4096_acts_bf16 200 env STRATA_MODEL_ACTS=bf16 python3 "$ROOT/benchmarks/gpt_speed.py" \
    --device cuda --strata "$bin" --layers 2 --hidden 4096 --heads 32 --vocab 50304 --seq 1024 --batch 8 --steps 6 \
    --rounds 1 --lr 1e-4
export STRATA_GPU_WORK=$work
runs=$ROOT/tools/gpu/runs.sh
item kernels_124M_acts_bf16 150 env STRATA_MODEL_ACTS=bf16 bash "$runs" kernels 2500 1800 "${RUN_124M[@]}" --steps 4
for t in "${GPU_MPI_TESTS[@]}"; do
    item "$t" 60 "$bin_dir/$t"
    item "${t}_np2" 120 bash "$ROOT/tests/helpers/mpi.sh" 2 "$bin_dir/$t"
done
for t in "${GPU_PY_TESTS[@]}"; do
    item "$t" 240 python3 "$ROOT/tests/$t.py"
done
# The machine's cores and drive for issue 25: the compressed moments' Adam kernels against the fp32 one (all cores),
# and the I/O engine against fio on the machine's own file system.
item adam_moments 120 "$bin_dir/b_adam_moments" --melem 64 --reps 9
item io_peers 240 env PATH="$bin_dir:$PATH" bash "$ROOT/benchmarks/io_peers.sh" --rounds 3 --size 2GiB \
    --dir "$work/scratch/io-peers"
item cuda_checkpointing 150 bash "$runs" checkpointing
item cuda_twin_flow 150 bash "$runs" twin_flow
item cuda_ranks_np2 150 bash "$runs" ranks
item cuda_norm_pass 150 bash "$runs" norm_pass
item zero_offload_6.7B 300 bash "$runs" flagship z7b "${RUN_ZERO_OFFLOAD_7B[@]}" --steps 5 "${FLAGSHIP_SCHEDULE[@]}"
item train_cuda 240 bash "$ROOT/benchmarks/train_cuda.sh" --steps 12
# The device-resident 124M step in fp32 activations (the old path) against the same GPT in PyTorch (bf16 autocast,
# SDPA, fused AdamW) on the same GPU. (STRATA_MODEL_GEMM=bf16 was measured on 2026-11-26: no faster.)
item torch_peer_124M 240 python3 "$ROOT/benchmarks/gpt_speed.py" "${peer[@]}"
# Where the CUDA model's time goes: about one step's kernels of the 124M preset, and of two blocks of the flagship's
# shape.
item kernels_124M 150 bash "$runs" kernels 2500 1800 "${RUN_124M[@]}" --steps 4
item kernels_h4096 120 bash "$runs" kernels 400 300 --layers 2 --hidden 4096 --heads 32 --vocab 50304 \
    --context 1024 --seq 1024 --batch 8 --steps 4 --device cuda --offload device
# Twin-Flow: the optimizer's seconds per step on the 124M preset as the device takes half of it, then all of it.
item twin_flow_124M 150 bash "$runs" twin_speed "${RUN_124M[@]}" --steps 8
# Last, as they need the most time: they rarely fit in the same call (STRATA_GPU_ONLY=name,... or a set of items.sh,
# @flagship, @peers, @peers_z3, runs them alone).
# Issue 37's levers, each on its own (items.sh): the step in backward, then at the batch that hides Adam, then with
# bf16 activations.
item zero_offload_6.7B_sib 240 bash "$runs" flagship z7b-sib "${RUN_ZERO_OFFLOAD_7B_SIB[@]}" --steps 5 \
    "${FLAGSHIP_SCHEDULE[@]}"
item zero_offload_6.7B_sib_b16 240 bash "$runs" flagship z7b-sib-b16 "${RUN_ZERO_OFFLOAD_7B_SIB_B16[@]}" --steps 5 \
    "${FLAGSHIP_SCHEDULE[@]}"
item zero_offload_6.7B_sib_b16_acts_bf16 240 env STRATA_MODEL_ACTS=bf16 bash "$runs" flagship z7b-sib-b16-bf16 \
    "${RUN_ZERO_OFFLOAD_7B_SIB_B16[@]}" --steps 5 "${FLAGSHIP_SCHEDULE[@]}"
# DeepSpeed beside strata on the same GPT, data and config (benchmarks/flagship_peers.py), each engine in its own
# process: DeepSpeed from the carry (tools/gpu/ds_carry.sh makes .gpu/deepspeed; ds_install installs it and builds
# its CPU Adam once), strata.torch, and strata train with the same shape and optimizer. The ratios are tokens/s over
# DeepSpeed's.
ds_site=$work/ds-site
peers=(python3 "$ROOT/benchmarks/flagship_peers.py" --steps 5 --warmup 50 --lr 3e-4)
item ds_install 180 bash "$ROOT/tools/gpu/ds_carry.sh" --install "${STRATA_GPU_PACK:-$ROOT/.gpu}/deepspeed" "$ds_site"
item strata_torch_6.7B 300 "${peers[@]}" --peer strata-torch
item ds_zero2_6.7B 300 env PYTHONPATH="$ds_site:$PYTHONPATH" "${peers[@]}" --peer deepspeed-z2
echo "$PEER_CONFIG" >"$work/peer.json"
item strata_train_6.7B_peer 240 bash "$runs" flagship z7b-peer "${RUN_ZERO_OFFLOAD_7B[@]}" --steps 5 --warmup 50 \
    --lr 3e-4 --config "$work/peer.json"
item ds_zero3_6.7B 300 env PYTHONPATH="$ds_site:$PYTHONPATH" "${peers[@]}" --peer deepspeed-z3
echo "$RUN_ZERO_OFFLOAD_7B_TWIN_CONFIG" >"$work/z7b-twin.json"
item zero_offload_6.7B_twin 300 bash "$runs" flagship z7b-twin "${RUN_ZERO_OFFLOAD_7B[@]}" --steps 5 \
    "${FLAGSHIP_SCHEDULE[@]}" --config "$work/z7b-twin.json"
# Issue 38: a pretrained 6.74B Llama (bf16 safetensors written first) to its first step with the parameters on the
# GPU, streamed into strata's tiers against from_pretrained's whole copy: peak RSS and time to the first step.
item zero_init_7B 480 python3 "$ROOT/benchmarks/zero_init_gpu.py" --dir "$work/zero_init" --device cuda \
    --json "$out/zero_init_7B.json"
mkdir -p "$work/nvme"
echo "$RUN_ZERO_INFINITY_3B_CONFIG" >"$work/z3b.json"
echo "$RUN_ZERO_INFINITY_3B_SIB_CONFIG" >"$work/z3b-sib.json"
for v in z3b:zero_infinity_3B z3b-sib:zero_infinity_3B_sib; do
    item "${v#*:}" 480 bash "$runs" flagship "${v%%:*}" "${RUN_ZERO_INFINITY_3B[@]}" --steps 2 "${FLAGSHIP_SCHEDULE[@]}" \
        --nvme-dir "$work/nvme" --config "$work/${v%%:*}.json"
    rm -rf "$work/nvme"/* # the swap files of the run before
done

# ---------------------------------------------------------------- table and JSON
{
    echo
    printf '%-26s %-8s %7s  %s\n' item status time figure
    awk -F'\t' '{printf "%-26s %-8s %5s s  %s\n", $1, $2, $3, $4}' "$rows"
} >"$out/table.txt"
cat "$out/table.txt" >>"$log"
python3 - "$rows" "$out/gpu_check.json" <<'PY'
import json, sys
rows = [dict(zip(("item", "status", "seconds", "figure"), l.rstrip("\n").split("\t"))) for l in open(sys.argv[1])]
json.dump({"rows": rows, "failed": [r["item"] for r in rows if r["status"] in ("FAIL", "TIMEOUT")]},
          open(sys.argv[2], "w"), indent=1)
PY
echo
echo "tools/run gpu: $(grep -c $'\tpass\t' "$rows") passed, $(grep -cE $'\t(FAIL|TIMEOUT)\t' "$rows") failed," \
    "$(grep -c $'\tskip\t' "$rows") skipped, $(grep -c $'\tnot run\t' "$rows") not run; log and JSON in $out"
exit $failed
