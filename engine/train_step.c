/* strata_step and what surrounds it: loss scaling, the delayed update's buffer swaps, sync, reads. */
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/util.h"
#include "engine/engine.h"

/* DeepSpeed's dynamic loss scaling: halve after `hysteresis` overflows, double after a window of
 * good steps. A static scale (fp16.loss_scale > 0) never changes. */
static void update_loss_scale(strata_engine *e, bool overflow)
{
    if (e->cfg.param_dtype != STRATA_DTYPE_FP16 || e->cfg.loss_scale > 0)
        return;
    if (overflow) {
        e->good_steps = 0;
        if (--e->hysteresis_left <= 0) {
            e->loss_scale = MAX(e->loss_scale / 2, e->cfg.min_loss_scale);
            e->hysteresis_left = e->cfg.hysteresis;
        }
    } else if (++e->good_steps >= e->cfg.loss_scale_window) {
        e->loss_scale *= 2;
        e->good_steps = 0;
        e->hysteresis_left = e->cfg.hysteresis;
    }
}

/* A finished update becomes visible: with two parameter copies the back one becomes the front,
 * and every device copy of the old parameters is dropped. */
static void publish_update(strata_engine *e, const strata_step_result *r, int param_out)
{
    if (r->skipped) {
        e->skipped_steps++;
    } else {
        e->steps++;
        e->param_front = param_out;
    }
    update_loss_scale(e, r->skipped);
    fetch_invalidate_all(e);
}

/* Waits for the delayed update in flight (if any) and publishes it; *r receives its result. */
static strata_status join_delayed(strata_engine *e, strata_step_result *r, bool *had)
{
    strata_step_result prev;
    strata_status st = opt_job_join(e, &prev, had);
    if (*had && st == STRATA_OK) {
        publish_update(e, &prev, 1 - e->param_front);
        if (r)
            *r = prev;
    }
    return st;
}

static strata_status step(strata_engine *e, const strata_step_args *args, strata_step_result *out)
{
    ERR_CHECK(engine_require_finalized(e, "strata_step"));
    if (e->ckpt_incomplete)
        return err_set(STRATA_ESTATE, "strata_step: a strata_load failed part-way, so the model state is a mix of "
                       "two checkpoints; load a good checkpoint or destroy the engine");
    for (size_t i = 0; i < e->nmodules; i++)
        if (e->modules[i].held)
            return err_set(STRATA_ESTATE, "strata_step: module \"%s\" is still held; release every module before "
                           "the optimizer step", e->modules[i].name);
    uint64_t t0 = now_ns();
    ERR_CHECK(grads_drain(e));
    ERR_CHECK(engine_process_frees(e, true));
    fetch_step_boundary(e);
    double lr = args && args->lr > 0 ? args->lr : e->cfg.lr;
    double scale = e->loss_scale; /* the scale this step's gradients were computed with */
    e->steps_called++;

    strata_step_result r = {.grad_norm = -1};
    bool two = e->cfg.delayed_update;
    int back = two ? 1 - e->param_front : e->param_front;
    if (two) {
        /* Join the previous delayed update before anything else touches the optimizer state. */
        bool had;
        ERR_CHECK(join_delayed(e, &r, &had));
        back = 1 - e->param_front;
    }
    if (two && e->steps_called > e->cfg.delayed_warmup_steps) {
        /* The next step's first fetches are queued before the background update's NVMe reads, so the
         * trainer's first modules do not wait behind the optimizer state on the drive (they read the front
         * parameter copy; the update writes the back one). */
        ERR_CHECK(fetch_prefetch(e));
        int consumed = e->grad_front;
        e->grad_front = 1 - e->grad_front;
        opt_job_submit(e, lr, scale, consumed, back);
        r.delayed = true;
    } else {
        strata_status st = step_run(e, lr, scale, e->grad_front, back, &r);
        if (st != STRATA_OK) {
            fetch_invalidate_all(e);
            return st;
        }
        publish_update(e, &r, back);
    }
    r.step = e->adam_step;
    r.loss_scale = e->loss_scale;
    if (out)
        *out = r;
    strata_status st = fetch_prefetch(e);
    e->step_ns += now_ns() - t0;
    trace_event(e->trace, TRACK_TRAINER, r.delayed ? "step (delayed: hand-off)" : "step", NULL, t0, now_ns());
    return st;
}

STRATA_API strata_status strata_step(strata_engine *e, const strata_step_args *args, strata_step_result *result)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_step: engine is NULL");
    return err_copy(&e->err, step(e, args, result));
}

STRATA_API double strata_loss_scale(const strata_engine *e)
{
    return e ? e->loss_scale : 1.0;
}

static strata_status sync(strata_engine *e)
{
    ERR_CHECK(engine_require_finalized(e, "strata_sync"));
    bool had;
    ERR_CHECK(join_delayed(e, NULL, &had));
    ERR_CHECK(grads_drain(e));
    ERR_CHECK(dev_stream_sync(e->h2d));
    return engine_process_frees(e, true);
}

STRATA_API strata_status strata_sync(strata_engine *e)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_sync: engine is NULL");
    return err_copy(&e->err, sync(e));
}

static strata_status read_master(strata_engine *e, strata_param_id id, size_t offset, size_t count, float *out)
{
    ERR_CHECK(engine_require_finalized(e, "strata_param_read_master"));
    eng_param *p = engine_param(e, id, "strata_param_read_master");
    if (!p)
        return STRATA_ESTATE;
    if (!out || offset > p->numel || count > p->numel - offset)
        return err_set(STRATA_EINVAL, "strata_param_read_master(\"%s\"): range [%zu, %zu) is outside its %zu "
                       "elements (or out is NULL)", p->name, offset, offset + count, p->numel);
    ERR_CHECK(sync(e));
    if (e->master.tier != STRATA_TIER_NVME)
        return tarr_read(&e->master, &e->env, p->offset + offset, count, out, NULL);
    /* NVMe reads move whole aligned blocks: read the covering block range through a buffer. */
    size_t first = (p->offset + offset) / 1024 * 1024, last = align_up(p->offset + offset + count, 1024);
    float *buf;
    /* Not a hot path: its own aligned buffer, so it never competes with the pool's planned slices. */
    if (posix_memalign((void **)&buf, 4096, (last - first) * 4) != 0)
        return err_set(STRATA_ENOMEM, "strata_param_read_master: out of memory for %zu elements", last - first);
    io_wait w;
    io_wait_init(&w);
    strata_status st = tarr_read(&e->master, &e->env, first, last - first, buf, &w);
    strata_status wst = io_wait_wait(&w);
    io_wait_destroy(&w);
    if (st == STRATA_OK)
        st = wst;
    if (st == STRATA_OK)
        memcpy(out, buf + (p->offset + offset - first), count * 4);
    free(buf);
    return st;
}

STRATA_API strata_status strata_param_read_master(strata_engine *e, strata_param_id param, size_t offset,
                                                  size_t count, float *out)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_param_read_master: engine is NULL");
    return err_copy(&e->err, read_master(e, param, offset, count, out));
}

STRATA_API strata_status strata_stats_get(strata_engine *e, strata_stats *out)
{
    if (!e || !out)
        return err_set(STRATA_EINVAL, "strata_stats_get: engine and out must not be NULL");
    memset(out, 0, sizeof *out);
    out->steps = e->steps;
    out->skipped_steps = e->skipped_steps;
    out->fetches = e->fetches;
    out->prefetch_hits = e->prefetch_hits;
    out->stall_ns = e->stall_ns;
    out->step_ns = e->step_ns;
    out->adam_ns = atomic_load(&e->ctr.adam_ns);
    out->step_io_wait_ns = atomic_load(&e->ctr.step_io_wait_ns);
    out->nvme_to_host_bytes = atomic_load(&e->ctr.nvme_to_host);
    out->host_to_device_bytes = atomic_load(&e->ctr.host_to_device);
    out->device_to_host_bytes = atomic_load(&e->ctr.device_to_host);
    out->host_to_nvme_bytes = atomic_load(&e->ctr.host_to_nvme);
    if (e->dev) {
        dev_mem_stats ds;
        dev_mem_stats_get(e->dev, &ds);
        out->device_peak_bytes = ds.peak_bytes;
        out->device_budget_bytes = ds.budget_bytes;
    }
    out->host_peak_bytes = e->host_tier_bytes;
    out->host_budget_bytes = e->finalized ? e->cfg.host_budget_bytes : 0;
    if (e->swap)
        out->nvme_peak_bytes = swap_capacity(e->swap) - swap_free_bytes(e->swap);
    return STRATA_OK;
}
