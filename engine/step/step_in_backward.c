/* Step in backward: module updates during the trainer's backward; see step_in_backward.h. */
#include "engine/step/step_in_backward.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/latch.h"
#include "base/log.h"
#include "base/util.h"
#include "cpu_adam/driver.h"
#include "engine/config/config.h"
#include "engine/engine.h"
#include "engine/grads/grad_handoff.h"
#include "engine/plan/host_cache.h"
#include "engine/ranks/ranks.h"
#include "engine/step/step.h"
#include "engine/step/module_update.h"
#include "offload/accum.h"

typedef enum mod_state {
    MOD_NO_GRADS = 0, /* no gradients this step */
    MOD_PARTIAL,      /* handed over, and the fetch order brings it back: summed (fp32) in pending */
    MOD_HANDED,       /* handed over for the last time; the update waits for the module's release */
    MOD_QUEUED,       /* queued for, running or done its update */
} mod_state;

/* Where a module's gradients are for a redo (speculating only). */
typedef enum kept_at {
    KEPT_ARRAY = 0,   /* the rollback's kept array (written by the update) */
    KEPT_PENDING,     /* its fp32 sum in pending (tied weights) */
} kept_at;

struct step_in_backward {
    strata_engine *e;
    module_updater up;             /* runs each module's update, in pieces */

    /* per module */
    uint8_t *state;                /* mod_state */
    void **staging;                /* the hand-over's pinned gradients, until its update is done */
    dev_event **copied;            /* recorded on d2h after the copy into staging */
    dev_event **released;          /* recorded on compute at the release: the trainer's last read of the params */
    float **pending;               /* fp32 sums of a module handed over more than once (tied weights; with ranks,
                                      of this rank's reduced parts); kept */
    /* ranks > 1: the hand-over's gradients, widened to fp32 (full) and reduce-scattered into this rank's part on the
     * comm's thread; the worker waits for the reduce-scatter (comm_wait) and updates from the part */
    float **full, **part;
    comm_req **req;
    uint8_t *summed;               /* pending holds this step's earlier hand-overs */
    uint8_t *kept_at;              /* kept_at, for a redo */
    adam_gradstats *stats;         /* this step's gradient statistics of each module (speculating) */
    size_t nmods;

    /* gradient_clipping: the updates speculate that clipping will not trigger (step_rollback.h) */
    bool certain;                  /* speculating fails this step (an fp16 overflow, or the norm so far already exceeds
                                      the clipping threshold): the updates wait for strata_step (their gradients
                                      kept) instead of speculating */
    double partial;                /* the sum of squares of the modules handed over so far (the worker's) */
    bool overflow;                 /* one of them is not finite (the worker's) */
    uint8_t *held;                 /* per module: its update waited (certain) */

    /* strata.norm_pass: the step's first backward only measures; the second updates, decided */
    bool measuring;                /* in the norm pass (from strata_step_begin to strata_norm_pass_end) */
    adam_gradstats *measured;      /* per module: the norm pass's statistics, which the second backward must give */
    bool skip;                     /* the norm pass found an fp16 overflow: the second backward updates nothing */
    double norm;                   /* the global norm the norm pass measured */
    uint64_t pass_t0;              /* when the norm pass began */

    /* the begun step */
    bool open;
    double lr;
    double loss_scale;             /* the scale this step's gradients carry (fp16; else 1) */
    bool fixed;                    /* step and consts are set: at the step's first hand-over (a strata_load between
                                      strata_step_begin and backward changes the step count) */
    int64_t step;                  /* the update's step count (bias correction) */
    step_consts consts;            /* the updates' constants per parameter group */
    step_consts decided;           /* a speculating step's, decided from the global norm (settle_speculation) */

    /* the worker */
    pthread_t thread;
    bool started, stop, busy;
    pthread_mutex_t lock;
    pthread_cond_t work, idle;
    strata_module_id *queue;       /* ring of nmods */
    size_t head, count;
    err_latch failed;              /* the first failure of an update in this step: reported by every wait for the
                                      updates until the step closes, and the step's later updates skipped */
};

strata_status step_in_backward_check_config(const strata_engine *e)
{
    const strata_config *c = &e->cfg;
    if (c->norm_pass && !c->step_in_backward)
        return err_set(STRATA_ECONFIG, "strata.norm_pass = true with strata.step_in_backward = false: the norm pass "
                       "measures the gradient norm for the updates that run during backward, and the ordinary step "
                       "knows the norm when it runs; turn strata.step_in_backward on, or strata.norm_pass off");
    if (c->norm_pass && !(c->gradient_clipping > 0 || c->param_dtype == STRATA_DTYPE_FP16))
        return err_set(STRATA_ECONFIG, "strata.norm_pass = true without gradient_clipping or fp16: the norm pass "
                       "decides clipping (and an fp16 overflow) before the updates run, and without either there is "
                       "nothing to decide; set gradient_clipping > 0, or strata.norm_pass to false");
    if (!c->step_in_backward)
        return STRATA_OK;
    if (c->delayed_update)
        return err_set(STRATA_ECONFIG, "strata.step_in_backward = true with strata.delayed_update = true: both "
                       "overlap the optimizer with the trainer, in two ways that exclude each other; turn one off");
    if (e->world > 1 && c->zero_stage < 2)
        return err_set(STRATA_ECONFIG, "strata.step_in_backward = true with %d ranks at zero_optimization.stage = %d: "
                       "with several ranks a module's update takes this rank's part of the gradients the ranks "
                       "reduce-scatter as they are handed over, which stages 2 and 3 do (stages 0 and 1 reduce the "
                       "whole gradient store at the step, and step in backward has none); set zero_optimization.stage "
                       "to 2 or 3, or strata.step_in_backward to false", e->world, c->zero_stage);
    if (c->offload_optimizer_ratio < 1.0)
        return err_set(STRATA_ECONFIG, "strata.step_in_backward = true with zero_optimization.offload_optimizer."
                       "ratio = %g: step in backward runs every update on the CPU; set the ratio to 1 or "
                       "strata.step_in_backward to false", c->offload_optimizer_ratio);
    return STRATA_OK;
}

/* What divides the gradients the updates take, as in the ordinary step: the loss scale they carry, times the world
 * size for strata.gradient_reduction = mean. */
static double grad_unscale(const step_in_backward *s)
{
    return s->loss_scale * (s->e->cfg.gradient_reduction == STRATA_REDUCE_MEAN ? s->e->world : 1);
}

/* ---------------------------------------------------------------- one module's update */

static const grad_src NO_GRADS = {.dtype = STRATA_DTYPE_FP32}; /* zeros */

/* Whether this step's speculation is certain to fail: an fp16 gradient overflowed (the step will be skipped), or
 * clipping is certain to trigger: the sum of squares so far is a lower bound of the step's (all terms are >= 0,
 * this rank's are part of the world's; the margin covers the rounding of another summation order). */
static bool speculation_fails(const step_in_backward *s)
{
    const strata_config *c = &s->e->cfg;
    if (s->overflow)
        return c->param_dtype == STRATA_DTYPE_FP16;
    return c->gradient_clipping > 0 && sqrt(s->partial) / grad_unscale(s) > c->gradient_clipping * (1 + 1e-9);
}

/* The elements of module id's gradients an update takes: the whole module, or with ranks this rank's part. */
static size_t grad_numel(const step_in_backward *s, strata_module_id id)
{
    const reg_module *m = registry_module(s->e->reg, id);
    return s->e->world > 1 ? m->shard_numel : m->numel;
}

/* Ranks: waits for module id's reduce-scatter (this rank's part in s->part[id]) and frees its fp32 input. */
static strata_status wait_reduced(step_in_backward *s, strata_module_id id)
{
    strata_status st = comm_wait(s->req[id]);
    s->req[id] = NULL;
    free(s->full[id]);
    s->full[id] = NULL;
    return st;
}

/* strata.norm_pass: module id's statistics in the second backward must be the norm pass's, from which the step was
 * decided. */
static strata_status check_measured(const step_in_backward *s, strata_module_id id)
{
    const adam_gradstats *was = &s->measured[id], *now = &s->stats[id];
    if (memcmp(&was->sumsq, &now->sumsq, sizeof now->sumsq) == 0 && was->nonfinite == now->nonfinite)
        return STRATA_OK;
    return err_set(STRATA_ESTATE, "its gradients in the second backward are not the norm pass's (sum of squares "
                   "%.17g, the norm pass's %.17g): strata.norm_pass decides the step from the first backward, so the "
                   "second must give the same gradients bit for bit (the same batch and hand-overs, a backward "
                   "without fresh dropout or atomics); the modules updated before it are final and it and the rest "
                   "are not: load the last checkpoint, and make the backward repeatable or set strata.norm_pass to "
                   "false", now->sumsq, was->sumsq);
}

/* strata.norm_pass: a hand-over's statistics. In the norm pass they are all it gives; in the second backward they
 * must be the norm pass's before the update runs, and a step the norm pass skipped (fp16 overflow) updates nothing.
 * *update: whether the update runs. */
static strata_status norm_pass_take(step_in_backward *s, strata_module_id id, const grad_src *g, bool *update)
{
    *update = false;
    ERR_CHECK(updater_stats(&s->up, id, g->mem, g->dtype, &s->stats[id]));
    if (s->measuring || s->skip)
        return STRATA_OK;
    ERR_CHECK(check_measured(s, id));
    *update = true;
    return STRATA_OK;
}

/* The update of a handed-over module: waits for its copy off the device, updates, gives the staging back.
 * Speculating, it counts the gradients' statistics first; once they make clipping certain, the module's update
 * waits for strata_step instead (its gradients kept), where it runs once, clipped, instead of twice, and once an
 * fp16 gradient overflowed the step will be skipped: the rest are not updated at all. */
static strata_status update_handed(step_in_backward *s, strata_module_id id)
{
    strata_engine *e = s->e;
    grad_src g = {.mem = s->staging[id], .dtype = e->cfg.param_dtype, .keep = s->up.keep_grads};
    strata_status st = dev_event_sync(s->copied[id]);
    if (st == STRATA_OK && e->world > 1) {
        st = wait_reduced(s, id);
        g.mem = s->part[id], g.dtype = STRATA_DTYPE_FP32;
    }
    if (st == STRATA_OK && s->summed[id]) {
        /* The earlier hand-overs were summed before this one (on the d2h stream; with ranks, their parts): the fp32
         * sum the ordinary step's store would hold, in the same order. */
        accum_add(s->pending[id], g.mem, g.dtype, grad_numel(s, id), false);
        g = (grad_src){.mem = s->pending[id], .dtype = STRATA_DTYPE_FP32};
    }
    s->kept_at[id] = g.keep ? KEPT_ARRAY : KEPT_PENDING;
    bool update = true;
    if (st == STRATA_OK && e->cfg.norm_pass)
        st = norm_pass_take(s, id, &g, &update);
    if (st == STRATA_OK && s->up.speculate) {
        st = updater_stats(&s->up, id, g.mem, g.dtype, &s->stats[id]);
        s->partial += s->stats[id].sumsq;
        s->overflow = s->overflow || s->stats[id].nonfinite;
        s->certain = s->certain || speculation_fails(s);
    }
    s->held[id] = s->certain;
    if (st == STRATA_OK && update && s->certain)
        st = g.keep ? updater_keep(&s->up, id, &g) : STRATA_OK; /* the fp32 sums of tied weights stay in pending */
    else if (st == STRATA_OK && update)
        st = updater_run(&s->up, id, &g, &s->consts, s->released[id]);
    pool_release(e->tiers.pool, s->staging[id]);
    s->staging[id] = NULL;
    free(s->part[id]);
    s->part[id] = NULL;
    if (st != STRATA_OK)
        return err_set(st, "step in backward: the update of module \"%s\": %s", registry_module(e->reg, id)->name,
                       err_last());
    return STRATA_OK;
}

static void *worker(void *arg)
{
    step_in_backward *s = arg;
    adam_cores_use(node_adam_cores(s->e->node)); /* the teams this thread starts run on this rank's cores */
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (!s->stop && s->count == 0)
            pthread_cond_wait(&s->work, &s->lock);
        if (s->count == 0) /* stopping, nothing left */
            break;
        strata_module_id id = s->queue[s->head];
        s->head = (s->head + 1) % s->nmods;
        s->count--;
        s->busy = true;
        pthread_mutex_unlock(&s->lock);
        bool failed = err_latch_failed(&s->failed);
        /* After a failure the step is lost anyway: give the staging back without updating. */
        strata_status st = STRATA_OK;
        if (failed) {
            if (s->req[id])
                wait_reduced(s, id); /* its buffers are the comm's until it is done */
            pool_release(s->e->tiers.pool, s->staging[id]);
            s->staging[id] = NULL;
        } else {
            st = update_handed(s, id);
        }
        err_latch_set_last(&s->failed, st);
        pthread_mutex_lock(&s->lock);
        s->busy = false;
        if (s->count == 0)
            pthread_cond_broadcast(&s->idle);
    }
    s->busy = false;
    pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

/* ---------------------------------------------------------------- lifetime */

strata_status step_in_backward_create(strata_engine *e, step_in_backward **out)
{
    size_t n = registry_nmodules(e->reg);
    step_in_backward *s = calloc(1, sizeof *s);
    if (!s)
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory for step in backward");
    *out = s;
    s->e = e;
    err_latch_init(&s->failed);
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->idle, NULL);
    s->state = calloc(n, 1);
    s->staging = calloc(n, sizeof *s->staging);
    s->copied = calloc(n, sizeof *s->copied);
    s->released = calloc(n, sizeof *s->released);
    s->queue = calloc(n, sizeof *s->queue);
    s->pending = calloc(n, sizeof *s->pending);
    s->summed = calloc(n, 1);
    s->kept_at = calloc(n, 1);
    s->held = calloc(n, 1);
    s->stats = calloc(n, sizeof *s->stats);
    s->measured = calloc(n, sizeof *s->measured);
    s->full = calloc(n, sizeof *s->full);
    s->part = calloc(n, sizeof *s->part);
    s->req = calloc(n, sizeof *s->req);
    if (!s->state || !s->staging || !s->copied || !s->released || !s->queue || !s->pending || !s->summed ||
        !s->kept_at || !s->held || !s->stats || !s->measured || !s->full || !s->part || !s->req)
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory for step in backward");
    for (; s->nmods < n; s->nmods++) {
        ERR_CHECK(dev_event_create(e->dev, &s->copied[s->nmods]));
        ERR_CHECK(dev_event_create(e->dev, &s->released[s->nmods]));
    }
    ERR_CHECK(updater_create(&s->up, e));
    if (pthread_create(&s->thread, NULL, worker, s) != 0)
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: cannot start the step-in-backward thread");
    s->started = true;
    return STRATA_OK;
}

void step_in_backward_destroy(strata_engine *e, step_in_backward *s)
{
    if (!s)
        return;
    if (e->d2h)
        dev_stream_sync(e->d2h); /* hand-overs being summed use the sums and give their staging back */
    if (s->started) {
        pthread_mutex_lock(&s->lock);
        s->stop = true;
        pthread_cond_broadcast(&s->work);
        pthread_mutex_unlock(&s->lock);
        pthread_join(s->thread, NULL);
    }
    for (size_t i = 0; i < s->nmods; i++) {
        if (s->req[i]) /* reduce-scattered, never released: its buffers are the comm's until it is done */
            wait_reduced(s, (strata_module_id)i);
        free(s->full[i]);
        free(s->part[i]);
        if (s->staging[i]) { /* handed over, never released: wait for its copy before the buffer goes */
            dev_event_sync(s->copied[i]);
            pool_release(e->tiers.pool, s->staging[i]);
        }
        dev_event_destroy(s->copied[i]);
        dev_event_destroy(s->released[i]);
        free(s->pending[i]);
    }
    updater_destroy(&s->up);
    err_latch_destroy(&s->failed);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->idle);
    free(s->state);
    free(s->staging);
    free(s->copied);
    free(s->released);
    free(s->queue);
    free(s->pending);
    free(s->summed);
    free(s->kept_at);
    free(s->held);
    free(s->stats);
    free(s->measured);
    free(s->full);
    free(s->part);
    free(s->req);
    step_consts_free(&s->consts);
    step_consts_free(&s->decided);
    free(s);
}

/* ---------------------------------------------------------------- the step */
/* The step's constants, from the step count as it is when the first update needs them. */
static strata_status fix_step(step_in_backward *s)
{
    if (s->fixed)
        return STRATA_OK;
    s->step = step_count(s->e->step) + 1;
    s->up.step = s->step;
    ERR_CHECK(step_consts_fill(&s->consts, s->e->groups, &s->e->cfg, s->step, 1.0 / grad_unscale(s)));
    s->fixed = true;
    return STRATA_OK;
}

/* Before a hand-over of module id (grad_handoff_ops.admit): a step must be begun, and id's update must not have
 * started (gradient accumulation must be 1). */
static strata_status admit_hand_over(grad_handoff *h, strata_engine *e, strata_module_id id)
{
    step_in_backward *s = e->in_backward;
    const char *name = registry_module(e->reg, id)->name;
    if (!s->open)
        return err_set(STRATA_ESTATE, "strata_grads_ready(\"%s\"): strata.step_in_backward is on and no step was "
                       "begun: call strata_step_begin(engine, args) before the backward of every step", name);
    if (s->state[id] != MOD_NO_GRADS && s->state[id] != MOD_PARTIAL)
        return err_set(STRATA_ESTATE, "strata_grads_ready(\"%s\"): the module's gradients were already handed over "
                       "in this step and its update has started; with strata.step_in_backward a module's update "
                       "starts at its last hand-over of the step (the one after which the fetch order has no more "
                       "fetches of it), so gradient accumulation must be 1; a module used twice in a step (tied "
                       "weights) is handed over at each use only when the fetch order is declared "
                       "(strata_module_order) or was recorded by an earlier step", name);
    return STRATA_OK;
}

/* A hand-over the fetch order says is not the module's last: added (fp32) into its sum, on the d2h stream after
 * the copy into staging; the staging goes back to the pool. */
typedef struct sum_job {
    strata_engine *e;
    strata_module_id id;
    void *staging;
    bool first;
} sum_job;

static strata_status sum_hand_over(void *arg)
{
    sum_job *j = arg;
    strata_engine *e = j->e;
    step_in_backward *s = e->in_backward;
    const reg_module *m = registry_module(e->reg, j->id);
    accum_add(s->pending[j->id], j->staging, e->cfg.param_dtype, m->numel, j->first);
    trace_event(e->trace, TRACK_D2H, "gradients (summed for a later hand-over)", m->name, now_ns(), now_ns());
    pool_release(e->tiers.pool, j->staging);
    free(j);
    return STRATA_OK;
}

/* One rank: the hand-over is added into the module's fp32 sum on the d2h stream, after its copy. */
static strata_status queue_sum(step_in_backward *s, strata_module_id id, void *staging)
{
    sum_job *j = calloc(1, sizeof *j);
    if (!j)
        return err_set(STRATA_ENOMEM, "strata_grads_ready(\"%s\"): out of memory",
                       registry_module(s->e->reg, id)->name);
    *j = (sum_job){.e = s->e, .id = id, .staging = staging, .first = !s->summed[id]};
    strata_status st = dev_host_fn(s->e->d2h, sum_hand_over, j);
    if (st != STRATA_OK)
        free(j); /* never queued: the staging is still the caller's */
    return st;
}

/* Ranks: widens the hand-over's gradients (in staging, copied) to fp32 and starts their reduce-scatter into a part
 * of its own (the worker waits for it); a hand-over that is not the module's last is reduced at once and its part
 * summed into the module's pending sum (summed as the ordinary step's store sums the parts). The staging is given
 * back here only for the latter. */
static strata_status reduce_hand_over(step_in_backward *s, strata_module_id id, void *staging, bool last)
{
    strata_engine *e = s->e;
    const reg_module *m = registry_module(e->reg, id);
    ERR_CHECK(dev_stream_sync(e->d2h)); /* the copy into the staging */
    if (posix_memalign((void **)&s->full[id], 4096, m->numel * 4) != 0 ||
        posix_memalign((void **)&s->part[id], 4096, m->shard_numel * 4) != 0) {
        free(s->full[id]);
        s->full[id] = NULL;
        return err_set(STRATA_ENOMEM, "strata_grads_ready(\"%s\"): out of memory for its reduce-scatter (%zu fp32 "
                       "elements)", m->name, m->numel);
    }
    accum_add(s->full[id], staging, e->cfg.param_dtype, m->numel, true);
    if (last)
        return ranks_start_reduce(e, m, s->full[id], s->part[id], &s->req[id]);
    strata_status st = ranks_reduce_module(e, m, s->full[id], s->part[id]);
    if (st == STRATA_OK)
        accum_add(s->pending[id], s->part[id], STRATA_DTYPE_FP32, m->shard_numel, !s->summed[id]);
    free(s->full[id]);
    free(s->part[id]);
    s->full[id] = s->part[id] = NULL;
    if (st == STRATA_OK)
        pool_release(e->tiers.pool, staging);
    return st;
}

/* Takes a hand-over (grad_handoff_ops.take): the staging receives id's gradients on the d2h stream, queued just
 * before; it goes back to the pool once it is summed or the update is done. With ranks they are reduce-scattered
 * first. */
static strata_status take_hand_over(grad_handoff *h, strata_engine *e, const grad_staged *g)
{
    step_in_backward *s = e->in_backward;
    strata_module_id id = g->id;
    void *staging = g->staging;
    ERR_CHECK(fix_step(s));
    bool last = !fetch_order_step_fetches_again(e->order, id);
    if (!last) {
        const reg_module *m = registry_module(e->reg, id);
        size_t n = grad_numel(s, id);
        if (!s->pending[id] && posix_memalign((void **)&s->pending[id], 4096, n * 4) != 0)
            s->pending[id] = NULL;
        if (!s->pending[id])
            return err_set(STRATA_ENOMEM, "strata_grads_ready(\"%s\"): out of memory for the sum of its hand-overs "
                           "(%zu fp32 elements)", m->name, n);
    }
    if (e->world > 1)
        ERR_CHECK(reduce_hand_over(s, id, staging, last));
    if (!last) {
        if (e->world == 1)
            ERR_CHECK(queue_sum(s, id, staging));
        s->summed[id] = 1;
        s->state[id] = MOD_PARTIAL;
        return STRATA_OK;
    }
    ERR_CHECK(dev_event_record(s->copied[id], e->d2h));
    s->staging[id] = staging;
    s->state[id] = MOD_HANDED;
    return STRATA_OK;
}

strata_status step_in_backward_released(strata_engine *e, strata_module_id id)
{
    step_in_backward *s = e->in_backward;
    if (!s || s->state[id] != MOD_HANDED)
        return STRATA_OK;
    ERR_CHECK(dev_event_record(s->released[id], e->compute));
    s->state[id] = MOD_QUEUED;
    pthread_mutex_lock(&s->lock);
    s->queue[(s->head + s->count) % s->nmods] = id;
    s->count++;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->lock);
    return STRATA_OK;
}

/* Waits until no update is queued or running; the first failure of one in this step (kept: a hand-over that met it
 * while waiting for staging does not make the step's end forget it). */
static strata_status wait_updates(step_in_backward *s)
{
    pthread_mutex_lock(&s->lock);
    while (s->count > 0 || s->busy)
        pthread_cond_wait(&s->idle, &s->lock);
    pthread_mutex_unlock(&s->lock);
    return err_latch_raise(&s->failed, NULL);
}

/* grad_handoff_ops.reclaim: the updates hold the staging of their hand-overs until they are done. */
static strata_status reclaim_staging(grad_handoff *h, strata_engine *e)
{
    return wait_updates(e->in_backward);
}

bool step_in_backward_under_way(const step_in_backward *s)
{
    return s->open && s->fixed;
}

double step_in_backward_lr(const step_in_backward *s)
{
    return s->lr;
}

bool step_in_backward_open(const step_in_backward *s)
{
    return s->open;
}

strata_status step_in_backward_begin(step_in_backward *s, double lr, double loss_scale)
{
    if (s->open)
        return err_set(STRATA_ESTATE, "strata_step_begin: a step is already begun; call strata_step to finish it "
                       "before beginning the next");
    ERR_CHECK(opt_groups_freeze(s->e->groups, lr, "strata_step_begin"));
    /* Sized now, so that the hand-overs of backward never allocate them. */
    ERR_CHECK(step_consts_fill(&s->consts, s->e->groups, &s->e->cfg, 1, 1.0));
    ERR_CHECK(step_consts_fill(&s->decided, s->e->groups, &s->e->cfg, 1, 1.0));
    s->lr = opt_groups_frozen_lr(s->e->groups);
    s->loss_scale = loss_scale;
    s->fixed = false;
    s->open = true;
    s->measuring = s->e->cfg.norm_pass;
    s->pass_t0 = now_ns();
    return STRATA_OK;
}

/* The decisions of a speculating step, or of the norm pass, made as the ordinary step makes them (step.c, step_run)
 * from the global norm, the modules' statistics summed in id order: skipped (an fp16 gradient overflowed) or
 * clipped; *consts gets the step's constants with the clip factor. */
static strata_status decide(step_in_backward *s, step_consts *consts, double *grad_norm, bool *clipped, bool *skipped)
{
    strata_engine *e = s->e;
    double unscale = grad_unscale(s), grad_scale = 1.0 / unscale;
    double sumsq = 0;
    bool nonfinite = false;
    for (size_t i = 0; i < s->nmods; i++) {
        sumsq += s->stats[i].sumsq;
        nonfinite |= s->stats[i].nonfinite;
    }
    ERR_CHECK(ranks_sum_gradstats(e, &sumsq, &nonfinite)); /* this rank's parts: the world's sum */
    *grad_norm = sqrt(sumsq) / unscale;
    *skipped = nonfinite && e->cfg.param_dtype == STRATA_DTYPE_FP16;
    *clipped = !*skipped && e->cfg.gradient_clipping > 0 && *grad_norm > e->cfg.gradient_clipping;
    if (*clipped)
        grad_scale *= e->cfg.gradient_clipping / (*grad_norm + 1e-6);
    return step_consts_fill(consts, e->groups, &e->cfg, s->step, grad_scale);
}

/* Clipping triggered: every update that ran in backward runs again from the front copy with the clipped
 * gradients (the kept ones, or the fp32 sums of tied weights), on this thread, and so do those that waited for it
 * (certain). Counted as a redone step. */
static strata_status redo_updates(step_in_backward *s, const step_consts *consts)
{
    strata_engine *e = s->e;
    uint64_t t0 = now_ns(), bytes0 = atomic_load(&e->tiers.ctr.nvme_read_bytes) +
                                     atomic_load(&e->tiers.ctr.nvme_write_bytes);
    strata_status st = STRATA_OK;
    for (size_t i = 0; st == STRATA_OK && i < s->nmods; i++) {
        if (s->state[i] != MOD_QUEUED)
            continue;
        grad_src g = s->kept_at[i] == KEPT_PENDING ? (grad_src){.mem = s->pending[i], .dtype = STRATA_DTYPE_FP32}
                                                   : (grad_src){.from_kept = true, .dtype = s->up.kept_dtype};
        st = updater_run(&s->up, (strata_module_id)i, &g, consts, s->released[i]);
        if (st != STRATA_OK)
            st = err_set(st, "strata_step: gradient clipping triggered and the redo of module \"%s\"'s update "
                         "failed: %s", registry_module(e->reg, (strata_module_id)i)->name, err_last());
    }
    uint64_t t1 = now_ns();
    atomic_fetch_add(&e->ctr.steps_redone, 1);
    atomic_fetch_add(&e->ctr.redo_ns, t1 - t0);
    atomic_fetch_add(&e->ctr.redo_nvme_bytes, atomic_load(&e->tiers.ctr.nvme_read_bytes) +
                                              atomic_load(&e->tiers.ctr.nvme_write_bytes) - bytes0);
    trace_event(e->trace, TRACK_OPTIMIZER, "redo (clipping triggered)", NULL, t0, t1);
    return st;
}

/* A skipped fp16 step writes nothing: the parameters the updates in backward wrote are put back. */
static strata_status undo_params(step_in_backward *s)
{
    strata_engine *e = s->e;
    for (size_t i = 0; i < s->nmods; i++) {
        if (s->state[i] != MOD_QUEUED || s->held[i])
            continue;
        strata_status st = updater_restore_params(&s->up, (strata_module_id)i);
        if (st != STRATA_OK)
            return err_set(st, "strata_step: an fp16 gradient overflowed, and putting back the parameters of module "
                           "\"%s\" failed: %s", registry_module(e->reg, (strata_module_id)i)->name, err_last());
    }
    LOG_INFO(LOG_ADAM, "fp16 overflow at loss scale %g: step skipped (the updates made in backward undone)",
             s->loss_scale);
    return STRATA_OK;
}

/* Speculating, once every update of backward is done: the modules handed over but never for the last time count
 * too; the step decided; the updates undone when it is skipped, redone when clipping triggered. *consts: the
 * step's constants from here on. */
static strata_status settle_speculation(step_in_backward *s, step_consts *consts, double *grad_norm, bool *skipped)
{
    for (size_t i = 0; i < s->nmods; i++)
        if (s->state[i] == MOD_PARTIAL)
            ERR_CHECK(updater_stats(&s->up, (strata_module_id)i, s->pending[i], STRATA_DTYPE_FP32,
                                    &s->stats[i]));
    bool clipped;
    ERR_CHECK(decide(s, consts, grad_norm, &clipped, skipped));
    if (*skipped)
        return undo_params(s);
    /* Modules held back because clipping was certain are updated here even if (against the bound) it is not. */
    if (!clipped && !s->certain)
        return STRATA_OK;
    LOG_INFO(LOG_ADAM, "step %lld: gradient norm %g > gradient_clipping %g: the updates made in backward are redone "
             "clipped", (long long)s->step, *grad_norm, s->e->cfg.gradient_clipping);
    return redo_updates(s, consts);
}

/* The step is over (or, after the norm pass, its second backward begins): no module handed over, no statistics. */
static void clear_modules(step_in_backward *s)
{
    memset(s->state, 0, s->nmods);
    memset(s->summed, 0, s->nmods);
    memset(s->stats, 0, s->nmods * sizeof *s->stats);
    memset(s->held, 0, s->nmods);
    s->partial = 0;
    s->certain = s->overflow = false;
}

static void close_step(step_in_backward *s)
{
    clear_modules(s);
    s->open = s->measuring = s->skip = false;
    err_latch_take_copy(&s->failed, NULL, 0); /* reported by the call that closed it */
}

/* The norm pass's end, once its hand-offs are done: the modules handed over but never for the last time count too;
 * the step decided (with ranks, the collective of the world's norm); the second backward begins. */
static strata_status end_norm_pass(step_in_backward *s, double *grad_norm)
{
    strata_engine *e = s->e;
    ERR_CHECK(fix_step(s)); /* a norm pass without hand-overs */
    ERR_CHECK(wait_updates(s));
    for (size_t i = 0; i < s->nmods; i++)
        if (s->state[i] == MOD_PARTIAL)
            ERR_CHECK(updater_stats(&s->up, (strata_module_id)i, s->pending[i], STRATA_DTYPE_FP32, &s->stats[i]));
    bool clipped;
    ERR_CHECK(decide(s, &s->consts, &s->norm, &clipped, &s->skip));
    if (clipped)
        LOG_INFO(LOG_ADAM, "step %lld: gradient norm %g > gradient_clipping %g (norm pass): the updates run clipped",
                 (long long)s->step, s->norm, e->cfg.gradient_clipping);
    memcpy(s->measured, s->stats, s->nmods * sizeof *s->stats);
    clear_modules(s);
    s->measuring = false;
    *grad_norm = s->norm;
    uint64_t t1 = now_ns();
    atomic_fetch_add(&e->ctr.norm_passes, 1);
    atomic_fetch_add(&e->ctr.norm_pass_ns, t1 - s->pass_t0);
    trace_event(e->trace, TRACK_TRAINER, "norm pass (forward and backward, measured)", NULL, s->pass_t0, t1);
    return STRATA_OK;
}

strata_status step_in_backward_norm_pass_end(strata_engine *e, double *grad_norm)
{
    step_in_backward *s = e->in_backward;
    if (!s->open)
        return err_set(STRATA_ESTATE, "strata_norm_pass_end: no step was begun: call strata_step_begin, then the "
                       "norm pass's forward and backward, then strata_norm_pass_end");
    if (!s->measuring)
        return err_set(STRATA_ESTATE, "strata_norm_pass_end: this step's norm pass already ended: run the second "
                       "forward and backward, then strata_step");
    strata_status st = end_norm_pass(s, grad_norm);
    if (st != STRATA_OK) /* the step is lost: the next strata_step_begin begins another */
        close_step(s);
    return st;
}

/* strata.norm_pass: the modules the second backward's hand-overs did not check (those without a last hand-over, or
 * without any) must match the norm pass too. */
static strata_status check_unhanded(step_in_backward *s)
{
    for (size_t i = 0; i < s->nmods; i++) {
        if (s->state[i] == MOD_QUEUED)
            continue; /* checked before its update */
        if (s->state[i] == MOD_PARTIAL)
            ERR_CHECK(updater_stats(&s->up, (strata_module_id)i, s->pending[i], STRATA_DTYPE_FP32, &s->stats[i]));
        if (check_measured(s, (strata_module_id)i) != STRATA_OK)
            return err_set(STRATA_ESTATE, "strata_step: module \"%s\": %s",
                           registry_module(s->e->reg, (strata_module_id)i)->name, err_last());
    }
    return STRATA_OK;
}

strata_status step_in_backward_finish(strata_engine *e, const strata_step_args *args, double *grad_norm,
                                      bool *skipped)
{
    step_in_backward *s = e->in_backward;
    *grad_norm = -1;
    *skipped = false;
    if (!s->open)
        return err_set(STRATA_ESTATE, "strata_step: strata.step_in_backward is on and the step was not begun: call "
                       "strata_step_begin(engine, args) before the backward of every step");
    if (args && args->lr > 0 && args->lr != s->lr)
        return err_set(STRATA_EINVAL, "strata_step: lr = %.17g, but strata_step_begin began this step with lr = "
                       "%.17g, and with strata.step_in_backward the updates ran with it; pass the same lr (or 0, or "
                       "NULL args) to strata_step", args->lr, s->lr);
    if (s->measuring)
        return err_set(STRATA_ESTATE, "strata_step: strata.norm_pass is on and this step's norm pass did not end: "
                       "call strata_norm_pass_end after the step's first forward and backward, then run them again");
    strata_status st = fix_step(s);
    if (st == STRATA_OK)
        st = wait_updates(s);
    const step_consts *consts = &s->consts;
    if (st == STRATA_OK && s->up.speculate) {
        st = settle_speculation(s, &s->decided, grad_norm, skipped);
        consts = &s->decided;
    }
    if (e->cfg.norm_pass) {
        *grad_norm = s->norm;
        *skipped = s->skip;
        if (st == STRATA_OK && !s->skip)
            st = check_unhanded(s);
    }
    /* Modules that got no gradients are updated with zero gradients, as the ordinary step updates them. */
    for (size_t i = 0; st == STRATA_OK && !*skipped && i < s->nmods; i++) {
        grad_src partial = {.mem = s->pending[i], .dtype = STRATA_DTYPE_FP32};
        if (s->state[i] == MOD_PARTIAL) /* the order promised another hand-over that never came */
            st = updater_run(&s->up, (strata_module_id)i, &partial, consts, s->released[i]);
        else if (s->state[i] == MOD_NO_GRADS)
            st = updater_run(&s->up, (strata_module_id)i, &NO_GRADS, consts, s->released[i]);
        else
            continue;
        if (st != STRATA_OK)
            st = err_set(st, "strata_step: the update of module \"%s\" (no last hand-over this step): %s",
                         registry_module(e->reg, (strata_module_id)i)->name, err_last());
    }
    close_step(s);
    if (st != STRATA_OK) {
        host_cache_forget(e); /* a mirror may hold a write the drive did not take */
        return st;
    }
    if (*skipped)
        return STRATA_OK; /* the front copy stays the optimizer state; the step count stands */
    if (s->up.speculate)
        rollback_commit(&s->up.rb, &e->tiers);
    step_set_count(e->step, s->step);
    return STRATA_OK;
}

/* ---------------------------------------------------------------- the gradient hand-off */

static void destroy_handoff(grad_handoff *h, strata_engine *e)
{
    free(h);
}

/* No store: the module's update takes the staging (the worker's failures are reclaim's to report). */
static const grad_handoff_ops in_backward_ops = {
    .uses_store = false,
    .admit = admit_hand_over,
    .take = take_hand_over,
    .reclaim = reclaim_staging,
    .destroy = destroy_handoff,
};

strata_status grad_in_backward_create(strata_engine *e, grad_handoff **out)
{
    grad_handoff *h = calloc(1, sizeof *h);
    if (!h)
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory for step in backward");
    h->ops = &in_backward_ops;
    *out = h;
    return STRATA_OK;
}
