/*
 * The reduce-scatter hand-off (grad_handoff.h), stages 2 and 3 with several ranks. The reduce-scatter must be
 * issued in the trainer's order on every rank, so the trainer's thread issues it: the module's gradients come off
 * the device and become fp32 here, then the reduce-scatter runs on the comm's thread while backward goes on
 * (IN_FLIGHT of them at once), and only this rank's part is added into its shard of the store when it completes.
 */
#include <stdlib.h>

#include "base/util.h"
#include "engine/engine.h"
#include "engine/grads/grad_handoff.h"
#include "engine/ranks/ranks.h"
#include "offload/accum.h"

#define IN_FLIGHT 2

/* One module's gradients being reduce-scattered. */
typedef struct reduction {
    float *full, *part;            /* the module's fp32 gradients; this rank's reduced part */
    comm_req *req;
    const reg_module *module;
    tier_array *store;
    bool first;
    uint64_t submit_ns;
} reduction;

typedef struct reduce_scatter {
    grad_handoff base;
    reduction ring[IN_FLIGHT];     /* in flight, oldest at head */
    int head, pending;
} reduce_scatter;

/* The oldest reduce-scatter in flight: waits for it and adds this rank's part into its store. */
static strata_status finish_oldest(strata_engine *e, reduce_scatter *rs)
{
    reduction *r = &rs->ring[rs->head];
    const reg_module *m = r->module;
    strata_status st = comm_wait(r->req);
    r->req = NULL;
    if (st == STRATA_OK)
        st = grad_store_add(e, r->store, m->shard_offset, m->shard_numel, r->part, STRATA_DTYPE_FP32, r->first);
    trace_event(e->trace, TRACK_D2H, "gradients (reduce-scatter)", m->name, r->submit_ns, now_ns());
    rs->head = (rs->head + 1) % IN_FLIGHT;
    rs->pending--;
    if (st != STRATA_OK)
        return err_set(st, "gradients of module \"%s\": %s", m->name, err_last());
    return STRATA_OK;
}

static strata_status take(grad_handoff *h, strata_engine *e, const grad_staged *s)
{
    reduce_scatter *rs = (reduce_scatter *)h;
    if (rs->pending == IN_FLIGHT)
        ERR_CHECK(finish_oldest(e, rs));
    ERR_CHECK(dev_stream_sync(e->d2h)); /* the copy into the staging */
    reduction *r = &rs->ring[(rs->head + rs->pending) % IN_FLIGHT];
    *r = (reduction){.full = r->full, .part = r->part, .module = s->module, .store = s->store, .first = s->first,
                     .submit_ns = s->submit_ns};
    accum_add(r->full, s->staging, e->cfg.param_dtype, s->module->numel, true);
    ERR_CHECK(ranks_start_reduce(e, s->module, r->full, r->part, &r->req));
    rs->pending++;
    pool_release(e->tiers.pool, s->staging);
    return STRATA_OK;
}

static strata_status finish(grad_handoff *h, strata_engine *e)
{
    reduce_scatter *rs = (reduce_scatter *)h;
    strata_status first = STRATA_OK;
    while (rs->pending > 0) {
        strata_status st = finish_oldest(e, rs);
        if (first == STRATA_OK)
            first = st;
    }
    return first;
}

static void destroy(grad_handoff *h, strata_engine *e)
{
    reduce_scatter *rs = (reduce_scatter *)h;
    for (int i = 0; i < IN_FLIGHT; i++) {
        free(rs->ring[i].full);
        free(rs->ring[i].part);
    }
    free(rs);
}

static const grad_handoff_ops reduce_scatter_ops = {
    .uses_store = true,
    .take = take,
    .finish = finish,
    .destroy = destroy,
};

strata_status grad_reduce_scatter_create(strata_engine *e, grad_handoff **out)
{
    reduce_scatter *rs = calloc(1, sizeof *rs);
    if (!rs)
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory for the gradient reduce-scatters");
    rs->base.ops = &reduce_scatter_ops;
    *out = &rs->base;
    size_t big = registry_largest_module_numel(e->reg);
    for (int i = 0; i < IN_FLIGHT; i++)
        if (posix_memalign((void **)&rs->ring[i].full, 4096, big * 4) ||
            posix_memalign((void **)&rs->ring[i].part, 4096, big * 4))
            return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory for the gradient reduce-scatters");
    return STRATA_OK;
}
