/*
 * The tiers that hold the model state: the NVMe swap space and its I/O engine, the pinned pool, and the
 * parameter, master-weight and Adam-moment arrays over the flat partition (the gradient stores belong to
 * grads.c). Built by finalize from the plan, written with the initial values, and closed by the engine.
 */
#ifndef STRATA_ENGINE_TIERS_H
#define STRATA_ENGINE_TIERS_H

#include "engine/plan/plan.h"
#include "engine/registry.h"
#include "nvme/io.h"
#include "nvme/swap.h"
#include "offload/pool.h"
#include "offload/tier_array.h"

typedef struct engine_tiers {
    size_t param_bytes;             /* bytes of one parameter element */
    strata_tier param_tier, opt_tier, grad_tier;
    nvme_io *io;
    nvme_swap *swap;
    pinned_pool *pool;
    tier_env env;
    tier_counters ctr;              /* env.ctr: what moved to and from NVMe, what the host cache served */
    tier_array param[2];            /* [front, back] with the delayed update, else param[0] only */
    int param_front;                /* the copy the trainer's fetches read */
    tier_array master, exp_avg, exp_avg_sq;
    strata_moments moments;         /* the form exp_avg and exp_avg_sq are stored in (strata.optimizer_moments) */
    tier_array exp_avg_scale, exp_avg_sq_scale; /* 8-bit moments: their fp32 block scales, always in host memory */
    bool param_is_master;           /* param[0] is master's memory, not a copy (tiers_open says when) */
    size_t host_tier_bytes;         /* what the plan puts in host memory */
    size_t cache_param_bytes;       /* the plan's host cache for parameters (host_cache.c) */
    strata_tier kept_tier;          /* the plan's home of a speculating step in backward's kept gradients */
    bool cache_follows_order;       /* its modules were chosen from a valid fetch order */
} engine_tiers;

/* Opens what the plan needs (the swap space over the config's NVMe paths when it places bytes there, the
 * pinned pool) and allocates the parameter arrays of param_numel elements and the optimizer arrays of opt_numel
 * (the sizes of the views the ZeRO stage puts them in), the moments in cfg's form. param_bytes and the three tiers
 * must be set. On failure
 * t holds what was opened: tiers_close undoes it.
 * fp32 parameters equal the master weights except while a delayed update is pending: where both live in host
 * memory, one rank holds them whole, nothing updates part of them elsewhere (Twin-Flow, step in backward) and no
 * second copy alternates, the parameter array is the master array itself (param_is_master). Adam then writes one
 * array instead of two: 28 bytes an element instead of 32, and 4 bytes of host memory an element less. */
strata_status tiers_open(engine_tiers *t, const strata_config *cfg, device *dev, dev_stream *copy_stream,
                         bool host_addressable_device, const plan *pl, size_t param_numel, size_t opt_numel,
                         bool one_rank);
/* Writes the initial state: each parameter's init callback, chunk by chunk, into the master weights and
 * the parameter copies (converted to param_dtype), each in its view (views: param and opt; rank picks the
 * shards); zero moments (in their form: what narrowing zeros gives). A model larger than RAM never needs to fit in RAM. module_crc (one per module, or NULL)
 * receives the crc32c of each module's initial fp32 values, for the ranks to compare. */
strata_status tiers_write_initial(engine_tiers *t, const registry *reg, strata_dtype param_dtype,
                                  const engine_views *views, int rank, uint32_t *module_crc);
/* Frees everything tiers_open made and zeroes t (a failed finalize can run again). */
void tiers_close(engine_tiers *t);

#endif
