/* Step in backward: module updates during the trainer's backward; see step_in_backward.h. */
#include "engine/step/step_in_backward.h"

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
#include "engine/step/step.h"
#include "offload/accum.h"

typedef enum mod_state {
    MOD_NO_GRADS = 0, /* no gradients this step */
    MOD_PARTIAL,      /* handed over, and the fetch order brings it back: summed (fp32) in pending */
    MOD_HANDED,       /* handed over for the last time; the update waits for the module's release */
    MOD_QUEUED,       /* queued for, running or done its update */
} mod_state;

struct step_in_backward {
    strata_engine *e;
    const adam_ops *adam;
    int threads;
    size_t chunk;                  /* elements per update piece: the optimizer sub-group (what POOL_STEP holds) */

    /* per module */
    uint8_t *state;                /* mod_state */
    void **staging;                /* the hand-over's pinned gradients, until its update is done */
    dev_event **copied;            /* recorded on d2h after the copy into staging */
    dev_event **released;          /* recorded on compute at the release: the trainer's last read of the params */
    float **pending;               /* fp32 sums of a module handed over more than once (tied weights); kept */
    uint8_t *summed;               /* pending holds this step's earlier hand-overs */
    size_t nmods;

    /* the begun step */
    bool open;
    double lr;
    bool fixed;                    /* step and consts are set: at the step's first hand-over (a strata_load between
                                      strata_step_begin and backward changes the step count) */
    int64_t step;                  /* the update's step count (bias correction) */
    adam_consts consts;

    /* NVMe buffers (POOL_STEP, the step pipeline's slice, which this mode never uses otherwise) */
    float *master, *m, *v;
    void *pstage;                  /* updated parameters on their way to a device or NVMe home */
    float *zeros;                  /* fp32 zero gradients of one chunk, for modules without gradients */

    /* the worker */
    pthread_t thread;
    bool started, stop, busy;
    pthread_mutex_t lock;
    pthread_cond_t work, idle;
    strata_module_id *queue;       /* ring of nmods */
    size_t head, count;
    err_latch failed;              /* the first failure of an update, until wait_updates reports it */
};

strata_status step_in_backward_check_config(const strata_engine *e)
{
    const strata_config *c = &e->cfg;
    if (c->gradient_clipping > 0)
        return err_set(STRATA_ECONFIG, "strata.step_in_backward = true with gradient_clipping = %g: clipping scales "
                       "every update by the global gradient norm, which is known only at the end of backward, after "
                       "the updates have run; set gradient_clipping to 0 or strata.step_in_backward to false",
                       c->gradient_clipping);
    if (c->param_dtype == STRATA_DTYPE_FP16)
        return err_set(STRATA_ECONFIG, "strata.step_in_backward = true with fp16.enabled = true: an fp16 step is "
                       "skipped when any gradient overflowed, which is known only at the end of backward, after the "
                       "updates have run; use bf16 or fp32, or set strata.step_in_backward to false");
    if (c->delayed_update)
        return err_set(STRATA_ECONFIG, "strata.step_in_backward = true with strata.delayed_update = true: both "
                       "overlap the optimizer with the trainer, in two ways that exclude each other; turn one off");
    if (e->world > 1)
        return err_set(STRATA_ECONFIG, "strata.step_in_backward = true with %d ranks: the ranks' gradients are "
                       "reduced before an update, which step in backward does not do yet; it runs with one rank only",
                       e->world);
    if (c->offload_optimizer_ratio < 1.0)
        return err_set(STRATA_ECONFIG, "strata.step_in_backward = true with zero_optimization.offload_optimizer."
                       "ratio = %g: step in backward runs every update on the CPU; set the ratio to 1 or "
                       "strata.step_in_backward to false", c->offload_optimizer_ratio);
    if (c->optimizer_moments != STRATA_MOMENTS_FP32)
        return err_set(STRATA_ECONFIG, "strata.step_in_backward = true with strata.optimizer_moments = \"%s\": step "
                       "in backward keeps fp32 moments only; set strata.optimizer_moments to \"fp32\" or "
                       "strata.step_in_backward to false", cfg_moments_name(c->optimizer_moments));
    return STRATA_OK;
}

/* ---------------------------------------------------------------- one module's update */

/* Updates module id from grad (grad_dtype; NULL: zeros) in pieces of s->chunk elements: master/m/v in place (or
 * read into and written back from pinned buffers on NVMe), the new parameters into their home. Runs on the
 * worker, or on the trainer's thread at strata_step for modules without gradients. */
static strata_status update_module(step_in_backward *s, strata_module_id id, const void *grad, strata_dtype grad_dtype)
{
    strata_engine *e = s->e;
    engine_tiers *t = &e->tiers;
    const reg_module *m = registry_module(e->reg, id);
    tier_array *pout = &t->param[t->param_front];
    bool opt_nvme = t->opt_tier == STRATA_TIER_NVME;
    size_t gbytes = strata_dtype_bytes(grad_dtype), pb = t->param_bytes;
    size_t off = registry_view_offset(m, e->views.opt), n = registry_view_count(m, e->views.opt);
    /* The device copy the trainer read must be done with before the new parameters land where it lies. */
    if (pout->tier == STRATA_TIER_DEVICE)
        ERR_CHECK(dev_stream_wait_event(e->upd, s->released[id]));
    for (size_t done = 0; done < n;) {
        size_t cnt = MIN(s->chunk, n - done), first = off + done;
        adam_arrays a = {.grad = grad ? (const void *)((const char *)grad + done * gbytes) : (const void *)s->zeros,
                         .grad_dtype = grad ? grad_dtype : STRATA_DTYPE_FP32,
                         .param_dtype = e->cfg.param_dtype, .stream_param = true};
        if (opt_nvme) {
            io_wait w;
            io_wait_init(&w);
            uint64_t t0 = now_ns();
            strata_status st = tarr_read(&t->master, &t->env, first, cnt, s->master, &w);
            if (st == STRATA_OK)
                st = tarr_read(&t->exp_avg, &t->env, first, cnt, s->m, &w);
            if (st == STRATA_OK)
                st = tarr_read(&t->exp_avg_sq, &t->env, first, cnt, s->v, &w);
            strata_status wst = io_wait_wait(&w);
            io_wait_destroy(&w);
            atomic_fetch_add(&e->ctr.step_io_wait_ns, now_ns() - t0);
            trace_event(e->trace, TRACK_NVME, "read master/m/v", m->name, t0, now_ns());
            ERR_CHECK(st != STRATA_OK ? st : wst);
            a.master = s->master, a.exp_avg = s->m, a.exp_avg_sq = s->v;
        } else {
            a.master = tarr_host_ptr(&t->master, &t->env, first);
            a.exp_avg = tarr_host_ptr(&t->exp_avg, &t->env, first);
            a.exp_avg_sq = tarr_host_ptr(&t->exp_avg_sq, &t->env, first);
        }
        a.param = pout->tier == STRATA_TIER_HOST ? tarr_host_ptr(pout, &t->env, first) : s->pstage;
        adam_job job = {.ops = s->adam, .consts = s->consts, .arrays = a, .numel = cnt, .threads = s->threads};
        char place[ENGINE_NAME_BYTES + 64];
        snprintf(place, sizeof place, "%s [%zu, %zu)", m->name, done, done + cnt);
        ERR_CHECK(step_adam_timed(e, &job, "adam (in backward)", place));
        if (pout->tier == STRATA_TIER_DEVICE) {
            uint64_t t1 = now_ns();
            ERR_CHECK(dev_memcpy_async(e->upd, (char *)pout->mem + first * pb, s->pstage, cnt * pb));
            ERR_CHECK(dev_stream_sync(e->upd)); /* pstage is used again by the next piece */
            atomic_fetch_add(&e->ctr.host_to_device, cnt * pb);
            trace_event(e->trace, TRACK_UPDATE, "parameters", m->name, t1, now_ns());
        } else if (pout->tier == STRATA_TIER_NVME) {
            ERR_CHECK(tarr_write_sync(pout, &t->env, first, cnt, s->pstage));
        }
        if (opt_nvme) {
            io_wait w;
            io_wait_init(&w);
            uint64_t w0 = now_ns();
            strata_status st = tarr_write(&t->master, &t->env, first, cnt, s->master, &w);
            if (st == STRATA_OK)
                st = tarr_write(&t->exp_avg, &t->env, first, cnt, s->m, &w);
            if (st == STRATA_OK)
                st = tarr_write(&t->exp_avg_sq, &t->env, first, cnt, s->v, &w);
            strata_status wst = io_wait_wait(&w);
            io_wait_destroy(&w);
            trace_event(e->trace, TRACK_NVME, "write master/m/v", m->name, w0, now_ns());
            ERR_CHECK(st != STRATA_OK ? st : wst);
        }
        done += cnt;
    }
    return STRATA_OK;
}

/* The update of a handed-over module: waits for its copy off the device, updates, gives the staging back. */
static strata_status update_handed(step_in_backward *s, strata_module_id id)
{
    strata_engine *e = s->e;
    strata_status st = dev_event_sync(s->copied[id]);
    if (st == STRATA_OK && s->summed[id]) {
        /* The earlier hand-overs were summed on the d2h stream, before this one's copy: the fp32 sum the ordinary
         * step's store would hold, in the same order. */
        const reg_module *m = registry_module(e->reg, id);
        accum_add(s->pending[id], s->staging[id], e->cfg.param_dtype, m->numel, false);
        st = update_module(s, id, s->pending[id], STRATA_DTYPE_FP32);
    } else if (st == STRATA_OK) {
        st = update_module(s, id, s->staging[id], e->cfg.param_dtype);
    }
    pool_release(e->tiers.pool, s->staging[id]);
    s->staging[id] = NULL;
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
    size_t n = registry_nmodules(e->reg), numel = registry_view_numel(e->reg, e->views.opt);
    step_in_backward *s = calloc(1, sizeof *s);
    if (!s)
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory for step in backward");
    *out = s;
    s->e = e;
    err_latch_init(&s->failed);
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->idle, NULL);
    s->threads = e->cfg.cpu_threads ? e->cfg.cpu_threads : adam_default_threads();
    s->chunk = MIN(align_up(e->cfg.sub_group_size, ENGINE_MODULE_ALIGN), numel);
    s->state = calloc(n, 1);
    s->staging = calloc(n, sizeof *s->staging);
    s->copied = calloc(n, sizeof *s->copied);
    s->released = calloc(n, sizeof *s->released);
    s->queue = calloc(n, sizeof *s->queue);
    s->pending = calloc(n, sizeof *s->pending);
    s->summed = calloc(n, 1);
    if (!s->state || !s->staging || !s->copied || !s->released || !s->queue || !s->pending || !s->summed ||
        posix_memalign((void **)&s->zeros, 4096, s->chunk * 4) != 0) {
        s->zeros = NULL;
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory for step in backward");
    }
    memset(s->zeros, 0, s->chunk * 4);
    for (; s->nmods < n; s->nmods++) {
        ERR_CHECK(dev_event_create(e->dev, &s->copied[s->nmods]));
        ERR_CHECK(dev_event_create(e->dev, &s->released[s->nmods]));
    }
    ERR_CHECK(adam_ops_default(&s->adam));
    size_t bytes = s->chunk * 4;
    if (e->tiers.opt_tier == STRATA_TIER_NVME) {
        ERR_CHECK(pool_acquire(e->tiers.pool, POOL_STEP, bytes, "step in backward: master weights", (void **)&s->master));
        ERR_CHECK(pool_acquire(e->tiers.pool, POOL_STEP, bytes, "step in backward: exp_avg", (void **)&s->m));
        ERR_CHECK(pool_acquire(e->tiers.pool, POOL_STEP, bytes, "step in backward: exp_avg_sq", (void **)&s->v));
    }
    if (e->tiers.param_tier != STRATA_TIER_HOST)
        ERR_CHECK(pool_acquire(e->tiers.pool, POOL_STEP, s->chunk * e->tiers.param_bytes,
                               "step in backward: parameter staging", &s->pstage));
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
        if (s->staging[i]) { /* handed over, never released: wait for its copy before the buffer goes */
            dev_event_sync(s->copied[i]);
            pool_release(e->tiers.pool, s->staging[i]);
        }
        dev_event_destroy(s->copied[i]);
        dev_event_destroy(s->released[i]);
        free(s->pending[i]);
    }
    if (e->tiers.pool) {
        pool_release(e->tiers.pool, s->master);
        pool_release(e->tiers.pool, s->m);
        pool_release(e->tiers.pool, s->v);
        pool_release(e->tiers.pool, s->pstage);
    }
    err_latch_destroy(&s->failed);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->idle);
    free(s->zeros);
    free(s->state);
    free(s->staging);
    free(s->copied);
    free(s->released);
    free(s->queue);
    free(s->pending);
    free(s->summed);
    free(s);
}

/* ---------------------------------------------------------------- the step */
/* The step's constants, from the step count as it is when the first update needs them. */
static void fix_step(step_in_backward *s)
{
    if (s->fixed)
        return;
    s->step = step_count(s->e->step) + 1;
    strata_adam_hparams hp = cfg_adam_hparams(&s->e->cfg, s->lr);
    adam_consts_init(&s->consts, &hp, s->step, 1.0); /* no loss scale: fp16 is refused */
    s->fixed = true;
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

/* Takes a hand-over (grad_handoff_ops.take): the staging receives id's gradients on the d2h stream, queued just
 * before; it goes back to the pool once it is summed or the update is done. */
static strata_status take_hand_over(grad_handoff *h, strata_engine *e, const grad_staged *g)
{
    step_in_backward *s = e->in_backward;
    strata_module_id id = g->id;
    void *staging = g->staging;
    fix_step(s);
    if (fetch_order_step_fetches_again(e->order, id)) {
        const reg_module *m = registry_module(e->reg, id);
        sum_job *j = calloc(1, sizeof *j);
        if (!s->pending[id] && posix_memalign((void **)&s->pending[id], 4096, m->numel * 4) != 0)
            s->pending[id] = NULL;
        if (!j || !s->pending[id]) {
            free(j);
            return err_set(STRATA_ENOMEM, "strata_grads_ready(\"%s\"): out of memory for the sum of its hand-overs "
                           "(%zu fp32 elements)", m->name, m->numel);
        }
        *j = (sum_job){.e = e, .id = id, .staging = staging, .first = !s->summed[id]};
        strata_status st = dev_host_fn(e->d2h, sum_hand_over, j);
        if (st != STRATA_OK) {
            free(j); /* never queued: the staging is still the caller's */
            return st;
        }
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

/* Waits until no update is queued or running; the first failure of one since the last call. */
static strata_status wait_updates(step_in_backward *s)
{
    pthread_mutex_lock(&s->lock);
    while (s->count > 0 || s->busy)
        pthread_cond_wait(&s->idle, &s->lock);
    pthread_mutex_unlock(&s->lock);
    return err_latch_take(&s->failed, NULL);
}

/* grad_handoff_ops.reclaim: the updates hold the staging of their hand-overs until they are done. */
static strata_status reclaim_staging(grad_handoff *h, strata_engine *e)
{
    return wait_updates(e->in_backward);
}

strata_status step_in_backward_begin(step_in_backward *s, double lr)
{
    if (s->open)
        return err_set(STRATA_ESTATE, "strata_step_begin: a step is already begun; call strata_step to finish it "
                       "before beginning the next");
    s->lr = lr;
    s->fixed = false;
    s->open = true;
    return STRATA_OK;
}

strata_status step_in_backward_finish(strata_engine *e, const strata_step_args *args)
{
    step_in_backward *s = e->in_backward;
    if (!s->open)
        return err_set(STRATA_ESTATE, "strata_step: strata.step_in_backward is on and the step was not begun: call "
                       "strata_step_begin(engine, args) before the backward of every step");
    if (args && args->lr > 0 && args->lr != s->lr)
        return err_set(STRATA_EINVAL, "strata_step: lr = %.17g, but strata_step_begin began this step with lr = "
                       "%.17g, and with strata.step_in_backward the updates ran with it; pass the same lr (or 0, or "
                       "NULL args) to strata_step", args->lr, s->lr);
    fix_step(s);
    strata_status st = wait_updates(s);
    /* Modules that got no gradients are updated with zero gradients, as the ordinary step updates them. */
    for (size_t i = 0; st == STRATA_OK && i < s->nmods; i++) {
        if (s->state[i] == MOD_PARTIAL) /* the order promised another hand-over that never came */
            st = update_module(s, (strata_module_id)i, s->pending[i], STRATA_DTYPE_FP32);
        else if (s->state[i] == MOD_NO_GRADS)
            st = update_module(s, (strata_module_id)i, NULL, STRATA_DTYPE_FP32);
        else
            continue;
        if (st != STRATA_OK)
            st = err_set(st, "strata_step: the update of module \"%s\" (no last hand-over this step): %s",
                         registry_module(e->reg, (strata_module_id)i)->name, err_last());
    }
    memset(s->state, 0, s->nmods);
    memset(s->summed, 0, s->nmods);
    s->open = false;
    if (st != STRATA_OK) {
        host_cache_forget(e); /* a mirror may hold a write the drive did not take */
        return st;
    }
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
