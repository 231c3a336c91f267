/*
 * Fetch, release and prefetch. A module's parameters come to the device from their home tier:
 * host (one host->device copy) or NVMe (io_uring read into a pinned staging buffer, then the copy),
 * on the h2d stream, with the module's `ready` event recorded after. The prefetcher follows the
 * order of one step (declared, or recorded during the first step) and keeps the modules that come
 * next in flight, up to prefetch_bytes ahead and never more than max_live_bytes resident.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/size.h"
#include "base/util.h"
#include "engine/engine.h"

/* ---------------------------------------------------------------- loading */

static strata_status mark_loaded(void *arg);
static strata_status settle(strata_engine *e, eng_module *m, bool wait);

/* Runs on the I/O thread when an NVMe fetch's read has landed: queues the host->device copy and
 * records the module's event (both non-blocking), so no stream ever waits on the disk. The trainer
 * waits for copy_queued, then for the event. */
static void on_fetch_read(io_wait *w, void *ctx)
{
    eng_module *m = ctx;
    strata_engine *e = m->engine;
    char msg[ERR_MSG_BYTES];
    strata_status st = io_wait_take_status(w, msg, sizeof msg);
    if (st == STRATA_OK) {
        st = dev_memcpy_async(e->h2d, m->dev, m->staging, m->fetch_bytes);
        if (st == STRATA_OK && e->trace)
            st = dev_host_fn(e->h2d, mark_loaded, m);
        if (st == STRATA_OK)
            st = dev_event_record(m->ready, e->h2d);
        if (st != STRATA_OK)
            snprintf(msg, sizeof msg, "%s", err_last());
    }
    pthread_mutex_lock(&e->fetch_lock);
    m->fetch_status = st;
    snprintf(m->fetch_msg, sizeof m->fetch_msg, "%s", msg);
    m->copy_queued = true;
    pthread_cond_broadcast(&e->fetch_cv);
    pthread_mutex_unlock(&e->fetch_lock);
}

/* NVMe fetches: waits (or polls) until the read landed and its copy was queued; returns its failure. */
static strata_status wait_copy_queued(strata_engine *e, eng_module *m, bool wait, bool *queued)
{
    pthread_mutex_lock(&e->fetch_lock);
    while (wait && !m->copy_queued)
        pthread_cond_wait(&e->fetch_cv, &e->fetch_lock);
    *queued = m->copy_queued;
    strata_status st = m->copy_queued ? m->fetch_status : STRATA_OK;
    char msg[ERR_MSG_BYTES];
    snprintf(msg, sizeof msg, "%s", m->fetch_msg);
    pthread_mutex_unlock(&e->fetch_lock);
    return st != STRATA_OK ? err_set(st, "%s", msg) : STRATA_OK;
}

/* The order is cyclic: a step with several micro-batches repeats it, and the next step starts it
 * again, so what comes after its end is its beginning. */
static strata_module_id order_ahead(const strata_engine *e, size_t k)
{
    return e->order[(e->order_pos + k) % e->order_len];
}

/* How many fetches from now module id is needed again (SIZE_MAX: not in the order). */
/* Runs on the h2d stream right after a fetch's copy: the trace's end of the fetch. */
static strata_status mark_loaded(void *arg)
{
    eng_module *m = arg;
    m->loaded_ns = now_ns();
    return STRATA_OK;
}

static size_t next_use(const strata_engine *e, strata_module_id id)
{
    if (!e->order_valid)
        return SIZE_MAX;
    for (size_t k = 0; k < e->order_len; k++)
        if (order_ahead(e, k) == id)
            return k;
    return SIZE_MAX;
}

/* Frees the device copy of the resident, unheld module used furthest in the future. */
static bool evict_one(strata_engine *e, const eng_module *keep)
{
    eng_module *victim = NULL;
    size_t victim_dist = 0;
    for (size_t i = 0; i < e->nmodules; i++) {
        eng_module *m = &e->modules[i];
        if (m == keep || m->held || !m->dev_owned || m->state != MOD_RESIDENT)
            continue;
        size_t d = next_use(e, (strata_module_id)i);
        if (!victim || d > victim_dist) {
            victim = m;
            victim_dist = d;
        }
    }
    if (!victim)
        return false;
    fetch_drop(e, victim);
    return true;
}

strata_status fetch_start(strata_engine *e, eng_module *m, bool demand)
{
    if (m->state != MOD_ABSENT)
        return STRATA_OK;
    strata_status st;
    while ((st = dev_alloc(e->dev, m->fetch_bytes, &m->dev)) == STRATA_EBUDGET) {
        err_clear();
        if (evict_one(e, m))
            continue;
        if (e->nfrees == 0)
            return err_set(st, "device budget: no room for module \"%s\"", m->name);
        engine_process_frees(e, true); /* dropped buffers waiting for the compute stream */
    }
    ERR_CHECK(st);
    m->dev_owned = true;
    m->issue_ns = now_ns();
    const tier_array *src = &e->param[e->param_front];
    size_t bytes = m->fetch_bytes;
    m->state = MOD_LOADING;
    if (e->param_tier == STRATA_TIER_NVME) {
        m->engine = e;
        m->copy_queued = false;
        m->fetch_status = STRATA_OK;
        st = pool_acquire(e->pool, POOL_FETCH, bytes, "NVMe fetch staging", &m->staging);
        if (st == STRATA_EBUDGET && demand) {
            /* Prefetches in flight hold the slice: let them land, then there is room for this one. */
            err_clear();
            for (size_t i = 0; i < e->nmodules; i++)
                if (&e->modules[i] != m)
                    settle(e, &e->modules[i], true);
            st = pool_acquire(e->pool, POOL_FETCH, bytes, "NVMe fetch staging", &m->staging);
        }
        if (st == STRATA_OK) {
            /* The read is queued in parts (one per stripe unit), each counted as it goes, and a part
             * can finish before the next is counted. A guard count held until every part is queued
             * keeps on_fetch_read from running on a half-read buffer. */
            io_wait_set_notify(&m->io, on_fetch_read, m);
            io_wait_add(&m->io, 1);
            st = tarr_read(src, &e->env, m->offset, m->numel, m->staging, &m->io);
            char why[ERR_MSG_BYTES];
            snprintf(why, sizeof why, "%s", st != STRATA_OK ? err_last() : "");
            io_wait_finish(&m->io, st, why); /* drops the guard; a failure reaches on_fetch_read */
            st = STRATA_OK;                  /* reported through the fetch's status from now on */
        }
        atomic_fetch_add(&e->ctr.nvme_to_host, bytes);
    } else {
        st = dev_memcpy_async(e->h2d, m->dev, tarr_host_ptr(src, &e->env, m->offset), bytes);
        if (st == STRATA_OK && e->trace)
            st = dev_host_fn(e->h2d, mark_loaded, m);
        if (st == STRATA_OK)
            st = dev_event_record(m->ready, e->h2d);
    }
    atomic_fetch_add(&e->ctr.host_to_device, bytes);
    e->inflight_bytes += bytes;
    e->resident_bytes += bytes;
    if (st != STRATA_OK) {
        char msg[ERR_MSG_BYTES];
        snprintf(msg, sizeof msg, "%s", err_last());
        fetch_drop(e, m);
        return err_set(st, "fetch of module \"%s\": %s", m->name, msg);
    }
    return STRATA_OK;
}

/* LOADING -> RESIDENT once the copy is done; the staging buffer goes back to the pool. */
static strata_status settle(strata_engine *e, eng_module *m, bool wait)
{
    if (m->state != MOD_LOADING)
        return STRATA_OK;
    bool done = true;
    strata_status st = STRATA_OK;
    if (e->param_tier == STRATA_TIER_NVME)
        st = wait_copy_queued(e, m, wait, &done);
    if (st == STRATA_OK && done)
        st = wait ? dev_event_sync(m->ready) : dev_event_query(m->ready, &done);
    if (st == STRATA_OK && !done)
        return STRATA_OK;
    if (m->staging) {
        pool_release(e->pool, m->staging);
        m->staging = NULL;
    }
    e->inflight_bytes -= m->fetch_bytes;
    m->state = MOD_RESIDENT;
    trace_event(e->trace, TRACK_H2D, e->param_tier == STRATA_TIER_NVME ? "fetch nvme->device" : "fetch host->device",
                m->name, m->issue_ns, m->loaded_ns);
    return st;
}

/* Orders a fetched module before the trainer's next compute. The host waits only for the disk read
 * (the copy cannot be queued before it); the copy itself is waited for by the compute stream — on the
 * host backend the caller's thread, so there the module is resident when this returns. */
static strata_status order_for_compute(strata_engine *e, eng_module *m)
{
    if (m->state != MOD_LOADING)
        return STRATA_OK;
    bool queued = true;
    if (e->param_tier == STRATA_TIER_NVME)
        ERR_CHECK(wait_copy_queued(e, m, true, &queued));
    ERR_CHECK(dev_stream_wait_event(e->compute, m->ready));
    return settle(e, m, false);
}

strata_status fetch_drop(strata_engine *e, eng_module *m)
{
    if (!m->dev_owned)
        return STRATA_OK;
    strata_status st = STRATA_OK;
    if (m->state == MOD_LOADING) {
        /* The read and the copy may still be writing the buffers: wait before giving them back. */
        bool queued;
        if (e->param_tier == STRATA_TIER_NVME)
            st = wait_copy_queued(e, m, true, &queued);
        strata_status est = dev_event_sync(m->ready);
        if (st == STRATA_OK)
            st = est;
        if (m->staging) {
            pool_release(e->pool, m->staging);
            m->staging = NULL;
        }
        e->inflight_bytes -= m->fetch_bytes;
    }
    /* The trainer's compute may still read the buffer: free it once the compute stream is past. */
    if (!e->compute || engine_defer_free(e, m->dev, false, e->compute) != STRATA_OK) {
        if (e->compute)
            dev_stream_sync(e->compute);
        dev_free(e->dev, m->dev);
    }
    m->dev = NULL;
    m->dev_owned = false;
    m->state = MOD_ABSENT;
    e->resident_bytes -= m->fetch_bytes;
    return st;
}

void fetch_invalidate_all(strata_engine *e)
{
    for (size_t i = 0; i < e->nmodules; i++) {
        eng_module *m = &e->modules[i];
        if (m->dev_owned)
            fetch_drop(e, m);
        else if (e->param_tier == STRATA_TIER_DEVICE)
            m->dev = (char *)e->param[e->param_front].mem + m->offset * e->param_bytes;
    }
}

/* ---------------------------------------------------------------- prefetch */

strata_status fetch_prefetch(strata_engine *e)
{
    if (!e->order_valid || e->param_tier == STRATA_TIER_DEVICE)
        return STRATA_OK;
    for (size_t i = 0; i < e->nmodules; i++)
        settle(e, &e->modules[i], false);
    size_t ahead = 0;
    for (size_t k = 0; k < e->order_len; k++) {
        eng_module *m = &e->modules[order_ahead(e, k)];
        ahead += m->fetch_bytes;
        if (ahead > e->prefetch_bytes + m->fetch_bytes && k > 0)
            break;
        if (m->state != MOD_ABSENT)
            continue;
        if (e->inflight_bytes + m->fetch_bytes > e->prefetch_bytes ||
            e->resident_bytes + m->fetch_bytes > e->max_live_bytes)
            break;
        strata_status st = fetch_start(e, m, false);
        if (st == STRATA_EBUDGET) {
            err_clear(); /* a prefetch that does not fit waits for its demand fetch */
            break;
        }
        ERR_CHECK(st);
    }
    return STRATA_OK;
}

/* Keeps the order in step with this step's fetches; a divergence drops the order (a warning,
 * once per engine) and records the step anew. */
static void track_order(strata_engine *e, strata_module_id id)
{
    registry_record(e, id);
    if (!e->order_valid)
        return;
    if (e->order_pos == e->order_len && e->order[0] == id)
        e->order_pos = 0; /* the next micro-batch repeats the order */
    if (e->order_pos < e->order_len && e->order[e->order_pos] == id) {
        e->order_pos++;
        return;
    }
    if (!e->order_warned)
        LOG_WARN(LOG_SCHED, "fetch order diverged at position %zu (module \"%s\", expected \"%s\"); prefetching "
                 "stops until the order of a whole step has been recorded again", e->order_pos,
                 e->modules[id].name,
                 e->order_pos < e->order_len ? e->modules[e->order[e->order_pos]].name : "(end of step)");
    e->order_warned = true;
    e->order_valid = false;
    e->order_declared = false;
}

void fetch_step_boundary(strata_engine *e)
{
    bool incomplete = e->order_valid && e->order_pos != e->order_len && e->rec_len > 0;
    if (incomplete && !e->order_warned) {
        LOG_WARN(LOG_SCHED, "the step fetched %zu modules, the order has %zu; re-recording", e->order_pos,
                 e->order_len);
        e->order_warned = true;
    }
    if ((!e->order_valid && !e->order_declared) || incomplete)
        registry_adopt_recording(e);
    e->rec_len = 0;
    e->order_pos = 0;
}

/* ---------------------------------------------------------------- public */

static strata_status fetch(strata_engine *e, strata_module_id id)
{
    ERR_CHECK(engine_require_finalized(e, "strata_fetch"));
    eng_module *m = engine_module(e, id, "strata_fetch");
    if (!m)
        return STRATA_ESTATE;
    if (m->held)
        return err_set(STRATA_ESTATE, "strata_fetch(\"%s\"): the module is already held; release it before "
                       "fetching it again", m->name);
    engine_process_frees(e, false);
    track_order(e, id);
    e->fetches++;
    if (m->state != MOD_ABSENT || e->param_tier == STRATA_TIER_DEVICE)
        e->prefetch_hits++;
    if (m->state == MOD_ABSENT) {
        /* Make room within the residency cap before a demand fetch. */
        while (e->resident_bytes + m->fetch_bytes > e->max_live_bytes && evict_one(e, m))
            ;
        strata_status st = fetch_start(e, m, true);
        if (st == STRATA_EBUDGET) {
            char need[32], live[32];
            return err_set(STRATA_EBUDGET, "strata_fetch(\"%s\"): the device budget cannot hold this module (%s) "
                           "with the modules still held (%s resident); release modules sooner or raise "
                           "strata.device_budget_bytes", m->name, size_format(m->fetch_bytes, need, sizeof need),
                           size_format(e->resident_bytes, live, sizeof live));
        }
        ERR_CHECK(st);
    }
    uint64_t t0 = now_ns();
    strata_status st = order_for_compute(e, m);
    uint64_t t1 = now_ns();
    e->stall_ns += t1 - t0;
    if (t1 - t0 > 2000)
        trace_event(e->trace, TRACK_TRAINER, "stall", m->name, t0, t1);
    if (st != STRATA_OK) {
        char msg[ERR_MSG_BYTES];
        snprintf(msg, sizeof msg, "%s", err_last());
        fetch_drop(e, m);
        return err_set(st, "strata_fetch(\"%s\"): %s", m->name, msg);
    }
    m->held = true;
    return fetch_prefetch(e);
}

STRATA_API strata_status strata_fetch(strata_engine *e, strata_module_id module)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_fetch: engine is NULL");
    return err_copy(&e->err, fetch(e, module));
}

static strata_status release(strata_engine *e, strata_module_id id)
{
    ERR_CHECK(engine_require_finalized(e, "strata_release"));
    eng_module *m = engine_module(e, id, "strata_release");
    if (!m)
        return STRATA_ESTATE;
    if (!m->held)
        return err_set(STRATA_ESTATE, "strata_release(\"%s\"): the module is not held (released twice, or never "
                       "fetched)", m->name);
    m->held = false;
    if (m->grad_dev) {
        LOG_ONCE(STRATA_LOG_WARN, LOG_SCHED, "module \"%s\" was released with gradient buffers that were never "
                 "handed over with strata_grads_ready; those gradients are discarded", m->name);
        if (engine_defer_free(e, m->grad_dev, false, e->compute) != STRATA_OK) {
            dev_stream_sync(e->compute);
            dev_free(e->dev, m->grad_dev);
        }
        m->grad_dev = NULL;
    }
    /* Keep what the prefetcher would fetch again right away, and small persistent modules. */
    size_t d = next_use(e, id);
    bool soon = d != SIZE_MAX && d * m->fetch_bytes <= e->prefetch_bytes;
    if (m->dev_owned && !m->persistent && !soon)
        fetch_drop(e, m);
    return STRATA_OK;
}

STRATA_API strata_status strata_release(strata_engine *e, strata_module_id module)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_release: engine is NULL");
    return err_copy(&e->err, release(e, module));
}

STRATA_API void *strata_param_data(strata_engine *e, strata_param_id param)
{
    if (!e)
        return NULL;
    eng_param *p = engine_held_param(e, param, "strata_param_data");
    if (!p) {
        err_copy(&e->err, err_last_status());
        return NULL;
    }
    eng_module *m = &e->modules[p->module];
    return (char *)m->dev + (p->offset - m->offset) * e->param_bytes;
}
