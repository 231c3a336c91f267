/* The data-parallel world: the views of a stage and the step's collectives; see ranks.h. */
#include "engine/ranks/ranks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/util.h"
#include "engine/engine.h"
#include "engine/ranks/rank_agree.h"

struct rank_state {
    tier_array grad_shard;     /* stage 1: this rank's reduce-scattered gradients, which the step reads */
    tier_array param_shard;    /* stages 1, 2: the parameters the step updates, before they are all-gathered */
    float *full, *shard;       /* scratch: one module's fp32 gradients, and this rank's part of them */
    void *pbuf;                /* scratch: one module's parameters (NVMe and device tiers) */
    uint64_t *flags;           /* scratch: one word per module */
    uint64_t comm_bytes;       /* payload of the data collectives (see comm.h, Counting) */
};

void ranks_views(int zero_stage, reg_view *param, reg_view *opt, reg_view *grad)
{
    /* Gradients and optimizer state exist for the trained modules only (registry.h, Frozen modules). */
    *param = zero_stage >= 3 ? REG_SHARD : REG_FULL;
    *opt = zero_stage >= 1 ? REG_SHARD_TRAINED : REG_FULL_TRAINED;
    *grad = zero_stage >= 2 ? REG_SHARD_TRAINED : REG_FULL_TRAINED;
}

bool ranks_grads_sharded_at_handoff(const strata_engine *e)
{
    return e->world > 1 && registry_view_sharded(e->views.grad);
}

bool ranks_fetch_gathers(const strata_engine *e)
{
    return e->world > 1 && e->views.param == REG_SHARD;
}

static bool publishes(const strata_engine *e)
{
    return e->world > 1 && registry_view_sharded(e->views.opt) && e->views.param == REG_FULL;
}

strata_status ranks_create(strata_engine *e, rank_state **out)
{
    rank_state *rs = calloc(1, sizeof *rs);
    if (!rs)
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory for the ranks");
    *out = rs;
    if (e->world == 1)
        return STRATA_OK;
    size_t big = registry_largest_module_numel(e->reg), nmods = registry_nmodules(e->reg);
    size_t shards = registry_view_numel(e->reg, REG_SHARD_TRAINED), pb = e->tiers.param_bytes;
    if (posix_memalign((void **)&rs->full, 4096, big * 4) || posix_memalign((void **)&rs->shard, 4096, big * 4) ||
        posix_memalign(&rs->pbuf, 4096, big * pb) || !(rs->flags = calloc(nmods + AGREE_STEP_WORDS, sizeof *rs->flags)))
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory for the collectives' buffers "
                       "(%zu elements of the largest module)", big);
    if (registry_view_sharded(e->views.opt) && !registry_view_sharded(e->views.grad))
        ERR_CHECK(tarr_alloc_cpu(&rs->grad_shard, &e->tiers.env, e->tiers.grad_tier, shards, 4,
                                 "gradient store (this rank's shard)"));
    if (publishes(e))
        ERR_CHECK(tarr_alloc(&rs->param_shard, &e->tiers.env, STRATA_TIER_HOST, shards, pb,
                             "parameters (this rank's shard)"));
    return STRATA_OK;
}

void ranks_destroy(strata_engine *e, rank_state *rs)
{
    if (!rs)
        return;
    tarr_free(&rs->grad_shard, &e->tiers.env);
    tarr_free(&rs->param_shard, &e->tiers.env);
    free(rs->full);
    free(rs->shard);
    free(rs->pbuf);
    free(rs->flags);
    free(rs);
}

/* ---------------------------------------------------------------- the step */

static strata_status write_back(strata_engine *e, tier_array *a, size_t off, size_t count, const void *buf)
{
    if (tarr_host_ptr(a, &e->tiers.env, off) == buf)
        return STRATA_OK;
    return tarr_write_sync(a, &e->tiers.env, off, count, buf);
}

/* Every rank learns which modules got gradients on any rank; a module only this rank did not touch gets zero
 * gradients here, so every rank enters the same collectives with the same sizes. The step's arguments ride in the
 * same all-reduce (rank_agree.h): ranks that disagree on them fail here, before any gradient moves. */
static strata_status agree_touched(strata_engine *e, int grad_index, tier_array *store, double lr, uint64_t step)
{
    rank_state *rs = e->ranks;
    size_t n = registry_nmodules(e->reg);
    const uint8_t *touched = grads_touched(e->grads, grad_index);
    agree_step mine = {.lr = lr, .step = step, .groups = opt_groups_frozen_digest(e->groups)};
    for (size_t i = 0; i < n; i++) {
        rs->flags[i] = touched[i];
        mine.micro_batches = MAX(mine.micro_batches, touched[i]);
    }
    agree_step_pack(&mine, rs->flags + n);
    ERR_CHECK(comm_allreduce_uncounted(e->comm, rs->flags, n + AGREE_STEP_WORDS, COMM_U64, COMM_MAX));
    ERR_CHECK(agree_step_check(e, &mine, rs->flags + n));
    for (size_t i = 0; i < n; i++) {
        const reg_module *m = registry_module(e->reg, (strata_module_id)i);
        if (!rs->flags[i] || touched[i] || m->frozen)
            continue;
        size_t off = registry_view_offset(m, e->views.grad), count = registry_view_count(m, e->views.grad);
        float *host = tarr_host_ptr(store, &e->tiers.env, off), *zeros = host ? host : rs->full;
        memset(zeros, 0, count * 4);
        ERR_CHECK(write_back(e, store, off, count, zeros));
        grads_mark_touched(e->grads, grad_index, (strata_module_id)i);
    }
    return STRATA_OK;
}

/* One module's fp32 gradients from the full store: its host memory, or read into rs->full. */
static strata_status module_grads(strata_engine *e, tier_array *store, const reg_module *m, float **out)
{
    *out = tarr_host_ptr(store, &e->tiers.env, m->offset);
    if (*out)
        return STRATA_OK;
    *out = e->ranks->full;
    return tarr_read_sync(store, &e->tiers.env, m->offset, m->numel, e->ranks->full);
}

tier_array *ranks_step_grads(strata_engine *e, int grad_index)
{
    if (e->world > 1 && registry_view_sharded(e->views.opt) && !registry_view_sharded(e->views.grad))
        return &e->ranks->grad_shard;
    return grads_store(e->grads, grad_index);
}

strata_status ranks_exchange_grads(strata_engine *e, int grad_index, double lr, uint64_t step)
{
    rank_state *rs = e->ranks;
    tier_array *store = grads_store(e->grads, grad_index);
    if (e->world == 1)
        return STRATA_OK;
    ERR_CHECK(agree_touched(e, grad_index, store, lr, step));
    if (registry_view_sharded(e->views.grad))
        return STRATA_OK; /* reduce-scattered as they were handed over */
    const uint8_t *touched = grads_touched(e->grads, grad_index);
    for (size_t i = 0; i < registry_nmodules(e->reg); i++) {
        const reg_module *m = registry_module(e->reg, (strata_module_id)i);
        if (!touched[i] || m->frozen)
            continue;
        float *g;
        ERR_CHECK(module_grads(e, store, m, &g));
        if (!registry_view_sharded(e->views.opt)) {
            ERR_CHECK(comm_allreduce(e->comm, g, m->numel, COMM_F32, COMM_SUM));
            rs->comm_bytes += 2 * m->numel * 4;
            ERR_CHECK(write_back(e, store, m->offset, m->numel, g));
        } else {
            float *dst = tarr_host_ptr(&rs->grad_shard, &e->tiers.env, m->shard_offset);
            ERR_CHECK(ranks_reduce_module(e, m, g, dst ? dst : rs->shard));
            ERR_CHECK(write_back(e, &rs->grad_shard, m->shard_offset, m->shard_numel, dst ? dst : rs->shard));
        }
    }
    return STRATA_OK;
}

strata_status ranks_sum_gradstats(strata_engine *e, double *sumsq, bool *nonfinite)
{
    /* Stage 0 all-reduced the gradients: every rank's statistics are already the global ones (summing them would
     * count every gradient N times and clip by a norm sqrt(N) too large). */
    if (e->world == 1 || !registry_view_sharded(e->views.opt))
        return STRATA_OK;
    double v[2] = {*sumsq, *nonfinite ? 1.0 : 0.0};
    ERR_CHECK(comm_allreduce_uncounted(e->comm, v, 2, COMM_F64, COMM_SUM));
    *sumsq = v[0];
    *nonfinite = v[1] > 0;
    return STRATA_OK;
}

tier_array *ranks_step_params(strata_engine *e, int param_out)
{
    return publishes(e) ? &e->ranks->param_shard : &e->tiers.param[param_out];
}

reg_view ranks_step_params_view(const strata_engine *e)
{
    return publishes(e) ? REG_SHARD_TRAINED : e->views.param;
}

strata_status ranks_publish_params(strata_engine *e, int param_out)
{
    if (!publishes(e))
        return STRATA_OK;
    rank_state *rs = e->ranks;
    tier_array *dst = &e->tiers.param[param_out];
    size_t pb = e->tiers.param_bytes;
    for (size_t i = 0; i < registry_nmodules(e->reg); i++) {
        const reg_module *m = registry_module(e->reg, (strata_module_id)i);
        if (m->frozen)
            continue; /* its parameters never change */
        size_t slot = (size_t)e->rank * m->shard_numel * pb;
        char *full = tarr_host_ptr(dst, &e->tiers.env, m->offset);
        char *buf = full ? full : rs->pbuf;
        memcpy(buf + slot, tarr_host_ptr(&rs->param_shard, &e->tiers.env, m->shard_offset), m->shard_numel * pb);
        ERR_CHECK(comm_allgather(e->comm, buf + slot, buf, m->shard_numel * pb, COMM_BYTE));
        rs->comm_bytes += m->numel * pb;
        ERR_CHECK(write_back(e, dst, m->offset, m->numel, buf));
    }
    return STRATA_OK;
}

strata_status ranks_reduce_module(strata_engine *e, const reg_module *m, const float *full, float *shard)
{
    e->ranks->comm_bytes += m->numel * 4;
    return comm_reduce_scatter(e->comm, full, shard, m->shard_numel, COMM_F32);
}

strata_status ranks_start_reduce(strata_engine *e, const reg_module *m, const float *full, float *shard,
                                 comm_req **req)
{
    e->ranks->comm_bytes += m->numel * 4;
    return comm_start_reduce_scatter(e->comm, full, shard, m->shard_numel, COMM_F32, req);
}

strata_status ranks_gather_module(strata_engine *e, const reg_module *m, void *dev)
{
    size_t bytes = m->shard_numel * e->tiers.param_bytes;
    e->ranks->comm_bytes += m->numel * e->tiers.param_bytes;
    return comm_dev_allgather(e->comm, e->dev, e->compute, (char *)dev + (size_t)e->rank * bytes, dev, bytes,
                              COMM_BYTE);
}

strata_status ranks_read_master(strata_engine *e, const reg_module *m, size_t first, size_t count, float *out)
{
    float *full = e->ranks->full, *mine = full + (size_t)e->rank * m->shard_numel;
    ERR_CHECK(tarr_read_sync(&e->tiers.master, &e->tiers.env, m->shard_offset, m->shard_numel, mine));
    ERR_CHECK(comm_allgather(e->comm, mine, full, m->shard_numel, COMM_F32));
    memcpy(out, full + (first - m->offset), count * 4);
    return STRATA_OK;
}

strata_status ranks_read_params(strata_engine *e, const reg_module *m, void *out)
{
    size_t pb = e->tiers.param_bytes;
    char *full = e->ranks->pbuf, *mine = full + (size_t)e->rank * m->shard_numel * pb;
    ERR_CHECK(tarr_read_sync(&e->tiers.param[e->tiers.param_front], &e->tiers.env, m->shard_offset, m->shard_numel,
                             mine));
    ERR_CHECK(comm_allgather(e->comm, mine, full, m->shard_numel * pb, COMM_BYTE));
    memcpy(out, full, m->numel * pb);
    return STRATA_OK;
}

strata_status ranks_start_gather(strata_engine *e, const reg_module *m, void *dev, comm_req **req)
{
    *req = NULL;
    if (!e->tiers.env.host_addressable_device)
        return ranks_gather_module(e, m, dev); /* device collectives do not queue yet */
    size_t bytes = m->shard_numel * e->tiers.param_bytes;
    e->ranks->comm_bytes += m->numel * e->tiers.param_bytes;
    return comm_start_allgather(e->comm, (char *)dev + (size_t)e->rank * bytes, dev, bytes, COMM_BYTE, req);
}

uint64_t ranks_comm_bytes(const rank_state *rs)
{
    return rs ? rs->comm_bytes : 0;
}

void ranks_fail(strata_engine *e, strata_status st)
{
    bool alike = e->failed_alike;
    e->failed_alike = false;
    if (e->world == 1 || st == STRATA_OK || st == STRATA_ECOMM || alike)
        return;
    char msg[ERR_MSG_BYTES];
    snprintf(msg, sizeof msg, "%s", err_last());
    comm_abort_world(e->comm, msg);
    err_set(st, "%s", msg); /* the caller reports this rank's own failure */
}
