/*
 * Gradients: the device buffers the trainer writes during backward, and their hand-off. A module's
 * gradients are copied off the device on the d2h stream into pinned staging, then a host function
 * in the same stream order accumulates them (fp32) into the gradient store — host memory, or NVMe
 * (read, add, write) when the optimizer state lives there. The device buffer is freed once the
 * copy is done. Accumulation failures are kept and reported by the next engine call. With
 * strata.step_in_backward there is no store: the staging goes to the module's update (sib.c).
 */
#include "engine/grads.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/util.h"
#include "engine/engine.h"
#include "engine/ranks.h"
#include "engine/sib.h"
#include "offload/accum.h"

/* One module's device gradients while the trainer fills them. */
typedef struct grad_buffer {
    void *dev;
    dev_event *written;            /* recorded on the compute stream at grads_ready */
} grad_buffer;

/* Stages 2 and 3 with several ranks: a module's gradients being reduce-scattered on the comm's thread while the
 * trainer goes on with backward; this rank's part is accumulated when it completes. */
#define HANDOFF_SLOTS 2
typedef struct handoff {
    float *full, *part;            /* the module's fp32 gradients; this rank's reduced part */
    comm_req *req;
    const reg_module *module;
    tier_array *store;
    bool first;
    uint64_t submit_ns;
} handoff;

struct grad_store {
    tier_array store[2];           /* fp32 gradient stores: [accumulating, being consumed] */
    int front;
    uint8_t *touched[2];           /* per store, per module: hand-overs since its last step (at most 255) */
    grad_buffer *bufs;             /* per module */
    size_t nmods;
    pthread_mutex_t lock;          /* accumulations run on the d2h stream */
    strata_status status;          /* first failure of an accumulation, reported at the next call */
    char msg[ERR_MSG_BYTES];
    handoff ring[HANDOFF_SLOTS];   /* reduce-scatters in flight, oldest at head */
    int head, pending;
};

/* One gradient hand-off in flight on the d2h stream. */
typedef struct grad_job {
    strata_engine *engine;
    const reg_module *module;
    void *staging;                 /* pinned copy of the device gradients */
    tier_array *store;             /* the fp32 gradient store it accumulates into */
    bool first;                    /* the module's first gradients this step: overwrite */
    uint64_t submit_ns;
} grad_job;

strata_status grads_create(strata_engine *e, grad_store **out)
{
    size_t n = registry_nmodules(e->reg), numel = registry_view_numel(e->reg, e->views.grad);
    grad_store *g = calloc(1, sizeof *g);
    if (!g)
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory for the gradient store");
    *out = g;
    pthread_mutex_init(&g->lock, NULL);
    g->touched[0] = calloc(n, 1);
    g->touched[1] = calloc(n, 1);
    g->bufs = calloc(n, sizeof *g->bufs);
    if (!g->touched[0] || !g->touched[1] || !g->bufs)
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory for the gradient store");
    for (; g->nmods < n; g->nmods++)
        ERR_CHECK(dev_event_create(e->dev, &g->bufs[g->nmods].written));
    strata_tier tier = e->tiers.grad_tier;
    /* Step in backward updates each module from its staging: there is no store to accumulate into. */
    if (e->cfg.step_in_backward)
        return STRATA_OK;
    ERR_CHECK(tarr_alloc(&g->store[0], &e->tiers.env, tier, numel, 4, "gradient store"));
    if (e->cfg.delayed_update)
        ERR_CHECK(tarr_alloc(&g->store[1], &e->tiers.env, tier, numel, 4, "gradient store (second)"));
    size_t big = registry_largest_module_numel(e->reg);
    for (int i = 0; ranks_grads_sharded_at_handoff(e) && i < HANDOFF_SLOTS; i++)
        if (posix_memalign((void **)&g->ring[i].full, 4096, big * 4) ||
            posix_memalign((void **)&g->ring[i].part, 4096, big * 4))
            return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory for the gradient reduce-scatters");
    for (int i = 0; i < 2; i++) {
        void *host = g->store[i].numel ? tarr_host_ptr(&g->store[i], &e->tiers.env, 0) : NULL;
        if (host)
            memset(host, 0, numel * 4);
    }
    return STRATA_OK;
}

void grads_destroy(strata_engine *e, grad_store *g)
{
    if (!g)
        return;
    grads_drain(e);
    for (size_t i = 0; i < g->nmods; i++) {
        if (g->bufs[i].dev)
            dev_free(e->dev, g->bufs[i].dev);
        dev_event_destroy(g->bufs[i].written);
    }
    tarr_free(&g->store[0], &e->tiers.env);
    tarr_free(&g->store[1], &e->tiers.env);
    for (int i = 0; i < HANDOFF_SLOTS; i++) {
        free(g->ring[i].full);
        free(g->ring[i].part);
    }
    pthread_mutex_destroy(&g->lock);
    free(g->touched[0]);
    free(g->touched[1]);
    free(g->bufs);
    free(g);
}

static void record_failure(grad_store *g, strata_status st, const char *msg)
{
    pthread_mutex_lock(&g->lock);
    if (g->status == STRATA_OK) {
        g->status = st;
        snprintf(g->msg, sizeof g->msg, "%s", msg);
    }
    pthread_mutex_unlock(&g->lock);
}

/* Adds count gradients (src, of src_dtype) into store elements [off, off + count): in place in host memory,
 * or read-add-write through a pinned fp32 buffer on NVMe. first: the module's first gradients since its last
 * step, which overwrite. */
static strata_status accumulate_into(strata_engine *e, tier_array *store, size_t off, size_t count, const void *src,
                                     strata_dtype src_dtype, bool first)
{
    float *host = tarr_host_ptr(store, &e->tiers.env, off);
    if (host) {
        accum_add(host, src, src_dtype, count, first);
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
        accum_add(buf, src, src_dtype, count, first);
        st = tarr_write(store, &e->tiers.env, off, count, buf, &w);
        if (st == STRATA_OK)
            st = io_wait_wait(&w);
    }
    pool_release(e->tiers.pool, buf);
    io_wait_destroy(&w);
    return st;
}

/* Runs on the d2h stream after the copy into job->staging. */
static strata_status accumulate(void *arg)
{
    grad_job *job = arg;
    strata_engine *e = job->engine;
    const reg_module *m = job->module;
    strata_status st = accumulate_into(e, job->store, m->offset, m->numel, job->staging, e->cfg.param_dtype,
                                       job->first);
    if (st != STRATA_OK) {
        char msg[ERR_MSG_BYTES];
        snprintf(msg, sizeof msg, "gradients of module \"%s\": %s", m->name, err_last());
        record_failure(e->grads, st, msg);
    }
    trace_event(e->trace, TRACK_D2H, "gradients", m->name, job->submit_ns, now_ns());
    pool_release(e->tiers.pool, job->staging);
    free(job);
    return st;
}

/* The oldest reduce-scatter in flight: waits for it and accumulates this rank's part into its store. */
static strata_status finish_oldest(strata_engine *e)
{
    grad_store *g = e->grads;
    handoff *h = &g->ring[g->head];
    const reg_module *m = h->module;
    strata_status st = comm_wait(h->req);
    h->req = NULL;
    if (st == STRATA_OK)
        st = accumulate_into(e, h->store, m->shard_offset, m->shard_numel, h->part, STRATA_DTYPE_FP32, h->first);
    trace_event(e->trace, TRACK_D2H, "gradients (reduce-scatter)", m->name, h->submit_ns, now_ns());
    g->head = (g->head + 1) % HANDOFF_SLOTS;
    g->pending--;
    if (st != STRATA_OK)
        return err_set(st, "gradients of module \"%s\": %s", m->name, err_last());
    return STRATA_OK;
}

static strata_status finish_handoffs(strata_engine *e)
{
    strata_status first = STRATA_OK;
    while (e->grads->pending > 0) {
        strata_status st = finish_oldest(e);
        if (first == STRATA_OK)
            first = st;
    }
    return first;
}

/* Stages 2 and 3 with several ranks. The reduce-scatter must be issued in the trainer's order on every rank, so
 * the trainer's thread issues it: the module's gradients come off the device and become fp32 here, then the
 * reduce-scatter runs on the comm's thread while backward goes on (HANDOFF_SLOTS of them in flight), and only
 * this rank's part is accumulated into its shard of the store when it completes. */
static strata_status hand_off_sharded(strata_engine *e, grad_job *job)
{
    grad_store *g = e->grads;
    strata_status st = g->pending == HANDOFF_SLOTS ? finish_oldest(e) : STRATA_OK;
    handoff *h = &g->ring[(g->head + g->pending) % HANDOFF_SLOTS];
    if (st == STRATA_OK)
        st = dev_stream_sync(e->d2h);
    if (st == STRATA_OK) {
        *h = (handoff){.full = h->full, .part = h->part, .module = job->module, .store = job->store,
                       .first = job->first, .submit_ns = job->submit_ns};
        accum_add(h->full, job->staging, e->cfg.param_dtype, job->module->numel, true);
        st = ranks_start_reduce(e, job->module, h->full, h->part, &h->req);
        if (st == STRATA_OK)
            g->pending++;
    }
    pool_release(e->tiers.pool, job->staging);
    free(job);
    return st;
}

strata_status grads_drain(strata_engine *e)
{
    grad_store *g = e->grads;
    strata_status st = finish_handoffs(e);
    strata_status sst = dev_stream_sync(e->d2h);
    if (st == STRATA_OK)
        st = sst;
    pthread_mutex_lock(&g->lock);
    strata_status gst = g->status;
    char msg[ERR_MSG_BYTES];
    snprintf(msg, sizeof msg, "%s", g->msg);
    g->status = STRATA_OK;
    pthread_mutex_unlock(&g->lock);
    if (gst != STRATA_OK)
        return err_set(gst, "%s", msg);
    return st;
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

static strata_status grads_ready(strata_engine *e, strata_module_id id)
{
    ERR_CHECK(engine_require_module(e, id, "strata_grads_ready"));
    grad_store *g = e->grads;
    const reg_module *m = registry_module(e->reg, id);
    grad_buffer *b = &g->bufs[id];
    if (!residency_held(e->res, id))
        return err_set(STRATA_ESTATE, "strata_grads_ready(\"%s\"): the module is not fetched; fetch it for backward, "
                       "write its gradients into strata_grad_data, then call strata_grads_ready", m->name);
    if (!b->dev)
        return err_set(STRATA_ESTATE, "strata_grads_ready(\"%s\"): the module has no gradient buffers this step; "
                       "take them with strata_grad_data and write the gradients first", m->name);
    if (e->sib)
        ERR_CHECK(sib_check_hand_over(e, id));
    size_t bytes = m->numel * e->tiers.param_bytes;
    grad_job *job = calloc(1, sizeof *job);
    if (!job)
        return err_set(STRATA_ENOMEM, "strata_grads_ready: out of memory");
    strata_status st = pool_acquire(e->tiers.pool, POOL_GRAD, bytes, "gradient staging", &job->staging);
    if (st == STRATA_EBUDGET) {
        /* Earlier hand-offs (or their updates in backward) hold the staging: wait for them, then try again. */
        err_clear();
        st = grads_drain(e);
        if (st == STRATA_OK)
            st = sib_wait(e);
        if (st == STRATA_OK)
            st = pool_acquire(e->tiers.pool, POOL_GRAD, bytes, "gradient staging", &job->staging);
    }
    if (st != STRATA_OK) {
        free(job);
        return st;
    }
    job->engine = e;
    job->module = m;
    job->store = &g->store[g->front];
    job->first = !g->touched[g->front][id];
    job->submit_ns = now_ns();
    /* The copy off the device waits for the trainer's backward kernels on the compute stream. */
    st = dev_event_record(b->written, e->compute);
    if (st == STRATA_OK)
        st = dev_stream_wait_event(e->d2h, b->written);
    if (st == STRATA_OK)
        st = dev_memcpy_async(e->d2h, job->staging, b->dev, bytes);
    if (st == STRATA_OK && ranks_grads_sharded_at_handoff(e)) {
        grads_mark_touched(g, g->front, id);
        atomic_fetch_add(&e->ctr.device_to_host, bytes);
        deferred_free_after(e->frees, b->dev, e->d2h);
        b->dev = NULL;
        return hand_off_sharded(e, job);
    }
    if (st == STRATA_OK && e->sib) {
        /* The update takes the staging over; it starts once the trainer releases the module. */
        st = sib_hand_over(e, id, job->staging);
        if (st == STRATA_OK) {
            free(job);
            grads_mark_touched(g, g->front, id); /* a checkpoint refuses until strata_step */
            atomic_fetch_add(&e->ctr.device_to_host, bytes);
            deferred_free_after(e->frees, b->dev, e->d2h);
            b->dev = NULL;
            return STRATA_OK;
        }
    }
    if (st == STRATA_OK)
        st = dev_host_fn(e->d2h, accumulate, job);
    if (st != STRATA_OK) {
        /* Nothing was queued that owns the job: undo. */
        dev_stream_sync(e->d2h);
        pool_release(e->tiers.pool, job->staging);
        free(job);
        return st;
    }
    grads_mark_touched(g, g->front, id);
    atomic_fetch_add(&e->ctr.device_to_host, bytes);
    deferred_free_after(e->frees, b->dev, e->d2h); /* once its copy off the device is done */
    b->dev = NULL;
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
