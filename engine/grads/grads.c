/*
 * Gradients: the device buffers the trainer writes during backward, the fp32 stores they gather in, and the path
 * of one hand-over. strata_grads_ready checks the module, takes pinned staging, queues the copy off the device on
 * the d2h stream and gives the staged gradients to the one way of handing them off that finalize chose
 * (grad_handoff.h: accumulate, reduce-scatter, or the update in backward); once the way took them, the module
 * counts as having gradients and its device buffer is freed when the copy is done.
 */
#include "engine/grads/grads.h"

#include <stdlib.h>
#include <string.h>

#include "base/copy.h"
#include "base/log.h"
#include "base/util.h"
#include "engine/engine.h"
#include "engine/grads/grad_handoff.h"
#include "engine/ranks/ranks.h"

/* One module's device gradients while the trainer fills them. */
typedef struct grad_buffer {
    void *dev;
    dev_event *written;            /* recorded on the compute stream at grads_ready */
} grad_buffer;

struct grad_store {
    tier_array store[2];           /* fp32 gradient stores: [accumulating, being consumed] */
    int front;
    uint8_t *touched[2];           /* per store, per module: hand-overs since its last step (at most 255) */
    grad_buffer *bufs;             /* per module */
    size_t nmods;
    grad_handoff *handoff;         /* where the gradients go, chosen at finalize (grad_handoff.h) */
};

/* The one way this engine hands gradients off. */
static strata_status choose_handoff(strata_engine *e, grad_handoff **out)
{
    if (e->cfg.step_in_backward)
        return grad_in_backward_create(e, out);
    if (ranks_grads_sharded_at_handoff(e))
        return grad_reduce_scatter_create(e, out);
    return grad_accumulate_create(e, out);
}

strata_status grads_create(strata_engine *e, grad_store **out)
{
    size_t n = registry_nmodules(e->reg), numel = registry_view_numel(e->reg, e->views.grad);
    grad_store *g = calloc(1, sizeof *g);
    if (!g)
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory for the gradient store");
    *out = g;
    g->touched[0] = calloc(n, 1);
    g->touched[1] = calloc(n, 1);
    g->bufs = calloc(n, sizeof *g->bufs);
    if (!g->touched[0] || !g->touched[1] || !g->bufs)
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory for the gradient store");
    for (; g->nmods < n; g->nmods++)
        ERR_CHECK(dev_event_create(e->dev, &g->bufs[g->nmods].written));
    ERR_CHECK(choose_handoff(e, &g->handoff));
    if (!g->handoff->ops->uses_store)
        return STRATA_OK;
    strata_tier tier = e->tiers.grad_tier;
    ERR_CHECK(tarr_alloc_cpu(&g->store[0], &e->tiers.env, tier, numel, 4, "gradient store"));
    if (e->cfg.delayed_update)
        ERR_CHECK(tarr_alloc_cpu(&g->store[1], &e->tiers.env, tier, numel, 4, "gradient store (second)"));
    for (int i = 0; i < 2; i++) {
        void *host = g->store[i].numel ? tarr_host_ptr(&g->store[i], &e->tiers.env, 0) : NULL;
        if (host)
            zero_parallel(host, numel * 4); /* fresh pages: the cores share their first touch */
    }
    return STRATA_OK;
}

void grads_destroy(strata_engine *e, grad_store *g)
{
    if (!g)
        return;
    if (g->handoff) {
        grads_drain(e);
        g->handoff->ops->destroy(g->handoff, e);
    }
    for (size_t i = 0; i < g->nmods; i++) {
        if (g->bufs[i].dev)
            dev_free(e->dev, g->bufs[i].dev);
        dev_event_destroy(g->bufs[i].written);
    }
    tarr_free(&g->store[0], &e->tiers.env);
    tarr_free(&g->store[1], &e->tiers.env);
    free(g->touched[0]);
    free(g->touched[1]);
    free(g->bufs);
    free(g);
}

strata_status grads_drain(strata_engine *e)
{
    grad_handoff *h = e->grads->handoff;
    strata_status sst = dev_stream_sync(e->d2h);
    strata_status st = h->ops->finish ? h->ops->finish(h, e) : STRATA_OK;
    return st != STRATA_OK ? st : sst;
}

strata_status grads_settle(strata_engine *e)
{
    ERR_CHECK(grads_drain(e));
    grad_handoff *h = e->grads->handoff;
    return h->ops->reclaim ? h->ops->reclaim(h, e) : STRATA_OK;
}

bool grads_has_buffers(const grad_store *g, strata_module_id id)
{
    return g->bufs[id].dev != NULL;
}

void grads_discard(strata_engine *e, strata_module_id id)
{
    grad_buffer *b = &e->grads->bufs[id];
    if (!b->dev)
        return;
    LOG_ONCE(STRATA_LOG_WARN, LOG_SCHED, "module \"%s\" was released with gradient buffers that were never "
             "handed over with strata_grads_ready; those gradients are discarded", registry_module(e->reg, id)->name);
    deferred_free_after(e->frees, b->dev, e->compute);
    b->dev = NULL;
}

int grads_front(const grad_store *g)
{
    return g->front;
}

void grads_flip(grad_store *g)
{
    g->front = 1 - g->front;
}

tier_array *grads_store(grad_store *g, int index)
{
    return &g->store[index];
}

const uint8_t *grads_touched(const grad_store *g, int index)
{
    return g->touched[index];
}

void grads_mark_touched(grad_store *g, int index, strata_module_id id)
{
    if (g->touched[index][id] < UINT8_MAX)
        g->touched[index][id]++;
}

void grads_consumed(grad_store *g, int index)
{
    memset(g->touched[index], 0, g->nmods);
}

strata_module_id grads_first_unconsumed(const grad_store *g)
{
    for (size_t i = 0; i < g->nmods; i++)
        if (g->touched[g->front][i])
            return (strata_module_id)i;
    return STRATA_INVALID_ID;
}

void grads_reset(grad_store *g)
{
    g->front = 0;
    grads_consumed(g, 0);
    grads_consumed(g, 1);
}

/* ---------------------------------------------------------------- public */

STRATA_API void *strata_grad_data(strata_engine *e, strata_param_id param)
{
    if (!e)
        return NULL;
    const reg_param *p = residency_held_param(e, param, "strata_grad_data");
    if (!p) {
        err_copy(&e->err, err_last_status());
        return NULL;
    }
    const reg_module *m = registry_module(e->reg, p->module);
    if (m->frozen) {
        err_copy(&e->err, err_set(STRATA_ESTATE, "strata_grad_data(\"%s.%s\"): module \"%s\" is frozen "
                                  "(strata_module_freeze): its parameters take no gradients", m->name, p->name,
                                  m->name));
        return NULL;
    }
    grad_buffer *b = &e->grads->bufs[p->module];
    strata_status st;
    if (!b->dev) {
        size_t bytes = m->numel * e->tiers.param_bytes;
        while ((st = dev_alloc(e->dev, bytes, &b->dev)) == STRATA_EBUDGET) {
            /* Buffers of earlier hand-offs may still be waiting for their copies; else a module the trainer
             * does not hold gives up its device copy. */
            if (deferred_pending(e->frees) > 0)
                deferred_process(e->frees, true);
            else if (!residency_evict_one(e))
                break;
            err_clear();
        }
        /* Zeroed in the compute stream's order, before the trainer's backward writes it. */
        if (st == STRATA_OK)
            st = dev_memset_async(e->compute, b->dev, 0, bytes);
        if (st != STRATA_OK) {
            if (b->dev)
                dev_free(e->dev, b->dev);
            b->dev = NULL;
            err_copy(&e->err, st);
            return NULL;
        }
    }
    return (char *)b->dev + (p->offset - m->offset) * e->tiers.param_bytes;
}

/* What every hand-over needs: the module fetched, its gradient buffer taken, and the way's consent. */
static strata_status check_ready(strata_engine *e, strata_module_id id)
{
    ERR_CHECK(engine_require_module(e, id, "strata_grads_ready"));
    grad_store *g = e->grads;
    const reg_module *m = registry_module(e->reg, id);
    if (m->frozen)
        return err_set(STRATA_ESTATE, "strata_grads_ready(\"%s\"): the module is frozen (strata_module_freeze): it "
                       "has no gradients to hand over", m->name);
    if (!residency_held(e->res, id))
        return err_set(STRATA_ESTATE, "strata_grads_ready(\"%s\"): the module is not fetched; fetch it for backward, "
                       "write its gradients into strata_grad_data, then call strata_grads_ready", m->name);
    if (!g->bufs[id].dev)
        return err_set(STRATA_ESTATE, "strata_grads_ready(\"%s\"): the module has no gradient buffers this step; "
                       "take them with strata_grad_data and write the gradients first", m->name);
    grad_handoff *h = g->handoff;
    return h->ops->admit ? h->ops->admit(h, e, id) : STRATA_OK;
}

/* Pinned staging for the copy off the device. */
static strata_status take_staging(strata_engine *e, size_t bytes, void **out)
{
    strata_status st = pool_acquire(e->tiers.pool, POOL_GRAD, bytes, "gradient staging", out);
    if (st != STRATA_EBUDGET)
        return st;
    /* Earlier hand-offs (or the work they started) hold the staging: wait for them, then try again. */
    err_clear();
    ERR_CHECK(grads_settle(e));
    return pool_acquire(e->tiers.pool, POOL_GRAD, bytes, "gradient staging", out);
}

/* The copy off the device, on the d2h stream, after the trainer's backward kernels on the compute stream. */
static strata_status queue_copy(strata_engine *e, grad_buffer *b, void *staging, size_t bytes)
{
    ERR_CHECK(dev_event_record(b->written, e->compute));
    ERR_CHECK(dev_stream_wait_event(e->d2h, b->written));
    return dev_memcpy_async(e->d2h, staging, b->dev, bytes);
}

/* The way took module id's gradients: they count as the front store's (a checkpoint refuses until a step consumes
 * them), and the device buffer goes once its copy off the device is done. */
static void handed_off(strata_engine *e, strata_module_id id, size_t bytes)
{
    grad_store *g = e->grads;
    grad_buffer *b = &g->bufs[id];
    grads_mark_touched(g, g->front, id);
    atomic_fetch_add(&e->ctr.device_to_host, bytes);
    deferred_free_after(e->frees, b->dev, e->d2h);
    b->dev = NULL;
}

static strata_status grads_ready(strata_engine *e, strata_module_id id)
{
    ERR_CHECK(check_ready(e, id));
    grad_store *g = e->grads;
    const reg_module *m = registry_module(e->reg, id);
    size_t bytes = m->numel * e->tiers.param_bytes;
    grad_staged s = {.id = id, .module = m};
    ERR_CHECK(take_staging(e, bytes, &s.staging));
    s.store = &g->store[g->front];
    s.first = !g->touched[g->front][id];
    s.submit_ns = now_ns();
    strata_status st = queue_copy(e, &g->bufs[id], s.staging, bytes);
    if (st == STRATA_OK)
        st = g->handoff->ops->take(g->handoff, e, &s);
    if (st != STRATA_OK) {
        /* The way did not take the staging: give it back once the copy into it is over. */
        dev_stream_sync(e->d2h);
        pool_release(e->tiers.pool, s.staging);
        return st;
    }
    handed_off(e, id, bytes);
    return STRATA_OK;
}

STRATA_API strata_status strata_grads_ready(strata_engine *e, strata_module_id module)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_grads_ready: engine is NULL");
    strata_status st = grads_ready(e, module);
    ranks_fail(e, st);
    return err_copy(&e->err, st);
}
