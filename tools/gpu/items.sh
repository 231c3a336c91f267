# What tools/gpu/check.sh runs on a GPU (sourced by check.sh, pack.sh and plan.py's caller): the test programs that
# take the CUDA backend when a GPU answers, and the flagship runs, whose shapes tools/gpu/plan.py checks against the
# lent machines (one H100's 80 GB, 128 GiB of host memory, 64 GiB of disk) with `strata estimate`, no GPU needed.
# The kernels of issue 35 (bf16 activations, flash attention, the fused classifier, the grouped embedding backward)
# against the host kernels first: the newest code, the least run.
GPU_C_TESTS=(t_kcuda_attention t_kcuda_bf16 t_model_cuda t_device_conformance t_device_arena t_device_adam
    t_config_keys t_engine_create t_model_engine t_engine_equivalence t_engine_twin_flow t_engine_act
    t_model_checkpoint)
GPU_MPI_TESTS=(mpi_comm_gpu)
# Host benchmarks run on the GPU machine for its cores and its drive (issue 25): the compressed moments' Adam
# kernels against the fp32 one, and the I/O engine against fio (benchmarks/io_peers.sh).
GPU_BENCHMARKS=(b_adam_moments b_aio)
# Python tests run with the machine's python3 (its torch has CUDA) against the packed libstrata.so. py_tiled_linear:
# whether cuBLAS keeps nn.Linear's bits under TiledLinear's panels (issue 38).
GPU_PY_TESTS=(py_torch_engine py_hf_cuda py_offload_adam_cuda py_tiled_linear)

# ZeRO-Offload larger than the GPU: a 6.65B GPT (16 B/param of model states, 106 GB: more than an H100 holds), its
# parameters on the GPU in bf16, the optimizer (74 GiB) and the gradient store (25 GiB) in host memory.
RUN_ZERO_OFFLOAD_7B=(--layers 32 --hidden 4096 --heads 32 --vocab 50304 --context 1024 --seq 1024 --batch 8
    --device cuda --dtype bf16 --offload device --activation-checkpointing --host-budget 112GiB)
# Issue 37's levers on the flagship, each measured on its own against the run above: the step in backward (each
# module's update as its gradients complete, its bf16 copy going back to the GPU while backward continues; no gradient
# store: 75 GiB of host memory), then with the batch `strata estimate --tflops ... --adam-rate ...` names for hiding
# Adam behind backward (16), then with issue 35's bf16 activations. The gradients reach the host in bf16 in all of
# them (grad_handoff.h).
RUN_ZERO_OFFLOAD_7B_SIB=("${RUN_ZERO_OFFLOAD_7B[@]}" --step-in-backward)
RUN_ZERO_OFFLOAD_7B_SIB_B16=("${RUN_ZERO_OFFLOAD_7B_SIB[@]}" --batch 16)
# ZeRO-Infinity: the 3B preset with parameters and optimizer on NVMe under an 8 GiB host budget; sub-groups of 50M
# elements keep the optimizer's pinned slots inside it (benchmarks/scale.sh's config). --nvme-dir and --config are
# added by the caller (the config's JSON is RUN_ZERO_INFINITY_3B_CONFIG).
RUN_ZERO_INFINITY_3B=(--model 3B --batch 8 --seq 1024 --device cuda --dtype bf16 --offload nvme --host-budget 8GiB
    --activation-checkpointing)
RUN_ZERO_INFINITY_3B_CONFIG='{"zero_optimization": {"stage": 3, "sub_group_size": 50000000}}'
# The same with each module's update during backward (the host cache is on by default in both).
RUN_ZERO_INFINITY_3B_SIB_CONFIG='{"zero_optimization": {"stage": 3, "sub_group_size": 50000000},
    "strata": {"step_in_backward": true}}'
# Twin-Flow on the flagship: the device updates half of the optimizer's sub-groups (their fp32 state, 53 GB, on the
# GPU).
RUN_ZERO_OFFLOAD_7B_TWIN_CONFIG='{"zero_optimization": {"offload_optimizer": {"ratio": 0.5}}}'
# The 124M preset at the shape of benchmarks/train_cuda.sh's speed runs, everything the device can hold on it.
RUN_124M=(--model 124M --batch 8 --seq 1024 --device cuda --offload device)

# Named sets for STRATA_GPU_ONLY=@name (tools/gpu/check.sh), each within one call of 8 minutes on an H200: the
# flagship's levers (issue 37); DeepSpeed's stage 2 beside strata.torch and strata train on the same GPT and config,
# and its stage 3 (each DeepSpeed set installs the carry and builds its CPU Adam first: ds_install).
GPU_SET_flagship="zero_offload_6.7B,zero_offload_6.7B_sib,zero_offload_6.7B_sib_b16,zero_offload_6.7B_sib_b16_acts_bf16"
GPU_SET_peers="ds_install,strata_torch_6.7B,ds_zero2_6.7B,strata_train_6.7B_peer"
GPU_SET_peers_z3="ds_install,ds_zero3_6.7B"
GPU_SET_zero_init="zero_init_7B,py_tiled_linear"
# The flagship runs' schedule: a warmup that trains. At lr 1e-4 after one warmup step the 6.65B loss rose over the
# first steps (11.4 -> 22.5; the host model and a PyTorch GPT-2 of hidden 4096 rose the same way): Adam's first steps
# move every weight by about lr. Over a 50-step warmup a few timed steps run at lr 6e-6 .. 3e-5 and the loss falls.
FLAGSHIP_SCHEDULE=(--warmup 50 --lr 3e-4)
# The config the peers share (benchmarks/flagship_peers.py's ds_config), as strata train reads it: AdamW with
# betas (0.9, 0.95) and weight decay 0.1, gradient clipping 1.0.
PEER_CONFIG='{"gradient_clipping": 1.0, "optimizer": {"type": "AdamW",
    "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}}}'
