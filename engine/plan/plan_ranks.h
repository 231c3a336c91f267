/*
 * What one rank of a data-parallel world holds and moves per step, as the ZeRO papers count it: the
 * model-state bytes per stage (ZeRO §5), the elements each collective moves (counted like the engine's
 * comm_bytes: all-gathered outputs plus reduce-scattered inputs, an all-reduce being one of each), and what
 * offload moves between the tiers. Pure arithmetic, no allocation: `strata estimate` prints it for worlds it
 * cannot start, and the engine can size its shards with it.
 */
#ifndef STRATA_ENGINE_PLAN_RANKS_H
#define STRATA_ENGINE_PLAN_RANKS_H

#include <stddef.h>

#include "strata.h"

/* The ZeRO paper's mixed-precision accounting: 2-byte parameters and gradients, and K = 12 bytes of Adam
 * state per element (fp32 master weights, exp_avg, exp_avg_sq). */
#define PLAN_ZERO_PARAM_BYTES ((size_t)2)
#define PLAN_ZERO_GRAD_BYTES ((size_t)2)
#define PLAN_ZERO_ADAM_K ((size_t)12)

/* The elements of one partitioned state class a rank owns: ceil(numel / world), so the largest slice. With
 * world_size <= 1 the whole class. */
size_t plan_rank_slice_numel(size_t numel, int world_size);

typedef struct plan_model_states {
    size_t params_bytes, grads_bytes, optimizer_bytes;
    size_t total_bytes;            /* model_states_per_rank_bytes: the sum of the three */
} plan_model_states;

/* Model-state bytes per rank at a ZeRO stage (0..3) for numel parameters under the paper's accounting:
 * stage 0 (2+2+K)Ψ; stage 1 2Ψ + 2Ψ + KΨ/N; stage 2 2Ψ + (2+K)Ψ/N; stage 3 (2+2+K)Ψ/N, where Ψ/N is
 * plan_rank_slice_numel (exact when N divides Ψ). */
void plan_model_states_per_rank(size_t numel, int world_size, int zero_stage, plan_model_states *out);

typedef struct plan_comm {
    size_t reduce_scatter_elements, all_gather_elements;
    size_t reduce_scatter_bytes, all_gather_bytes;
} plan_comm;

/* Elements and bytes one rank's collectives move in one optimizer step of grad_accum micro-batches.
 * Gradients travel in fp32 (reduce-scatter of the fp32 gradient, so N ranks sum exactly as one rank
 * accumulating does); parameters in their own dtype (param_bytes per element). With Ψ = numel, k = grad_accum:
 *   stage 0: one fp32 all-reduce per step      rs Ψ (fp32),   ag Ψ (fp32)
 *   stage 1: reduce-scatter at the step        rs Ψ (fp32),   ag Ψ (param dtype) of the updated slices
 *   stage 2: reduce-scatter every micro-batch  rs kΨ (fp32),  ag Ψ (param dtype)
 *   stage 3: and gather in forward and backward rs kΨ (fp32), ag 2kΨ (param dtype)
 * so 2Ψ, 2Ψ, 2Ψ and 3Ψ at k = 1. A world of one rank exchanges nothing: all zero. */
void plan_comm_per_step(size_t numel, int world_size, int zero_stage, int grad_accum, size_t param_bytes,
                        plan_comm *out);

typedef struct plan_traffic {
    size_t nvme_read_bytes, nvme_write_bytes;
    size_t host_to_device_bytes, device_to_host_bytes;
} plan_traffic;

/* What offload moves per rank per step of k = grad_accum micro-batches, for total_numel elements of which
 * shard_numel are this rank's slice (bandwidth-centric partitioning: at stage 3 each rank reads only its
 * slice and the all-gather assembles the module on the device; the optimizer state from stage 1 on and
 * the gradients from stage 2 on are likewise the slice). P, G, O are the parameter, gradient and
 * optimizer elements this rank keeps:
 *   parameters off the device (stage 3): read from their home 2k times (forward and backward), P·pb each
 *     way: host->device always, an NVMe read first when they live on NVMe;
 *   gradients: each micro-batch copies every module's whole gradients off the device in the parameter dtype into
 *     pinned staging (the ranks reduce-scatter them there), total·pb device->host; with the optimizer off the
 *     device, a gradient store on NVMe is written each micro-batch and read back k times (accumulate, step);
 *   optimizer on NVMe: master, exp_avg, exp_avg_sq read and written once per step, 12·O each way (opt_elem_bytes·O:
 *     8·O with bf16 moments, 6·O with 8-bit ones, whose block scales stay in host memory);
 *   the updated parameters (O·pb) go back to the parameters' home: host->device when that is the
 *     device, an NVMe write when it is NVMe. */
void plan_traffic_per_step(size_t total_numel, size_t shard_numel, int zero_stage, int grad_accum,
                           size_t param_bytes, strata_tier param_tier, strata_tier opt_tier, strata_tier grad_tier,
                           size_t opt_elem_bytes, plan_traffic *out);

#endif
