/* One module's update in pieces, for the step in backward; see module_update.h. */
#include "engine/step/module_update.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "engine/config/config.h"
#include "engine/engine.h"
#include "engine/ranks/ranks.h"
#include "engine/step/step.h"

strata_status updater_create(module_updater *u, strata_engine *e)
{
    engine_tiers *t = &e->tiers;
    u->e = e;
    u->threads = e->cfg.cpu_threads ? e->cfg.cpu_threads : adam_default_threads();
    u->chunk = step_piece_numel(e);
    u->keep_grads = cfg_keeps_grads(&e->cfg);
    u->speculate = cfg_speculates(&e->cfg);
    u->kept_dtype = e->world > 1 ? STRATA_DTYPE_FP32 : e->cfg.param_dtype;
    if (posix_memalign((void **)&u->zeros, 4096, u->chunk * 4) != 0) {
        u->zeros = NULL;
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory for step in backward");
    }
    memset(u->zeros, 0, u->chunk * 4);
    ERR_CHECK(adam_ops_default(&u->adam));
    size_t bytes = u->chunk * 4, moment_bytes = tarr_bytes(&t->exp_avg, u->chunk);
    if (t->opt_tier == STRATA_TIER_NVME) {
        ERR_CHECK(pool_acquire(t->pool, POOL_STEP, bytes, "step in backward: master weights", (void **)&u->master));
        ERR_CHECK(pool_acquire(t->pool, POOL_STEP, moment_bytes, "step in backward: exp_avg", &u->m));
        ERR_CHECK(pool_acquire(t->pool, POOL_STEP, moment_bytes, "step in backward: exp_avg_sq", &u->v));
    }
    if (t->param_tier != STRATA_TIER_HOST)
        ERR_CHECK(pool_acquire(t->pool, POOL_STEP, u->chunk * t->param_bytes, "step in backward: parameter staging",
                               &u->pstage));
    if (!u->speculate)
        return STRATA_OK;
    size_t kept = u->keep_grads ? strata_dtype_bytes(u->kept_dtype) : 0;
    ERR_CHECK(rollback_create(&u->rb, t, registry_view_numel(e->reg, e->views.opt), kept));
    if (u->rb.kept.tier == STRATA_TIER_NVME)
        ERR_CHECK(pool_acquire(t->pool, POOL_STEP, u->chunk * kept,
                               "step in backward: kept gradients read back for a redo", &u->gbuf));
    return STRATA_OK;
}

void updater_destroy(module_updater *u)
{
    if (!u->e)
        return;
    engine_tiers *t = &u->e->tiers;
    if (t->pool) {
        void *bufs[] = {u->master, u->m, u->v, u->pstage, u->gbuf};
        for (size_t i = 0; i < ARRAY_LEN(bufs); i++)
            pool_release(t->pool, bufs[i]);
    }
    rollback_destroy(&u->rb, t);
    free(u->zeros);
}

/* One piece [first, first + cnt) of a module, done elements into it, and the arrays it updates. */
typedef struct piece {
    const reg_module *m;
    size_t first, done, cnt;
    tier_array *src[ROLLBACK_ARRAYS], *dst[ROLLBACK_ARRAYS]; /* the front and what the update writes */
    adam_arrays a;
    void *exp_avg, *exp_avg_sq;    /* the moments in their form */
} piece;

/* Points the piece at its gradients: g's memory, zeros, or (a redo) the kept ones, read back from NVMe. */
static strata_status piece_grads(module_updater *u, const grad_src *g, piece *p)
{
    engine_tiers *t = &u->e->tiers;
    p->a.grad_dtype = g->dtype;
    if (!g->from_kept) {
        p->a.grad = g->mem ? (const void *)((const char *)g->mem + p->done * strata_dtype_bytes(g->dtype)) : u->zeros;
        return STRATA_OK;
    }
    if (u->rb.kept.tier != STRATA_TIER_NVME) {
        p->a.grad = tarr_host_ptr(&u->rb.kept, &t->env, p->first);
        return STRATA_OK;
    }
    p->a.grad = u->gbuf;
    return tarr_read_sync(&u->rb.kept, &t->env, p->first, p->cnt, u->gbuf);
}

/* The back copy of the piece's 8-bit block scales (host memory) starts as the front: Adam updates them in place. */
static void piece_scales(module_updater *u, piece *p)
{
    engine_tiers *t = &u->e->tiers;
    size_t b0 = p->first / MOMENTS_Q8_BLOCK, nb = (p->cnt + MOMENTS_Q8_BLOCK - 1) / MOMENTS_Q8_BLOCK;
    for (int i = ROLLBACK_PIECE_ARRAYS; i < ROLLBACK_ARRAYS; i++)
        if (p->dst[i]->numel && p->dst[i] != p->src[i])
            memcpy(tarr_host_ptr(p->dst[i], &t->env, b0), tarr_host_ptr(p->src[i], &t->env, b0), nb * 4);
}

/* Points the piece at its master weights and moments: read from NVMe into the pinned buffers, or in host memory
 * (the back copy, when it is written, starting as the front: Adam updates in place). */
static strata_status piece_state(module_updater *u, piece *p)
{
    strata_engine *e = u->e;
    engine_tiers *t = &e->tiers;
    void **state[ROLLBACK_PIECE_ARRAYS] = {(void **)&p->a.master, &p->exp_avg, &p->exp_avg_sq};
    void *slot[ROLLBACK_PIECE_ARRAYS] = {u->master, u->m, u->v};
    piece_scales(u, p);
    if (t->opt_tier != STRATA_TIER_NVME) {
        for (int i = 0; i < ROLLBACK_PIECE_ARRAYS; i++) {
            *state[i] = tarr_host_ptr(p->dst[i], &t->env, p->first);
            if (p->dst[i] != p->src[i])
                memcpy(*state[i], tarr_host_ptr(p->src[i], &t->env, p->first), tarr_bytes(p->src[i], p->cnt));
        }
        return STRATA_OK;
    }
    io_wait w;
    io_wait_init(&w);
    uint64_t t0 = now_ns();
    strata_status st = STRATA_OK;
    for (int i = 0; i < ROLLBACK_PIECE_ARRAYS && st == STRATA_OK; i++) {
        st = tarr_read(p->src[i], &t->env, p->first, p->cnt, slot[i], &w);
        *state[i] = slot[i];
    }
    strata_status wst = io_wait_wait(&w);
    io_wait_destroy(&w);
    atomic_fetch_add(&e->ctr.step_io_wait_ns, now_ns() - t0);
    trace_event(e->trace, TRACK_NVME, "read master/m/v", p->m->name, t0, now_ns());
    return st != STRATA_OK ? st : wst;
}

/* Writes the piece's updated state back to NVMe (host memory was updated in place), and keeps its gradients when
 * g says so: what a redo needs. */
static strata_status piece_write_back(module_updater *u, const grad_src *g, piece *p)
{
    strata_engine *e = u->e;
    engine_tiers *t = &e->tiers;
    if (t->opt_tier != STRATA_TIER_NVME) {
        if (g->keep)
            memcpy(tarr_host_ptr(&u->rb.kept, &t->env, p->first), p->a.grad, p->cnt * strata_dtype_bytes(g->dtype));
        return STRATA_OK;
    }
    const void *slot[ROLLBACK_PIECE_ARRAYS] = {u->master, u->m, u->v};
    io_wait w;
    io_wait_init(&w);
    uint64_t w0 = now_ns();
    strata_status st = STRATA_OK;
    for (int i = 0; i < ROLLBACK_PIECE_ARRAYS && st == STRATA_OK; i++)
        st = tarr_write(p->dst[i], &t->env, p->first, p->cnt, slot[i], &w);
    if (st == STRATA_OK && g->keep)
        st = tarr_write(&u->rb.kept, &t->env, p->first, p->cnt, p->a.grad, &w);
    strata_status wst = io_wait_wait(&w);
    io_wait_destroy(&w);
    trace_event(e->trace, TRACK_NVME, "write master/m/v", p->m->name, w0, now_ns());
    return st != STRATA_OK ? st : wst;
}

/* Sends the piece's new parameters from the staging to a device or NVMe home (a host home was written in place). */
static strata_status piece_params(module_updater *u, tier_array *pout, const piece *p)
{
    strata_engine *e = u->e;
    size_t pb = e->tiers.param_bytes;
    if (pout->tier == STRATA_TIER_NVME)
        return tarr_write_sync(pout, &e->tiers.env, p->first, p->cnt, u->pstage);
    if (pout->tier != STRATA_TIER_DEVICE)
        return STRATA_OK;
    uint64_t t1 = now_ns();
    ERR_CHECK(dev_memcpy_async(e->upd, (char *)pout->mem + p->first * pb, u->pstage, p->cnt * pb));
    ERR_CHECK(dev_stream_sync(e->upd)); /* pstage is used again by the next piece */
    atomic_fetch_add(&e->ctr.host_to_device, p->cnt * pb);
    trace_event(e->trace, TRACK_UPDATE, "parameters", p->m->name, t1, now_ns());
    return STRATA_OK;
}

strata_status updater_run(module_updater *u, strata_module_id id, const grad_src *g, const step_consts *consts,
                          dev_event *released)
{
    strata_engine *e = u->e;
    engine_tiers *t = &e->tiers;
    piece p = {.m = registry_module(e->reg, id)};
    tier_array *pout = ranks_step_params(e, t->param_front); /* this rank's shard at stages 1 and 2 */
    size_t off = registry_view_offset(p.m, e->views.opt), n = registry_view_count(p.m, e->views.opt);
    for (int i = 0; i < ROLLBACK_ARRAYS; i++) {
        p.src[i] = rollback_front(t, i);
        p.dst[i] = u->speculate ? &u->rb.back[i] : p.src[i];
    }
    /* The device copy the trainer read must be done with before the new parameters land where it lies. */
    if (pout->tier == STRATA_TIER_DEVICE && released)
        ERR_CHECK(dev_stream_wait_event(e->upd, released));
    for (p.done = 0; p.done < n; p.done += p.cnt) {
        p.cnt = MIN(u->chunk, n - p.done);
        p.first = off + p.done;
        p.a = (adam_arrays){.param_dtype = e->cfg.param_dtype, .stream_param = true};
        ERR_CHECK(piece_grads(u, g, &p));
        ERR_CHECK(piece_state(u, &p));
        p.a.param = pout->tier == STRATA_TIER_HOST ? tarr_host_ptr(pout, &t->env, p.first) : u->pstage;
        adam_job job = {.ops = u->adam, .arrays = p.a, .numel = p.cnt, .threads = u->threads};
        step_consts_apply(consts, p.first, &job);
        step_job_moments(e, p.first, p.exp_avg, p.exp_avg_sq, p.dst[ROLLBACK_EXP_AVG_SCALE], p.dst[ROLLBACK_EXP_AVG_SQ_SCALE], u->step,
                         &job);
        char place[ENGINE_NAME_BYTES + 64];
        snprintf(place, sizeof place, "%s [%zu, %zu)", p.m->name, p.done, p.done + p.cnt);
        ERR_CHECK(step_adam_timed(e, &job, g->from_kept ? "adam (redo: clipped)" : "adam (in backward)", place));
        ERR_CHECK(piece_params(u, pout, &p));
        ERR_CHECK(piece_write_back(u, g, &p));
    }
    return STRATA_OK;
}

strata_status updater_restore_params(module_updater *u, strata_module_id id)
{
    strata_engine *e = u->e;
    engine_tiers *t = &e->tiers;
    piece p = {.m = registry_module(e->reg, id)};
    tier_array *pout = ranks_step_params(e, t->param_front);
    size_t off = registry_view_offset(p.m, e->views.opt), n = registry_view_count(p.m, e->views.opt);
    for (p.done = 0; p.done < n; p.done += p.cnt) {
        p.cnt = MIN(u->chunk, n - p.done);
        p.first = off + p.done;
        const float *master = tarr_host_ptr(&t->master, &t->env, p.first);
        if (t->master.tier == STRATA_TIER_NVME) {
            ERR_CHECK(tarr_read_sync(&t->master, &t->env, p.first, p.cnt, u->master));
            master = u->master;
        }
        void *param = pout->tier == STRATA_TIER_HOST ? tarr_host_ptr(pout, &t->env, p.first) : u->pstage;
        ERR_CHECK(strata_convert(param, e->cfg.param_dtype, master, STRATA_DTYPE_FP32, p.cnt));
        ERR_CHECK(piece_params(u, pout, &p));
    }
    return STRATA_OK;
}

strata_status updater_stats(module_updater *u, strata_module_id id, const void *grad, strata_dtype dtype,
                            adam_gradstats *out)
{
    strata_engine *e = u->e;
    size_t n = registry_view_count(registry_module(e->reg, id), e->views.opt), gb = strata_dtype_bytes(dtype);
    for (size_t done = 0; done < n; done += u->chunk)
        ERR_CHECK(step_piece_gradstats(e, (const char *)grad + done * gb, dtype, MIN(u->chunk, n - done), out));
    return STRATA_OK;
}

strata_status updater_keep(module_updater *u, strata_module_id id, const grad_src *g)
{
    strata_engine *e = u->e;
    const reg_module *m = registry_module(e->reg, id);
    size_t off = registry_view_offset(m, e->views.opt), n = registry_view_count(m, e->views.opt);
    if (u->rb.kept.tier == STRATA_TIER_NVME)
        return tarr_write_sync(&u->rb.kept, &e->tiers.env, off, n, g->mem);
    memcpy(tarr_host_ptr(&u->rb.kept, &e->tiers.env, off), g->mem, n * strata_dtype_bytes(g->dtype));
    return STRATA_OK;
}
