#include "engine/plan/plan_ranks.h"

size_t plan_rank_slice_numel(size_t numel, int world_size)
{
    size_t n = world_size > 1 ? (size_t)world_size : 1;
    return (numel + n - 1) / n;
}

void plan_model_states_per_rank(size_t numel, int world_size, int zero_stage, plan_model_states *out)
{
    size_t slice = plan_rank_slice_numel(numel, world_size);
    /* Each stage partitions one more class: 1 the optimizer state, 2 the gradients, 3 the parameters. */
    out->optimizer_bytes = PLAN_ZERO_ADAM_K * (zero_stage >= 1 ? slice : numel);
    out->grads_bytes = PLAN_ZERO_GRAD_BYTES * (zero_stage >= 2 ? slice : numel);
    out->params_bytes = PLAN_ZERO_PARAM_BYTES * (zero_stage >= 3 ? slice : numel);
    out->total_bytes = out->params_bytes + out->grads_bytes + out->optimizer_bytes;
}

void plan_comm_per_step(size_t numel, int world_size, int zero_stage, int grad_accum, size_t param_bytes,
                        plan_comm *out)
{
    *out = (plan_comm){0};
    if (world_size <= 1)
        return;
    size_t k = grad_accum > 1 ? (size_t)grad_accum : 1;
    /* Stages 0 and 1 reduce the accumulated gradient once per step; from stage 2 the gradient store is
     * partitioned, so each micro-batch's gradients are reduce-scattered as backward hands them over. */
    out->reduce_scatter_elements = zero_stage >= 2 ? k * numel : numel;
    /* Stage 3 keeps no whole copy of the parameters: forward and backward gather them each micro-batch. */
    out->all_gather_elements = zero_stage >= 3 ? 2 * k * numel : numel;
    out->reduce_scatter_bytes = 4 * out->reduce_scatter_elements;
    /* Stage 0's all-reduce is of the fp32 gradient: its gather half moves fp32 too. */
    out->all_gather_bytes = (zero_stage == 0 ? 4 : param_bytes) * out->all_gather_elements;
}

void plan_traffic_per_step(size_t total_numel, size_t shard_numel, int zero_stage, int grad_accum,
                           size_t param_bytes, strata_tier param_tier, strata_tier opt_tier, strata_tier grad_tier,
                           size_t opt_elem_bytes, plan_traffic *out)
{
    *out = (plan_traffic){0};
    size_t k = grad_accum > 1 ? (size_t)grad_accum : 1;
    size_t p = zero_stage >= 3 ? shard_numel : total_numel;
    size_t g = zero_stage >= 2 ? shard_numel : total_numel;
    size_t o = zero_stage >= 1 ? shard_numel : total_numel;
    if (param_tier != STRATA_TIER_DEVICE) {
        out->host_to_device_bytes += 2 * k * p * param_bytes;
        if (param_tier == STRATA_TIER_NVME)
            out->nvme_read_bytes += 2 * k * p * param_bytes;
    }
    /* Each hand-over copies the module's whole gradients off the device, in the parameter dtype, into pinned staging
     * (the ranks reduce-scatter them from there, in host memory), wherever the store or the optimizer lives. */
    out->device_to_host_bytes += param_bytes * k * total_numel;
    if (opt_tier == STRATA_TIER_DEVICE)
        return; /* the step itself stays on the device */
    if (grad_tier == STRATA_TIER_NVME) {
        out->nvme_write_bytes += 4 * k * g;
        out->nvme_read_bytes += 4 * k * g;
    }
    if (opt_tier == STRATA_TIER_NVME) {
        out->nvme_read_bytes += opt_elem_bytes * o;
        out->nvme_write_bytes += opt_elem_bytes * o;
    }
    if (param_tier == STRATA_TIER_DEVICE)
        out->host_to_device_bytes += o * param_bytes;
    else if (param_tier == STRATA_TIER_NVME)
        out->nvme_write_bytes += o * param_bytes;
}
