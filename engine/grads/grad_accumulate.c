/*
 * The accumulating hand-off (grad_handoff.h): a host function queued on the d2h stream after the copy off the
 * device adds the staging (fp32) into the front gradient store, so the trainer never waits for it. A failed
 * accumulation cannot reach the trainer from there: it is latched and reported by the next grads_drain.
 */
#include <stdio.h>
#include <stdlib.h>

#include "base/latch.h"
#include "base/util.h"
#include "engine/engine.h"
#include "engine/grads/grad_handoff.h"
#include "offload/accum.h"

typedef struct accumulator {
    grad_handoff base;
    err_latch failed;              /* the first failed accumulation since the last grads_drain */
} accumulator;

/* One accumulation queued on the d2h stream. */
typedef struct accum_job {
    strata_engine *engine;
    accumulator *acc;
    grad_staged staged;
} accum_job;

strata_status grad_store_add(strata_engine *e, tier_array *store, size_t off, size_t count, const void *src,
                             strata_dtype src_dtype, bool first)
{
    /* On a GPU the host's cores are free while it computes, and one of them alone falls behind its backward (then the
     * backward waits for gradient staging); on the host backend the model's own threads hold the cores. */
    int threads = e->backend == STRATA_BACKEND_HOST ? 1 : e->cfg.cpu_threads;
    float *host = tarr_host_ptr(store, &e->tiers.env, off);
    if (host) {
        accum_add_threads(host, src, src_dtype, count, first, threads);
        return STRATA_OK;
    }
    float *buf = NULL;
    io_wait w;
    io_wait_init(&w);
    strata_status st = pool_acquire(e->tiers.pool, POOL_ACCUM, count * 4, "gradient accumulation", (void **)&buf);
    if (st == STRATA_OK && !first) {
        st = tarr_read(store, &e->tiers.env, off, count, buf, &w);
        if (st == STRATA_OK)
            st = io_wait_wait(&w);
    }
    if (st == STRATA_OK) {
        accum_add_threads(buf, src, src_dtype, count, first, threads);
        st = tarr_write(store, &e->tiers.env, off, count, buf, &w);
        if (st == STRATA_OK)
            st = io_wait_wait(&w);
    }
    pool_release(e->tiers.pool, buf);
    io_wait_destroy(&w);
    return st;
}

/* Runs on the d2h stream after the copy into the staging. */
static strata_status accumulate(void *arg)
{
    accum_job *job = arg;
    strata_engine *e = job->engine;
    const grad_staged *s = &job->staged;
    const reg_module *m = s->module;
    strata_status st = grad_store_add(e, s->store, m->offset, m->numel, s->staging, e->cfg.param_dtype, s->first);
    if (st != STRATA_OK) {
        char msg[ERR_MSG_BYTES];
        snprintf(msg, sizeof msg, "gradients of module \"%s\": %s", m->name, err_last());
        err_latch_set(&job->acc->failed, st, msg);
    }
    trace_event(e->trace, TRACK_D2H, "gradients", m->name, s->submit_ns, now_ns());
    pool_release(e->tiers.pool, s->staging);
    free(job);
    return st;
}

static strata_status take(grad_handoff *h, strata_engine *e, const grad_staged *s)
{
    accum_job *job = malloc(sizeof *job);
    if (!job)
        return err_set(STRATA_ENOMEM, "strata_grads_ready: out of memory");
    *job = (accum_job){.engine = e, .acc = (accumulator *)h, .staged = *s};
    strata_status st = dev_host_fn(e->d2h, accumulate, job);
    if (st != STRATA_OK)
        free(job); /* never queued: the staging is still the caller's */
    return st;
}

static strata_status finish(grad_handoff *h, strata_engine *e)
{
    return err_latch_take(&((accumulator *)h)->failed, NULL);
}

static void destroy(grad_handoff *h, strata_engine *e)
{
    accumulator *a = (accumulator *)h;
    err_latch_destroy(&a->failed);
    free(a);
}

static const grad_handoff_ops accumulate_ops = {
    .uses_store = true,
    .take = take,
    .finish = finish,
    .destroy = destroy,
};

strata_status grad_accumulate_create(strata_engine *e, grad_handoff **out)
{
    accumulator *a = calloc(1, sizeof *a);
    if (!a)
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory for the gradient store");
    a->base.ops = &accumulate_ops;
    err_latch_init(&a->failed);
    *out = &a->base;
    return STRATA_OK;
}
