/*
 * Fetch, release and prefetch: the residency of modules on the device; see residency.h.
 */
#include "engine/residency/residency.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/latch.h"
#include "base/log.h"
#include "base/size.h"
#include "base/util.h"
#include "engine/engine.h"
#include "engine/ranks/ranks.h"
#include "engine/step/step_in_backward.h"

typedef enum mod_state {
    MOD_ABSENT = 0,  /* no device copy */
    MOD_LOADING,     /* a fetch is in flight: NVMe read and/or host->device copy */
    MOD_RESIDENT,    /* the device copy is valid */
} mod_state;

/* One module's device copy. */
typedef struct resident {
    strata_engine *engine;         /* for the I/O thread's callback, which only gets the module */
    const reg_module *desc;
    mod_state state;
    bool held;                     /* fetched and not yet released */
    void *dev;                     /* the device copy (or the device-tier array itself) */
    bool dev_owned;                /* dev was carved for this fetch and is freed on eviction */
    void *staging;                 /* pinned buffer of an NVMe fetch */
    io_wait io;                    /* the NVMe read of a fetch; its completion queues the copy */
    bool copy_queued;              /* the read landed and the copy was queued (under the window's lock) */
    bool from_cache;               /* this fetch copies from the host cache's mirror: no read, no staging */
    err_latch fetch_failed;        /* a failed read or copy queueing, set on the I/O thread */
    dev_event *ready;              /* recorded after the host->device copy */
    bool gathered_ahead;           /* stage 3: its all-gather was started by the fetch before it (gather) */
    comm_req *gather;              /* that all-gather, while in flight (NULL once it completed) */
    size_t fetch_bytes;            /* the device copy's size: counted in flight / resident */
    size_t move_bytes, slot_bytes; /* what a fetch moves (this rank's shard at stage 3), and where it lands */
    uint64_t issue_ns, loaded_ns;  /* when the fetch was queued / its copy finished (trace) */
} resident;

struct residency {
    resident *mods;
    size_t nmods;
    size_t prefetch_bytes, max_live_bytes;
    size_t inflight_bytes, resident_bytes;
    pthread_mutex_t lock;          /* NVMe fetch completions arrive on I/O threads */
    pthread_cond_t cv;
    uint64_t fetches, prefetch_hits, stall_ns;
};

static bool params_on(const strata_engine *e, strata_tier tier)
{
    return e->tiers.param_tier == tier;
}

/* Device-tier parameters are used where they lie, unless the module must be gathered from the ranks. */
static bool used_in_place(const strata_engine *e)
{
    return params_on(e, STRATA_TIER_DEVICE) && !ranks_fetch_gathers(e);
}

/* ---------------------------------------------------------------- loading */

static strata_status mark_loaded(void *arg);
static strata_status settle(strata_engine *e, resident *m, bool wait);
static strata_status drop(strata_engine *e, resident *m);

/* Runs on the I/O thread when an NVMe fetch's read has landed: queues the host->device copy and
 * records the module's event (both non-blocking), so no stream ever waits on the disk. The trainer
 * waits for copy_queued, then for the event. */
static void on_fetch_read(io_wait *w, void *ctx)
{
    resident *m = ctx;
    strata_engine *e = m->engine;
    residency *r = e->res;
    char msg[ERR_MSG_BYTES];
    strata_status st = io_wait_take_status(w, msg, sizeof msg);
    if (st == STRATA_OK) {
        st = dev_memcpy_async(e->h2d, (char *)m->dev + m->slot_bytes, m->staging, m->move_bytes);
        if (st == STRATA_OK && e->trace)
            st = dev_host_fn(e->h2d, mark_loaded, m);
        if (st == STRATA_OK)
            st = dev_event_record(m->ready, e->h2d);
        if (st != STRATA_OK)
            snprintf(msg, sizeof msg, "%s", err_last());
    }
    err_latch_set(&m->fetch_failed, st, msg);
    pthread_mutex_lock(&r->lock);
    m->copy_queued = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->lock);
}

/* NVMe fetches: waits (or polls) until the read landed and its copy was queued; returns its failure. */
static strata_status wait_copy_queued(residency *r, resident *m, bool wait, bool *queued)
{
    pthread_mutex_lock(&r->lock);
    while (wait && !m->copy_queued)
        pthread_cond_wait(&r->cv, &r->lock);
    *queued = m->copy_queued;
    pthread_mutex_unlock(&r->lock);
    return *queued ? err_latch_raise(&m->fetch_failed, NULL) : STRATA_OK;
}

/* Runs on the h2d stream right after a fetch's copy: the trace's end of the fetch. */
static strata_status mark_loaded(void *arg)
{
    resident *m = arg;
    m->loaded_ns = now_ns();
    return STRATA_OK;
}

/* Frees the device copy of the unheld module in `state` used furthest in the future. */
static bool evict_in(strata_engine *e, const resident *keep, mod_state state)
{
    residency *r = e->res;
    resident *victim = NULL;
    size_t victim_dist = 0;
    for (size_t i = 0; i < r->nmods; i++) {
        resident *m = &r->mods[i];
        if (m == keep || m->held || m->gathered_ahead || !m->dev_owned || m->state != state)
            continue;
        size_t d = fetch_order_next_use(e->order, (strata_module_id)i);
        if (!victim || d > victim_dist) {
            victim = m;
            victim_dist = d;
        }
    }
    if (!victim)
        return false;
    drop(e, victim);
    return true;
}

/* Frees one unheld module's device copy: a resident one, else a prefetch still in flight (drop waits for it to
 * land). Prefetches hold their room until they are used, and in a fragmented arena the block a gradient buffer or a
 * demand fetch needs may lie among them: the prefetch is cheaper to repeat than the step is to fail. */
static bool evict_one(strata_engine *e, const resident *keep)
{
    return evict_in(e, keep, MOD_RESIDENT) || evict_in(e, keep, MOD_LOADING);
}

/* Starts a fetch; a demand fetch (the trainer waits for it) may wait for prefetches to make room. */
static strata_status start(strata_engine *e, resident *m, bool demand)
{
    residency *r = e->res;
    if (m->state != MOD_ABSENT)
        return STRATA_OK;
    strata_status st;
    while ((st = dev_alloc(e->dev, m->fetch_bytes, &m->dev)) == STRATA_EBUDGET) {
        err_clear();
        if (evict_one(e, m))
            continue;
        if (deferred_pending(e->frees) == 0)
            return err_set(st, "device budget: no room for module \"%s\"", m->desc->name);
        deferred_process(e->frees, true); /* dropped buffers waiting for the compute stream */
    }
    ERR_CHECK(st);
    m->dev_owned = true;
    m->issue_ns = now_ns();
    const tier_array *src = &e->tiers.param[e->tiers.param_front];
    size_t bytes = m->move_bytes, first = registry_view_offset(m->desc, e->views.param);
    m->state = MOD_LOADING;
    /* A module the host cache mirrors comes from there, as from the host tier: no drive read, no staging. */
    size_t count = registry_view_count(m->desc, e->views.param);
    const void *mirrored = params_on(e, STRATA_TIER_NVME) ? tarr_cached(src, &e->tiers.env, first, count) : NULL;
    m->from_cache = mirrored != NULL;
    if (params_on(e, STRATA_TIER_NVME) && !mirrored) {
        m->copy_queued = false;
        err_latch_take_copy(&m->fetch_failed, NULL, 0); /* the last fetch's failure was reported */
        st = pool_acquire(e->tiers.pool, POOL_FETCH, bytes, "NVMe fetch staging", &m->staging);
        if (st == STRATA_EBUDGET && demand) {
            /* Prefetches in flight hold the slice: let them land, then there is room for this one. */
            err_clear();
            for (size_t i = 0; i < r->nmods; i++)
                if (&r->mods[i] != m)
                    settle(e, &r->mods[i], true);
            st = pool_acquire(e->tiers.pool, POOL_FETCH, bytes, "NVMe fetch staging", &m->staging);
        }
        if (st == STRATA_OK) {
            /* The read is queued in parts (one per stripe unit), each counted as it goes, and a part
             * can finish before the next is counted. A guard count held until every part is queued
             * keeps on_fetch_read from running on a half-read buffer. */
            io_wait_set_notify(&m->io, on_fetch_read, m);
            io_wait_add(&m->io, 1);
            st = tarr_read(src, &e->tiers.env, first, count, m->staging, &m->io);
            char why[ERR_MSG_BYTES];
            snprintf(why, sizeof why, "%s", st != STRATA_OK ? err_last() : "");
            io_wait_finish(&m->io, st, why); /* drops the guard; a failure reaches on_fetch_read */
            st = STRATA_OK;                  /* reported through the fetch's status from now on */
        }
    } else {
        if (mirrored) { /* nothing to read: the copy is queued right here */
            err_latch_take_copy(&m->fetch_failed, NULL, 0);
            pthread_mutex_lock(&r->lock);
            m->copy_queued = true;
            pthread_mutex_unlock(&r->lock);
        }
        const char *from = mirrored                            ? mirrored
                           : params_on(e, STRATA_TIER_DEVICE) ? (const char *)src->mem + first * e->tiers.param_bytes
                                                              : tarr_host_ptr(src, &e->tiers.env, first);
        st = dev_memcpy_async(e->h2d, (char *)m->dev + m->slot_bytes, from, bytes);
        if (st == STRATA_OK && e->trace)
            st = dev_host_fn(e->h2d, mark_loaded, m);
        if (st == STRATA_OK)
            st = dev_event_record(m->ready, e->h2d);
    }
    atomic_fetch_add(&e->ctr.host_to_device, bytes);
    r->inflight_bytes += m->fetch_bytes; /* the device copy, whole: what the window and the cap count */
    r->resident_bytes += m->fetch_bytes;
    if (st != STRATA_OK) {
        char msg[ERR_MSG_BYTES];
        snprintf(msg, sizeof msg, "%s", err_last());
        drop(e, m);
        return err_set(st, "fetch of module \"%s\": %s", m->desc->name, msg);
    }
    return STRATA_OK;
}

/* LOADING -> RESIDENT once the copy is done; the staging buffer goes back to the pool. */
static strata_status settle(strata_engine *e, resident *m, bool wait)
{
    residency *r = e->res;
    if (m->state != MOD_LOADING)
        return STRATA_OK;
    bool done = true;
    strata_status st = STRATA_OK;
    if (params_on(e, STRATA_TIER_NVME))
        st = wait_copy_queued(r, m, wait, &done);
    if (st == STRATA_OK && done)
        st = wait ? dev_event_sync(m->ready) : dev_event_query(m->ready, &done);
    if (st == STRATA_OK && !done)
        return STRATA_OK;
    if (m->staging) {
        pool_release(e->tiers.pool, m->staging);
        m->staging = NULL;
    }
    r->inflight_bytes -= m->fetch_bytes;
    m->state = MOD_RESIDENT;
    trace_event(e->trace, TRACK_H2D,
                m->from_cache                      ? "fetch host cache->device"
                : params_on(e, STRATA_TIER_NVME) ? "fetch nvme->device"
                                                   : "fetch host->device",
                m->desc->name, m->issue_ns, m->loaded_ns);
    return st;
}

/* Orders a fetched module before the trainer's next compute. The host waits only for the disk read
 * (the copy cannot be queued before it); the copy itself is waited for by the compute stream — on the
 * host backend the caller's thread, so there the module is resident when this returns. */
static strata_status order_for_compute(strata_engine *e, resident *m)
{
    if (m->state != MOD_LOADING)
        return STRATA_OK;
    bool queued = true;
    if (params_on(e, STRATA_TIER_NVME))
        ERR_CHECK(wait_copy_queued(e->res, m, true, &queued));
    ERR_CHECK(dev_stream_wait_event(e->compute, m->ready));
    return settle(e, m, false);
}

/* Gives the module's device copy up (waiting for a fetch in flight to leave its buffers). */
static strata_status drop(strata_engine *e, resident *m)
{
    residency *r = e->res;
    if (!m->dev_owned)
        return STRATA_OK;
    /* An all-gather started ahead writes the buffer until it completes (every rank started it: it does). */
    strata_status st = comm_wait(m->gather);
    m->gather = NULL;
    m->gathered_ahead = false;
    if (m->state == MOD_LOADING) {
        /* The read and the copy may still be writing the buffers: wait before giving them back. */
        bool queued;
        if (params_on(e, STRATA_TIER_NVME))
            st = wait_copy_queued(r, m, true, &queued);
        strata_status est = dev_event_sync(m->ready);
        if (st == STRATA_OK)
            st = est;
        if (m->staging) {
            pool_release(e->tiers.pool, m->staging);
            m->staging = NULL;
        }
        r->inflight_bytes -= m->fetch_bytes;
    }
    /* The trainer's compute may still read the buffer: free it once the compute stream is past. */
    deferred_free_after(e->frees, m->dev, e->compute);
    m->dev = NULL;
    m->dev_owned = false;
    m->state = MOD_ABSENT;
    r->resident_bytes -= m->fetch_bytes;
    return st;
}

/* Device-tier parameters are never fetched: the module points into the front array. */
static void *device_tier_ptr(const strata_engine *e, const resident *m)
{
    return (char *)e->tiers.param[e->tiers.param_front].mem + m->desc->offset * e->tiers.param_bytes;
}

void residency_invalidate_all(strata_engine *e)
{
    residency *r = e->res;
    for (size_t i = 0; i < r->nmods; i++) {
        resident *m = &r->mods[i];
        if (m->dev_owned)
            drop(e, m);
        else if (used_in_place(e))
            m->dev = device_tier_ptr(e, m);
    }
}

bool residency_evict_one(strata_engine *e)
{
    return evict_one(e, NULL);
}

/* ---------------------------------------------------------------- lifetime */

strata_status residency_create(strata_engine *e, residency **out)
{
    size_t n = registry_nmodules(e->reg);
    residency *r = calloc(1, sizeof *r);
    if (!r || !(r->mods = calloc(n, sizeof *r->mods))) {
        free(r);
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory for the module residency");
    }
    *out = r;
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->cv, NULL);
    plan_windows(&e->cfg, e->tiers.param_bytes, &r->prefetch_bytes, &r->max_live_bytes);
    for (size_t i = 0; i < n; i++) {
        resident *m = &r->mods[i];
        m->engine = e;
        m->desc = registry_module(e->reg, (strata_module_id)i);
        io_wait_init(&m->io);
        err_latch_init(&m->fetch_failed);
        r->nmods = i + 1; /* what residency_destroy tears down */
        ERR_CHECK(dev_event_create(e->dev, &m->ready));
        m->fetch_bytes = m->desc->numel * e->tiers.param_bytes;
        m->move_bytes = registry_view_count(m->desc, e->views.param) * e->tiers.param_bytes;
        m->slot_bytes = ranks_fetch_gathers(e) ? (size_t)e->rank * m->move_bytes : 0;
        if (used_in_place(e)) {
            m->dev = device_tier_ptr(e, m);
            m->state = MOD_RESIDENT;
        }
    }
    return STRATA_OK;
}

void residency_destroy(strata_engine *e, residency *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->nmods; i++) {
        resident *m = &r->mods[i];
        drop(e, m);
        dev_event_destroy(m->ready);
        io_wait_destroy(&m->io);
        err_latch_destroy(&m->fetch_failed);
    }
    pthread_mutex_destroy(&r->lock);
    pthread_cond_destroy(&r->cv);
    free(r->mods);
    free(r);
}

/* ---------------------------------------------------------------- prefetch */

strata_status residency_prefetch(strata_engine *e)
{
    residency *r = e->res;
    const fetch_order *o = e->order;
    if (!fetch_order_valid(o) || used_in_place(e))
        return STRATA_OK;
    for (size_t i = 0; i < r->nmods; i++)
        settle(e, &r->mods[i], false);
    size_t ahead = 0, len = fetch_order_len(o);
    /* Step in backward writes a module's new parameters to their home during backward: a fetch of the next
     * step's modules now would read the old ones (and race with the writes); they are fetched after strata_step. */
    if (e->in_backward)
        len = MIN(len, fetch_order_step_left(o));
    for (size_t k = 0; k < len; k++) {
        resident *m = &r->mods[fetch_order_ahead(o, k)];
        ahead += m->fetch_bytes;
        if (ahead > r->prefetch_bytes + m->fetch_bytes && k > 0)
            break;
        if (m->state != MOD_ABSENT)
            continue;
        if (r->inflight_bytes + m->fetch_bytes > r->prefetch_bytes ||
            r->resident_bytes + m->fetch_bytes > r->max_live_bytes)
            break;
        strata_status st = start(e, m, false);
        if (st == STRATA_EBUDGET) {
            err_clear(); /* a prefetch that does not fit waits for its demand fetch */
            break;
        }
        ERR_CHECK(st);
    }
    return STRATA_OK;
}

/* ---------------------------------------------------------------- queries */

bool residency_held(const residency *r, strata_module_id id)
{
    return r && id < r->nmods && r->mods[id].held;
}

strata_module_id residency_first_held(const residency *r)
{
    for (size_t i = 0; r && i < r->nmods; i++)
        if (r->mods[i].held)
            return (strata_module_id)i;
    return STRATA_INVALID_ID;
}

const reg_param *residency_held_param(strata_engine *e, strata_param_id id, const char *what)
{
    strata_status st = engine_require_finalized(e, what);
    const reg_param *p = st == STRATA_OK ? registry_find_param(e->reg, id, what) : NULL;
    if (!p)
        return NULL;
    if (!e->res->mods[p->module].held) {
        const char *mod = registry_module(e->reg, p->module)->name;
        err_set(STRATA_ESTATE, "%s(\"%s.%s\"): module \"%s\" is not fetched; call strata_fetch first", what, mod,
                p->name, mod);
        return NULL;
    }
    return p;
}

void residency_stats(const residency *r, uint64_t *fetches, uint64_t *prefetch_hits, uint64_t *stall_ns)
{
    *fetches = r ? r->fetches : 0;
    *prefetch_hits = r ? r->prefetch_hits : 0;
    *stall_ns = r ? r->stall_ns : 0;
}

/* ---------------------------------------------------------------- public */

/* Stage 3: every fetch gathers the module from the ranks' shards, once: either the fetch before it started the
 * all-gather (gather_ahead), or it runs now. A copy still resident from an earlier fetch is gathered again too:
 * whether it is still resident depends on timing that differs between ranks, and every rank must make the same
 * collectives in the same order. */
static strata_status gather(strata_engine *e, resident *m)
{
    if (!m->gathered_ahead)
        return ranks_gather_module(e, m->desc, m->dev);
    strata_status st = comm_wait(m->gather);
    m->gather = NULL;
    m->gathered_ahead = false;
    return st;
}

/* Starts the all-gather of the module the order expects next in this step, so that it runs on the comm's thread
 * while the trainer computes with m. Whether it starts depends only on the order and on which modules the trainer
 * holds and on the configured window, the same on every rank. Its shard is made resident first (it usually is:
 * the prefetcher read it). */
static strata_status gather_ahead(strata_engine *e, const resident *m)
{
    if (!ranks_fetch_gathers(e) || !fetch_order_step_has_more(e->order))
        return STRATA_OK;
    resident *n = &e->res->mods[fetch_order_ahead(e->order, 0)];
    /* Within the configured prefetch window only (the trainer may have asked for none). */
    if (n == m || n->held || n->gathered_ahead || n->fetch_bytes > e->res->prefetch_bytes)
        return STRATA_OK;
    if (n->state == MOD_ABSENT)
        ERR_CHECK(start(e, n, true));
    ERR_CHECK(settle(e, n, true));
    ERR_CHECK(ranks_start_gather(e, n->desc, n->dev, &n->gather));
    n->gathered_ahead = true;
    return STRATA_OK;
}

static strata_status fetch(strata_engine *e, strata_module_id id)
{
    ERR_CHECK(engine_require_module(e, id, "strata_fetch"));
    residency *r = e->res;
    resident *m = &r->mods[id];
    if (m->held)
        return err_set(STRATA_ESTATE, "strata_fetch(\"%s\"): the module is already held; release it before "
                       "fetching it again", m->desc->name);
    deferred_process(e->frees, false);
    fetch_order_track(e->order, e->reg, id);
    r->fetches++;
    if (m->state != MOD_ABSENT || used_in_place(e))
        r->prefetch_hits++;
    if (m->state == MOD_ABSENT) {
        /* Make room within the residency cap before a demand fetch. */
        while (r->resident_bytes + m->fetch_bytes > r->max_live_bytes && evict_one(e, m))
            ;
        strata_status st = start(e, m, true);
        if (st == STRATA_EBUDGET) {
            char need[32], live[32];
            return err_set(STRATA_EBUDGET, "strata_fetch(\"%s\"): the device budget cannot hold this module (%s) "
                           "with the modules still held (%s resident); release modules sooner or raise "
                           "strata.device_budget_bytes", m->desc->name, size_format(m->fetch_bytes, need, sizeof need),
                           size_format(r->resident_bytes, live, sizeof live));
        }
        ERR_CHECK(st);
    }
    uint64_t t0 = now_ns();
    strata_status st = order_for_compute(e, m);
    if (st == STRATA_OK && ranks_fetch_gathers(e))
        st = gather(e, m);
    uint64_t t1 = now_ns();
    r->stall_ns += t1 - t0;
    if (t1 - t0 > 2000)
        trace_event(e->trace, TRACK_TRAINER, "stall", m->desc->name, t0, t1);
    if (st == STRATA_OK)
        st = gather_ahead(e, m);
    if (st != STRATA_OK) {
        char msg[ERR_MSG_BYTES];
        snprintf(msg, sizeof msg, "%s", err_last());
        drop(e, m);
        return err_set(st, "strata_fetch(\"%s\"): %s", m->desc->name, msg);
    }
    m->held = true;
    return residency_prefetch(e);
}

STRATA_API strata_status strata_fetch(strata_engine *e, strata_module_id module)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_fetch: engine is NULL");
    strata_status st = fetch(e, module);
    ranks_fail(e, st);
    return err_copy(&e->err, st);
}

static strata_status release(strata_engine *e, strata_module_id id)
{
    ERR_CHECK(engine_require_module(e, id, "strata_release"));
    residency *r = e->res;
    resident *m = &r->mods[id];
    if (!m->held)
        return err_set(STRATA_ESTATE, "strata_release(\"%s\"): the module is not held (released twice, or never "
                       "fetched)", m->desc->name);
    m->held = false;
    grads_discard(e, id);
    ERR_CHECK(step_in_backward_released(e, id));
    /* Keep what the prefetcher would fetch again right away, and small persistent modules. */
    size_t d = fetch_order_next_use(e->order, id);
    bool soon = d != SIZE_MAX && d * m->fetch_bytes <= r->prefetch_bytes;
    if (m->dev_owned && !m->desc->persistent && !soon)
        drop(e, m);
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
    const reg_param *p = residency_held_param(e, param, "strata_param_data");
    if (!p) {
        err_copy(&e->err, err_last_status());
        return NULL;
    }
    const resident *m = &e->res->mods[p->module];
    return (char *)m->dev + (p->offset - m->desc->offset) * e->tiers.param_bytes;
}
