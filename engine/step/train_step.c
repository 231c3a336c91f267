/* strata_step_begin, strata_step and what surrounds them: loss scaling, the delayed update's buffer swaps, sync,
 * reads. */
#include "engine/step/train_step.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/util.h"
#include "engine/act_store.h"
#include "engine/engine.h"
#include "engine/plan/host_cache.h"
#include "engine/ranks/ranks.h"
#include "engine/step/step_in_backward.h"
#include "engine/step/step.h"
#include "engine/step/twin_flow.h"

struct step_driver {
    double loss_scale;
    int good_steps, hysteresis_left;
    int64_t iterations;             /* strata_step calls */
    uint64_t steps, skipped_steps, step_ns;
};

strata_status driver_create(const strata_config *cfg, step_driver **out)
{
    step_driver *d = calloc(1, sizeof *d);
    if (!d)
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory");
    if (cfg->param_dtype == STRATA_DTYPE_FP16)
        d->loss_scale = cfg->loss_scale > 0 ? cfg->loss_scale : (double)(1ull << cfg->initial_scale_power);
    else
        d->loss_scale = 1.0;
    d->hysteresis_left = cfg->hysteresis;
    *out = d;
    return STRATA_OK;
}

void driver_destroy(step_driver *d)
{
    free(d);
}

void driver_progress(const step_driver *d, train_progress *out)
{
    *out = (train_progress){.iterations = d->iterations, .steps = d->steps, .skipped_steps = d->skipped_steps,
                            .loss_scale = d->loss_scale, .good_steps = d->good_steps,
                            .hysteresis_left = d->hysteresis_left};
}

void driver_restore(step_driver *d, const train_progress *p)
{
    d->iterations = p->iterations;
    d->steps = p->steps;
    d->skipped_steps = p->skipped_steps;
    d->loss_scale = p->loss_scale;
    d->good_steps = p->good_steps;
    d->hysteresis_left = p->hysteresis_left;
}

uint64_t driver_step_ns(const step_driver *d)
{
    return d ? d->step_ns : 0;
}

/* DeepSpeed's dynamic loss scaling: halve after `hysteresis` overflows, double after a window of
 * good steps. A static scale (fp16.loss_scale > 0) never changes. */
static void update_loss_scale(step_driver *d, const strata_config *cfg, bool overflow)
{
    if (cfg->param_dtype != STRATA_DTYPE_FP16 || cfg->loss_scale > 0)
        return;
    if (overflow) {
        d->good_steps = 0;
        if (--d->hysteresis_left <= 0) {
            d->loss_scale = MAX(d->loss_scale / 2, cfg->min_loss_scale);
            d->hysteresis_left = cfg->hysteresis;
        }
    } else if (++d->good_steps >= cfg->loss_scale_window) {
        d->loss_scale *= 2;
        d->good_steps = 0;
        d->hysteresis_left = cfg->hysteresis;
    }
}

/* A finished update becomes visible: at stages 1 and 2 the ranks' updated shards are all-gathered into the
 * copy it wrote; with two parameter copies the back one becomes the front; every device copy of the old
 * parameters is dropped. Whether the step was skipped is the same on every rank (the overflow is global). */
static strata_status publish_update(strata_engine *e, const strata_step_result *r, int param_out)
{
    step_driver *d = e->driver;
    strata_status st = STRATA_OK;
    if (r->skipped) {
        d->skipped_steps++;
    } else {
        st = ranks_publish_params(e, param_out);
        d->steps++;
        e->tiers.param_front = param_out;
    }
    update_loss_scale(d, &e->cfg, r->skipped);
    residency_invalidate_all(e);
    if (st == STRATA_OK) /* no fetch is in flight now: the host cache may change what it mirrors */
        st = host_cache_follow_order(e);
    return st;
}

/* Waits for the delayed update in flight (if any) and publishes it; *r receives its result. */
static strata_status join_delayed(strata_engine *e, strata_step_result *r, bool *had)
{
    strata_step_result prev;
    strata_status st = opt_job_join(e->opt, &prev, had);
    if (*had && st == STRATA_OK) {
        st = publish_update(e, &prev, 1 - e->tiers.param_front);
        if (r)
            *r = prev;
    }
    return st;
}

/* The collectives before an update, on the trainer's thread: the gradients exchanged as the stage says, and
 * with several ranks the global gradient statistics (clipping and the fp16 overflow need them). */
static strata_status prepare_job(strata_engine *e, step_job *job)
{
    ERR_CHECK(ranks_exchange_grads(e, job->grad_index, job->lr, (uint64_t)e->driver->iterations));
    bool need_stats = e->cfg.gradient_clipping > 0 || e->cfg.param_dtype == STRATA_DTYPE_FP16;
    if (e->world == 1 || !need_stats)
        return STRATA_OK;
    const adam_cores *prev = adam_cores_use(node_adam_cores(e->node));
    strata_status st = step_grad_stats(e, job->grad_index, &job->sumsq, &job->nonfinite);
    adam_cores_use(prev);
    ERR_CHECK(st);
    ERR_CHECK(ranks_sum_gradstats(e, &job->sumsq, &job->nonfinite));
    job->have_stats = true;
    return STRATA_OK;
}

/* strata_step with step in backward: the updates ran (or run) during backward; wait for them, then publish. */
static strata_status step_updated_in_backward(strata_engine *e, const strata_step_args *args, strata_step_result *out)
{
    step_driver *d = e->driver;
    uint64_t t0 = now_ns();
    ERR_CHECK(grads_drain(e));
    strata_step_result r = {.grad_norm = -1};
    /* Every rank runs this step with the same lr and step number (the gradients were reduced as handed over). */
    strata_status st = ranks_exchange_grads(e, grads_front(e->grads), step_in_backward_lr(e->in_backward),
                                            (uint64_t)d->iterations + 1);
    if (st == STRATA_OK)
        st = step_in_backward_finish(e, args, &r.grad_norm, &r.skipped);
    if (st != STRATA_OK) {
        residency_invalidate_all(e);
        return st;
    }
    ERR_CHECK(deferred_process(e->frees, true));
    fetch_order_step_boundary(e->order);
    d->iterations++;
    grads_consumed(e->grads, grads_front(e->grads));
    ERR_CHECK(publish_update(e, &r, e->tiers.param_front));
    r.step = step_count(e->step);
    r.loss_scale = d->loss_scale;
    if (out)
        *out = r;
    st = residency_prefetch(e);
    d->step_ns += now_ns() - t0;
    trace_event(e->trace, TRACK_TRAINER, "step (updates ran in backward)", NULL, t0, now_ns());
    return st;
}

static strata_status step(strata_engine *e, const strata_step_args *args, strata_step_result *out)
{
    ERR_CHECK(engine_require_finalized(e, "strata_step"));
    if (e->ckpt_incomplete)
        return err_set(STRATA_ESTATE, "strata_step: a strata_load failed part-way, so the model state is a mix of "
                       "two checkpoints; load a good checkpoint or destroy the engine");
    if (act_store_kept(e->acts))
        return err_set(STRATA_ESTATE, "strata_step: %zu activations kept with strata_act_push were not dropped; "
                       "drop each (strata_act_drop) in backward, before the optimizer step",
                       act_store_kept(e->acts));
    strata_module_id held = residency_first_held(e->res);
    if (held != STRATA_INVALID_ID)
        return err_set(STRATA_ESTATE, "strata_step: module \"%s\" is still held; release every module before "
                       "the optimizer step", registry_module(e->reg, held)->name);
    if (args && !(args->lr >= 0 && isfinite(args->lr)))
        return err_set(STRATA_EINVAL, "strata_step: lr = %g; a learning rate is finite and >= 0 (0 = the configured "
                       "optimizer.params.lr)", args->lr);
    ERR_CHECK(opt_groups_check_step_lr(e->groups, args ? args->lr : 0, "strata_step"));
    if (e->in_backward)
        return step_updated_in_backward(e, args, out);
    step_driver *d = e->driver;
    uint64_t t0 = now_ns();
    ERR_CHECK(grads_drain(e));
    ERR_CHECK(deferred_process(e->frees, true));
    fetch_order_step_boundary(e->order);
    double scale = d->loss_scale; /* the scale this step's gradients were computed with */
    d->iterations++;

    strata_step_result r = {.grad_norm = -1};
    bool two = e->cfg.delayed_update;
    int back = two ? 1 - e->tiers.param_front : e->tiers.param_front;
    if (two) {
        /* Join the previous delayed update before anything else touches the optimizer state. */
        bool had;
        ERR_CHECK(join_delayed(e, &r, &had));
        back = 1 - e->tiers.param_front;
    }
    /* The groups' values this step runs with (the delayed update in flight was joined: nothing reads them now). */
    ERR_CHECK(opt_groups_freeze(e->groups, args ? args->lr : 0, "strata_step"));
    step_job job = {.lr = opt_groups_frozen_lr(e->groups), .loss_scale = scale, .grad_index = grads_front(e->grads), .param_out = back};
    ERR_CHECK(prepare_job(e, &job));
    if (two && d->iterations > e->cfg.delayed_warmup_steps) {
        /* The next step's first fetches are queued before the background update's NVMe reads, so the
         * trainer's first modules do not wait behind the optimizer state on the drive (they read the front
         * parameter copy; the update writes the back one). */
        ERR_CHECK(residency_prefetch(e));
        grads_flip(e->grads);
        opt_job_submit(e->opt, &job);
        r.delayed = true;
    } else {
        /* The Adam team this thread starts runs on this rank's cores (node_share.h); the trainer's thread keeps its
         * own binding. */
        const adam_cores *prev = adam_cores_use(node_adam_cores(e->node));
        strata_status st = step_run(e, &job, &r);
        adam_cores_use(prev);
        if (st != STRATA_OK) {
            residency_invalidate_all(e);
            return st;
        }
        ERR_CHECK(publish_update(e, &r, back));
    }
    r.step = step_count(e->step);
    r.loss_scale = d->loss_scale;
    if (out)
        *out = r;
    strata_status st = residency_prefetch(e);
    d->step_ns += now_ns() - t0;
    trace_event(e->trace, TRACK_TRAINER, r.delayed ? "step (delayed: hand-off)" : "step", NULL, t0, now_ns());
    return st;
}

static strata_status step_begin(strata_engine *e, const strata_step_args *args)
{
    ERR_CHECK(engine_require_finalized(e, "strata_step_begin"));
    if (args && !(args->lr >= 0 && isfinite(args->lr)))
        return err_set(STRATA_EINVAL, "strata_step_begin: lr = %g; a learning rate is finite and >= 0 (0 = the "
                       "configured optimizer.params.lr)", args->lr);
    if (!e->in_backward)
        return STRATA_OK; /* the ordinary step takes its lr at strata_step */
    return step_in_backward_begin(e->in_backward, args ? args->lr : 0, e->driver->loss_scale);
}

STRATA_API strata_status strata_step_begin(strata_engine *e, const strata_step_args *args)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_step_begin: engine is NULL");
    return err_copy(&e->err, step_begin(e, args));
}

/* strata_norm_pass_end: the norm pass's hand-offs done, the step decided, and the fetch order at a boundary: the
 * second backward fetches what the first did, as a step's next micro-batch would, prefetched from its start. */
static strata_status norm_pass_end(strata_engine *e, double *grad_norm)
{
    ERR_CHECK(engine_require_finalized(e, "strata_norm_pass_end"));
    if (!e->cfg.norm_pass)
        return err_set(STRATA_ESTATE, "strata_norm_pass_end: strata.norm_pass is off, so the step in backward "
                       "does not measure the norm first (without it the trainer runs one backward per step); set "
                       "strata.norm_pass to true, or do not call strata_norm_pass_end");
    double norm = -1;
    strata_status st = grads_drain(e);
    if (st == STRATA_OK)
        st = step_in_backward_norm_pass_end(e, &norm);
    if (grad_norm)
        *grad_norm = norm;
    ERR_CHECK(st);
    fetch_order_step_boundary(e->order);
    return residency_prefetch(e);
}

STRATA_API strata_status strata_norm_pass_end(strata_engine *e, double *grad_norm)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_norm_pass_end: engine is NULL");
    return err_copy(&e->err, norm_pass_end(e, grad_norm));
}

STRATA_API strata_status strata_step(strata_engine *e, const strata_step_args *args, strata_step_result *result)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_step: engine is NULL");
    strata_status st = step(e, args, result);
    /* The refusal after a failed strata_load is every rank's alike (the ranks agreed on the load's outcome): the
     * world stays usable for the load that repairs it. */
    if (!e->ckpt_incomplete)
        ranks_fail(e, st);
    return err_copy(&e->err, st);
}

STRATA_API double strata_loss_scale(const strata_engine *e)
{
    return e && e->driver ? e->driver->loss_scale : 1.0;
}

static strata_status sync(strata_engine *e)
{
    ERR_CHECK(engine_require_finalized(e, "strata_sync"));
    bool had;
    ERR_CHECK(join_delayed(e, NULL, &had));
    ERR_CHECK(step_settle(e, e->step));
    ERR_CHECK(grads_settle(e));
    ERR_CHECK(dev_stream_sync(e->h2d));
    return deferred_process(e->frees, true);
}

STRATA_API strata_status strata_sync(strata_engine *e)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_sync: engine is NULL");
    return err_copy(&e->err, sync(e));
}

/* A frozen module has no master weights: its parameters (param_dtype, the values it trains with), widened. */
static strata_status read_frozen(strata_engine *e, const reg_module *m, size_t first, size_t count, float *out)
{
    size_t pb = e->tiers.param_bytes;
    void *buf;
    if (posix_memalign(&buf, 4096, m->numel * pb) != 0)
        return err_set(STRATA_ENOMEM, "strata_param_read_master: out of memory for module \"%s\"", m->name);
    strata_status st = ranks_fetch_gathers(e)
                           ? ranks_read_params(e, m, buf)
                           : tarr_read_sync(&e->tiers.param[e->tiers.param_front], &e->tiers.env, m->offset, m->numel,
                                            buf);
    if (st == STRATA_OK)
        st = strata_convert(out, STRATA_DTYPE_FP32, (char *)buf + (first - m->offset) * pb, e->cfg.param_dtype, count);
    free(buf);
    return st;
}

static strata_status read_master(strata_engine *e, strata_param_id id, size_t offset, size_t count, float *out)
{
    ERR_CHECK(engine_require_finalized(e, "strata_param_read_master"));
    const reg_param *p = registry_find_param(e->reg, id, "strata_param_read_master");
    if (!p)
        return STRATA_ESTATE;
    if (!out || offset > p->numel || count > p->numel - offset)
        return err_set(STRATA_EINVAL, "strata_param_read_master(\"%s\"): range [%zu, %zu) is outside its %zu "
                       "elements (or out is NULL)", p->name, offset, offset + count, p->numel);
    ERR_CHECK(sync(e));
    ERR_CHECK(twin_flow_store(e, e->twin)); /* the device share's master weights are read from the host array */
    const reg_module *m = registry_module(e->reg, p->module);
    if (m->frozen)
        return read_frozen(e, m, p->offset + offset, count, out);
    if (e->world > 1 && registry_view_sharded(e->views.opt))
        return ranks_read_master(e, registry_module(e->reg, p->module), p->offset + offset, count, out);
    if (e->tiers.master.tier != STRATA_TIER_NVME)
        return tarr_read(&e->tiers.master, &e->tiers.env, p->offset + offset, count, out, NULL);
    /* NVMe reads move whole aligned blocks: read the covering block range through a buffer. */
    size_t first = (p->offset + offset) / 1024 * 1024, last = align_up(p->offset + offset + count, 1024);
    float *buf;
    /* Not a hot path: its own aligned buffer, so it never competes with the pool's planned slices. */
    if (posix_memalign((void **)&buf, 4096, (last - first) * 4) != 0)
        return err_set(STRATA_ENOMEM, "strata_param_read_master: out of memory for %zu elements", last - first);
    strata_status st = tarr_read_sync(&e->tiers.master, &e->tiers.env, first, last - first, buf);
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
