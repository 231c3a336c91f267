/*
 * The optimizer step, over sub-groups of the flat partition. For sub-group k:
 *   - its master weights, moments (and gradients, when they live on NVMe) are read into pinned slot k % 4
 *     while Adam runs on the sub-group before it, and written back from there while Adam runs on the next;
 *   - the slots outlive the step (the pool reserves them anyway), and a slot still holding sub-group k's
 *     state from the last step is not read again: the steps alternate direction, so the last four
 *     sub-groups of one step are the first four of the next (for a model of up to four sub-groups, the
 *     optimizer state is read from NVMe only once). NVMe is still written every step, so it stays the
 *     truth for checkpoints; a failed step or a strata_load forgets what the slots hold;
 *   - Adam writes the new low-precision parameters either straight into their host-tier array or into a
 *     pinned staging buffer whose finished tiles are copied to the device while later tiles compute
 *     (device tier), or which is written to NVMe after the sub-group (NVMe tier).
 * Gradient clipping and the fp16 overflow check need the global gradient norm first: a read-only
 * pre-pass, module by module in pieces of a sub-group's size, so the sum is the same whatever the placement and
 * whether the update runs here or in backward.
 * With offload_optimizer.ratio < 1 the last sub-groups are the device's (twin_flow.h): their update is queued on
 * the device before the CPU walks its own, with the same constants, and waited for after.
 * The moments are read, updated and written in their storage form (strata.optimizer_moments: step_job_moments), the
 * slots sized for it; the 8-bit form's block scales stay in host memory and are updated in place.
 */
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "base/log.h"
#include "base/util.h"
#include "cpu_adam/driver.h"
#include "engine/config/config.h"
#include "engine/engine.h"
#include "engine/plan/host_cache.h"
#include "engine/ranks/ranks.h"
#include "engine/step/step.h"
#include "engine/step/twin_flow.h"

typedef struct opt_slot {
    float *master, *grad;          /* pinned, when that state is on NVMe */
    void *m, *v;                   /* the same, in the moments' form (tiers.moments) */
    io_wait rd, wr;
    uint64_t rd_issue_ns, wr_issue_ns; /* for the trace */
} opt_slot;

typedef struct param_slot {
    void *staging;
    io_wait wr;
    dev_event *copied;
} param_slot;

/* What stays from one step to the next. */
struct step_pipeline {
    const adam_ops *adam;
    int threads;
    int64_t count;            /* updates applied (or in flight) */
    opt_slot slot[STEP_SLOTS];
    size_t holds[STEP_SLOTS]; /* the sub-group whose current state the slot holds, or NO_SUB_GROUP */
    bool acquired;            /* the slots' buffers are taken from the pool */
    bool descending;          /* the direction of the next step */
    step_consts consts;       /* the step's constants per parameter group (step_run's) */
};
#define NO_SUB_GROUP SIZE_MAX

typedef struct step_ctx {
    strata_engine *e;
    tier_array *grads;
    const uint8_t *touched;
    size_t sg, nsub;   /* nsub: every sub-group (the gradient statistics) */
    size_t ncpu;       /* the first ncpu of them: the CPU's share (the rest are the device's) */
    bool opt_nvme, grad_nvme;
    step_pipeline *sp;
    opt_slot *slot; /* sp->slot */
    size_t *holds;
    param_slot ps[2];
    tier_array *pout;
} step_ctx;

/* Tile hand-off of device-tier parameters: copy each finished tile from staging to the device. */
typedef struct tile_ctx {
    strata_engine *e;
    char *dst;
    const char *src;
    size_t elem;
    _Atomic int failed;
} tile_ctx;

static void copy_tile(size_t offset, size_t numel, void *user)
{
    tile_ctx *t = user;
    if (dev_memcpy_async(t->e->upd, t->dst + offset * t->elem, t->src + offset * t->elem, numel * t->elem) !=
        STRATA_OK)
        atomic_store(&t->failed, 1);
    atomic_fetch_add(&t->e->ctr.host_to_device, numel * t->elem);
}

static size_t sub_first(const step_ctx *c, size_t k)
{
    return k * c->sg;
}

static size_t sub_count(const step_ctx *c, size_t k)
{
    return MIN(c->sg, registry_view_numel(c->e->reg, c->e->views.opt) - sub_first(c, k));
}

/* Gradients of [first, first + count) into buf: modules that got none since the last step read as zero. */
static strata_status load_grads(step_ctx *c, size_t first, size_t count, float *buf, io_wait *w)
{
    strata_engine *e = c->e;
    size_t end = first + count, nmodules = registry_nmodules(e->reg);
    reg_view v = e->views.opt;
    for (size_t k = registry_position_at(e->reg, v, first); k < nmodules; k++) {
        strata_module_id i = registry_module_by_position(e->reg, k);
        const reg_module *m = registry_module(e->reg, i);
        size_t off = registry_view_offset(m, v);
        if (off >= end || !registry_view_count(m, v))
            break; /* past the range, or into the frozen modules, which come last */
        size_t lo = MAX(off, first), hi = MIN(off + registry_view_count(m, v), end);
        if (c->touched[i]) {
            ERR_CHECK(tarr_read(c->grads, &e->tiers.env, lo, hi - lo, buf + (lo - first), w));
        } else {
            memset(buf + (lo - first), 0, (hi - lo) * 4);
        }
    }
    return STRATA_OK;
}

/* Host gradient stores: untouched modules still hold an earlier step's sums; zero them. */
static void zero_untouched(step_ctx *c)
{
    strata_engine *e = c->e;
    for (size_t i = 0; i < registry_nmodules(e->reg); i++) {
        const reg_module *m = registry_module(e->reg, (strata_module_id)i);
        if (!c->touched[i] && !m->frozen)
            memset(tarr_host_ptr(c->grads, &e->tiers.env, registry_view_offset(m, e->views.opt)), 0,
                   registry_view_count(m, e->views.opt) * 4);
    }
}

/* Waits for a slot's write-back and traces it. */
static strata_status wait_write(strata_engine *e, opt_slot *s)
{
    bool pending = !io_wait_idle(&s->wr) || s->wr_issue_ns;
    strata_status st = io_wait_wait(&s->wr);
    if (pending && s->wr_issue_ns)
        trace_event(e->trace, TRACK_NVME, "write master/m/v", NULL, s->wr_issue_ns, s->wr.done_ns);
    s->wr_issue_ns = 0;
    return st;
}

static strata_status issue_read(step_ctx *c, size_t k)
{
    strata_engine *e = c->e;
    opt_slot *s = &c->slot[k % STEP_SLOTS];
    size_t first = sub_first(c, k), n = sub_count(c, k);
    /* The slot's previous write (four sub-groups back) must have left the buffers. */
    ERR_CHECK(wait_write(e, s));
    s->rd_issue_ns = now_ns();
    if (c->holds[k % STEP_SLOTS] != k) {
        c->holds[k % STEP_SLOTS] = NO_SUB_GROUP; /* being overwritten */
        ERR_CHECK(tarr_read(&e->tiers.master, &e->tiers.env, first, n, s->master, &s->rd));
        ERR_CHECK(tarr_read(&e->tiers.exp_avg, &e->tiers.env, first, n, s->m, &s->rd));
        ERR_CHECK(tarr_read(&e->tiers.exp_avg_sq, &e->tiers.env, first, n, s->v, &s->rd));
    }
    if (c->grad_nvme)
        ERR_CHECK(load_grads(c, first, n, s->grad, &s->rd));
    return STRATA_OK;
}

static strata_status issue_write(step_ctx *c, size_t k)
{
    strata_engine *e = c->e;
    opt_slot *s = &c->slot[k % STEP_SLOTS];
    size_t first = sub_first(c, k), n = sub_count(c, k);
    s->wr_issue_ns = now_ns();
    ERR_CHECK(tarr_write(&e->tiers.master, &e->tiers.env, first, n, s->master, &s->wr));
    ERR_CHECK(tarr_write(&e->tiers.exp_avg, &e->tiers.env, first, n, s->m, &s->wr));
    ERR_CHECK(tarr_write(&e->tiers.exp_avg_sq, &e->tiers.env, first, n, s->v, &s->wr));
    c->holds[k % STEP_SLOTS] = k; /* what it writes is the state now */
    return STRATA_OK;
}

static void release_slot_buffers(strata_engine *e, step_pipeline *sp)
{
    for (int i = 0; i < STEP_SLOTS; i++) {
        opt_slot *s = &sp->slot[i];
        void *bufs[] = {s->master, s->m, s->v, s->grad};
        for (int b = 0; b < 4; b++)
            pool_release(e->tiers.pool, bufs[b]);
        s->master = s->grad = NULL;
        s->m = s->v = NULL;
    }
    sp->acquired = false;
}

strata_status step_create(const strata_config *cfg, step_pipeline **out)
{
    step_pipeline *sp = calloc(1, sizeof *sp);
    if (!sp)
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory for the optimizer step");
    for (int i = 0; i < STEP_SLOTS; i++) {
        io_wait_init(&sp->slot[i].rd);
        io_wait_init(&sp->slot[i].wr);
        sp->holds[i] = NO_SUB_GROUP;
    }
    sp->threads = cfg->cpu_threads ? cfg->cpu_threads : adam_default_threads();
    *out = sp;
    return adam_ops_default(&sp->adam);
}

void step_destroy(strata_engine *e, step_pipeline *sp)
{
    if (!sp)
        return;
    for (int i = 0; i < STEP_SLOTS; i++) {
        io_wait_wait(&sp->slot[i].rd);
        wait_write(e, &sp->slot[i]);
        io_wait_destroy(&sp->slot[i].rd);
        io_wait_destroy(&sp->slot[i].wr);
    }
    release_slot_buffers(e, sp);
    step_consts_free(&sp->consts);
    free(sp);
}

void step_forget(step_pipeline *sp)
{
    for (int i = 0; i < STEP_SLOTS; i++)
        sp->holds[i] = NO_SUB_GROUP;
}

int64_t step_count(const step_pipeline *sp)
{
    return sp->count;
}

void step_set_count(step_pipeline *sp, int64_t count)
{
    sp->count = count;
}

/* The optimizer slots' buffers, taken at the first step and kept until the engine goes. */
static strata_status acquire_slots(step_ctx *c)
{
    strata_engine *e = c->e;
    step_pipeline *sp = c->sp;
    c->slot = sp->slot;
    c->holds = sp->holds;
    if (sp->acquired)
        return STRATA_OK;
    size_t bytes = c->sg * 4, moment_bytes = tarr_bytes(&e->tiers.exp_avg, c->sg);
    strata_status st = STRATA_OK;
    for (int i = 0; i < STEP_SLOTS && st == STRATA_OK; i++) {
        opt_slot *s = &sp->slot[i];
        if (c->opt_nvme) {
            st = pool_acquire(e->tiers.pool, POOL_STEP, bytes, "optimizer slot", (void **)&s->master);
            if (st == STRATA_OK)
                st = pool_acquire(e->tiers.pool, POOL_STEP, moment_bytes, "optimizer slot", &s->m);
            if (st == STRATA_OK)
                st = pool_acquire(e->tiers.pool, POOL_STEP, moment_bytes, "optimizer slot", &s->v);
        }
        if (c->grad_nvme && st == STRATA_OK)
            st = pool_acquire(e->tiers.pool, POOL_STEP, bytes, "gradient slot", (void **)&s->grad);
    }
    if (st != STRATA_OK) {
        release_slot_buffers(e, sp); /* all or nothing: the next step tries again */
        return st;
    }
    sp->acquired = true;
    return STRATA_OK;
}

static strata_status acquire_buffers(step_ctx *c)
{
    strata_engine *e = c->e;
    ERR_CHECK(acquire_slots(c));
    for (int i = 0; i < 2; i++) {
        io_wait_init(&c->ps[i].wr);
        ERR_CHECK(dev_event_create(e->dev, &c->ps[i].copied));
        if (c->pout->tier != STRATA_TIER_HOST)
            ERR_CHECK(pool_acquire(e->tiers.pool, POOL_STEP, c->sg * e->tiers.param_bytes, "parameter staging", &c->ps[i].staging));
    }
    return STRATA_OK;
}

strata_status step_settle(strata_engine *e, step_pipeline *sp)
{
    strata_status first = STRATA_OK, st;
    for (int i = 0; i < STEP_SLOTS; i++)
        if ((st = wait_write(e, &sp->slot[i])) != STRATA_OK && first == STRATA_OK)
            first = st;
    if (first == STRATA_OK)
        return STRATA_OK;
    /* As after a failed step: the drive did not take the write, so the mirrors drop what they share with it. */
    step_forget(sp);
    host_cache_forget(e);
    char why[ERR_MSG_BYTES];
    snprintf(why, sizeof why, "%s", err_last());
    return err_set(first, "writing back the optimizer state of the last %soptimizer step failed: %s",
                   e->cfg.delayed_update ? "delayed " : "", why);
}

/* Waits for everything still moving into the step's buffers and out of the parameter staging, then frees the
 * staging. The optimizer slots stay, and so may their write-backs: the next step waits for a slot's write before
 * it uses the slot, and whatever reads the optimizer state from NVMe between steps settles them first
 * (step_settle), so the step does not wait for the drive at its end. */
static strata_status release_buffers(step_ctx *c)
{
    strata_engine *e = c->e;
    strata_status first = STRATA_OK, st;
    for (int i = 0; c->slot && i < STEP_SLOTS; i++)
        if ((st = io_wait_wait(&c->slot[i].rd)) != STRATA_OK && first == STRATA_OK)
            first = st;
    if ((st = dev_stream_sync(e->upd)) != STRATA_OK && first == STRATA_OK)
        first = st;
    for (int i = 0; i < 2; i++) {
        if ((st = io_wait_wait(&c->ps[i].wr)) != STRATA_OK && first == STRATA_OK)
            first = st;
        io_wait_destroy(&c->ps[i].wr);
        dev_event_destroy(c->ps[i].copied);
        pool_release(e->tiers.pool, c->ps[i].staging);
    }
    return first;
}

/* The global gradient statistics, module by module in id order, each module's as the sum of its pieces' in order
 * (step_module_gradstats: the pieces a step in backward updates a module in, so that it computes the same sum from
 * its staging). Modules without gradients add nothing. */
static strata_status grad_stats(step_ctx *c, double *sumsq, bool *nonfinite)
{
    strata_engine *e = c->e;
    reg_view v = e->views.opt;
    *sumsq = 0;
    *nonfinite = false;
    for (size_t i = 0; i < registry_nmodules(e->reg); i++) {
        const reg_module *m = registry_module(e->reg, (strata_module_id)i);
        size_t off = registry_view_offset(m, v), n = registry_view_count(m, v);
        if (!c->touched[i] || !n)
            continue;
        adam_gradstats module = {0};
        for (size_t done = 0; done < n; done += c->sg) {
            size_t cnt = MIN(c->sg, n - done);
            const float *g = tarr_host_ptr(c->grads, &e->tiers.env, off + done);
            if (c->grad_nvme) {
                ERR_CHECK(load_grads(c, off + done, cnt, c->slot[0].grad, &c->slot[0].rd));
                ERR_CHECK(io_wait_wait(&c->slot[0].rd));
                g = c->slot[0].grad;
            }
            ERR_CHECK(step_piece_gradstats(e, g, STRATA_DTYPE_FP32, cnt, &module));
        }
        *sumsq += module.sumsq;
        *nonfinite |= module.nonfinite;
    }
    return STRATA_OK;
}

size_t step_piece_numel(const strata_engine *e)
{
    return MIN(align_up(e->cfg.sub_group_size, ENGINE_MODULE_ALIGN), registry_view_numel(e->reg, e->views.opt));
}

/* Pieces smaller than this are summed on the calling thread in one kernel call: an OpenMP team binding its threads
 * costs more than it saves there, and a model has many small modules (LayerNorms, biases). By size alone, so every
 * path that sums a piece sums it the same way. */
#define GRADSTATS_TEAM_MIN_NUMEL ((size_t)256 << 10)

strata_status step_piece_gradstats(strata_engine *e, const void *grad, strata_dtype dtype, size_t numel,
                                   adam_gradstats *module)
{
    adam_gradstats gs = {0};
    if (numel < GRADSTATS_TEAM_MIN_NUMEL)
        e->step->adam->gradstats(grad, dtype, 0, numel, &gs);
    else
        ERR_CHECK(adam_run_gradstats(e->step->adam, grad, dtype, numel, e->step->threads, &gs));
    module->sumsq += gs.sumsq;
    module->nonfinite |= gs.nonfinite;
    return STRATA_OK;
}

strata_status step_adam_timed(strata_engine *e, adam_job *job, const char *what, const char *place)
{
    int team = 0;
    job->team_out = &team;
    uint64_t t0 = now_ns();
    strata_status st = adam_run_step(job);
    uint64_t t1 = now_ns();
    atomic_fetch_add(&e->ctr.adam_ns, t1 - t0);
    char label[ENGINE_NAME_BYTES + 96];
    snprintf(label, sizeof label, "%s, %d thread%s", place, team, team == 1 ? "" : "s");
    trace_event(e->trace, TRACK_OPTIMIZER, what, label, t0, t1);
    return st;
}

uint32_t step_moments_key(int seed, int rank, int64_t step)
{
    return moments_sr_key((uint64_t)seed ^ ((uint64_t)rank << 32), step);
}

void step_job_moments(const strata_engine *e, size_t first, void *m, void *v, tier_array *m_scale,
                      tier_array *v_scale, int64_t step, adam_job *job)
{
    const engine_tiers *t = &e->tiers;
    job->moments = t->moments;
    if (t->moments == STRATA_MOMENTS_BF16) {
        job->bf16 = (adam_bf16_moments){m, v, step_moments_key(e->cfg.optimizer_moments_seed, e->rank, step), first};
    } else if (t->moments == STRATA_MOMENTS_8BIT) {
        job->q8 = (adam_q8_moments){m, v, tarr_host_ptr(m_scale, &t->env, first / MOMENTS_Q8_BLOCK),
                                    tarr_host_ptr(v_scale, &t->env, first / MOMENTS_Q8_BLOCK)};
    } else {
        job->arrays.exp_avg = m;
        job->arrays.exp_avg_sq = v;
    }
}

static strata_status update_sub_group(step_ctx *c, size_t k, const step_consts *consts)
{
    strata_engine *e = c->e;
    size_t first = sub_first(c, k), n = sub_count(c, k);
    opt_slot *s = &c->slot[k % STEP_SLOTS];
    param_slot *p = &c->ps[k % 2];

    /* The parameter copy is write-only here: streaming stores skip reading its cache lines. */
    adam_arrays a = {.grad_dtype = STRATA_DTYPE_FP32, .param_dtype = e->cfg.param_dtype, .stream_param = true};
    adam_job job = {.ops = c->sp->adam, .numel = n, .threads = c->sp->threads};
    step_consts_apply(consts, first, &job);
    void *m = s->m, *v = s->v;
    if (c->opt_nvme) {
        uint64_t t0 = now_ns();
        ERR_CHECK(io_wait_wait(&s->rd));
        atomic_fetch_add(&e->ctr.step_io_wait_ns, now_ns() - t0);
        trace_event(e->trace, TRACK_NVME, "read master/m/v", NULL, s->rd_issue_ns, s->rd.done_ns);
        a.master = s->master;
    } else {
        a.master = tarr_host_ptr(&e->tiers.master, &e->tiers.env, first);
        m = tarr_host_ptr(&e->tiers.exp_avg, &e->tiers.env, first);
        v = tarr_host_ptr(&e->tiers.exp_avg_sq, &e->tiers.env, first);
    }
    a.grad = c->grad_nvme ? s->grad : tarr_host_ptr(c->grads, &e->tiers.env, first);

    tile_ctx tiles = {.e = e, .elem = e->tiers.param_bytes};
    if (e->tiers.param_is_master) {
        a.param_dtype = STRATA_DTYPE_NONE; /* the master weights Adam writes are the parameters */
    } else if (c->pout->tier == STRATA_TIER_HOST) {
        a.param = tarr_host_ptr(c->pout, &e->tiers.env, first);
    } else {
        /* The staging buffer's previous sub-group must have left it. */
        ERR_CHECK(io_wait_wait(&p->wr));
        ERR_CHECK(dev_event_sync(p->copied));
        a.param = p->staging;
        if (c->pout->tier == STRATA_TIER_DEVICE) {
            tiles.dst = (char *)c->pout->mem + first * e->tiers.param_bytes;
            tiles.src = p->staging;
            job.on_tile = copy_tile;
            job.on_tile_user = &tiles;
        }
    }
    job.arrays = a;
    step_job_moments(e, first, m, v, &e->tiers.exp_avg_scale, &e->tiers.exp_avg_sq_scale, c->sp->count + 1, &job);
    char place[32];
    snprintf(place, sizeof place, "sub-group %zu", k);
    ERR_CHECK(step_adam_timed(e, &job, "adam", place));
    if (atomic_load(&tiles.failed))
        return err_set(STRATA_EDEVICE, "optimizer step: copying updated parameters of sub-group %zu to the device "
                       "failed: %s", k, err_last());
    if (c->pout->tier == STRATA_TIER_DEVICE)
        ERR_CHECK(dev_event_record(p->copied, e->upd));
    if (c->pout->tier == STRATA_TIER_NVME) {
        ERR_CHECK(tarr_write(c->pout, &e->tiers.env, first, n, p->staging, &p->wr));
    }
    if (c->opt_nvme)
        ERR_CHECK(issue_write(c, k));
    return STRATA_OK;
}

/* Sub-groups in the step's direction: position j of nsub. */
static size_t sub_at(const step_ctx *c, size_t j, bool descending)
{
    return descending ? c->ncpu - 1 - j : j;
}

static strata_status run_pipeline(step_ctx *c, const step_consts *consts)
{
    const strata_offload_config *o = &c->e->cfg.offload_optimizer;
    bool desc = c->sp->descending;
    if (c->opt_nvme && c->ncpu)
        ERR_CHECK(issue_read(c, sub_at(c, 0, desc)));
    for (size_t j = 0; j < c->ncpu; j++) {
        size_t k = sub_at(c, j, desc);
        bool more = j + 1 < c->ncpu;
        if (c->opt_nvme && more && o->pipeline_read)
            ERR_CHECK(issue_read(c, sub_at(c, j + 1, desc)));
        ERR_CHECK(update_sub_group(c, k, consts));
        if (c->opt_nvme && !o->pipeline_write)
            ERR_CHECK(wait_write(c->e, &c->slot[k % STEP_SLOTS]));
        if (c->opt_nvme && more && !o->pipeline_read)
            ERR_CHECK(issue_read(c, sub_at(c, j + 1, desc)));
    }
    c->sp->descending = !desc;
    return STRATA_OK;
}

static step_ctx ctx_of(strata_engine *e, int grad_index, int param_out)
{
    size_t numel = registry_view_numel(e->reg, e->views.opt);
    step_ctx c = {
        .e = e,
        .sp = e->step,
        .grads = ranks_step_grads(e, grad_index),
        .touched = grads_touched(e->grads, grad_index),
        .sg = step_piece_numel(e),
        .opt_nvme = e->tiers.opt_tier == STRATA_TIER_NVME,
        .grad_nvme = e->tiers.grad_tier == STRATA_TIER_NVME,
        .pout = param_out >= 0 ? ranks_step_params(e, param_out) : NULL,
    };
    c.nsub = (numel + c.sg - 1) / c.sg;
    c.ncpu = (twin_flow_cpu_numel(e->twin, numel) + c.sg - 1) / c.sg;
    return c;
}

strata_status step_grad_stats(strata_engine *e, int grad_index, double *sumsq, bool *nonfinite)
{
    step_ctx c = ctx_of(e, grad_index, -1);
    ERR_CHECK(acquire_slots(&c));
    if (!c.grad_nvme)
        zero_untouched(&c);
    return grad_stats(&c, sumsq, nonfinite);
}

strata_status step_run(strata_engine *e, const step_job *job, strata_step_result *res)
{
    step_ctx c = ctx_of(e, job->grad_index, job->param_out);
    double loss_scale = job->loss_scale;
    *res = (strata_step_result){.grad_norm = -1};

    strata_status st = acquire_buffers(&c);
    if (st == STRATA_OK && !c.grad_nvme)
        zero_untouched(&c);

    /* What the optimizer sees: the gradients as summed over the ranks, unscaled, divided by the world size for
     * strata.gradient_reduction = mean (the norm too: it is the norm of what is clipped). */
    double unscale = loss_scale * (e->cfg.gradient_reduction == STRATA_REDUCE_MEAN ? e->world : 1);
    double grad_scale = 1.0 / unscale;
    bool fp16 = e->cfg.param_dtype == STRATA_DTYPE_FP16;
    if (st == STRATA_OK && (e->cfg.gradient_clipping > 0 || fp16)) {
        double sumsq = job->sumsq;
        bool nonfinite = job->nonfinite;
        if (!job->have_stats)
            st = grad_stats(&c, &sumsq, &nonfinite);
        res->grad_norm = sqrt(sumsq) / unscale;
        if (st == STRATA_OK && nonfinite && fp16) {
            res->skipped = true; /* an overflowed fp16 step writes nothing */
            LOG_INFO(LOG_ADAM, "fp16 overflow at loss scale %g: step skipped", loss_scale);
        } else if (st == STRATA_OK && e->cfg.gradient_clipping > 0 && res->grad_norm > e->cfg.gradient_clipping) {
            grad_scale *= e->cfg.gradient_clipping / (res->grad_norm + 1e-6);
        }
    }
    if (st == STRATA_OK && !res->skipped) {
        step_consts *consts = &c.sp->consts;
        st = step_consts_fill(consts, e->groups, &e->cfg, c.sp->count + 1, grad_scale);
        if (st == STRATA_OK)
            st = twin_flow_launch(e, e->twin, c.grads, c.pout, consts);
        if (st == STRATA_OK)
            st = run_pipeline(&c, consts);
        strata_status tst = twin_flow_finish(e, e->twin, c.pout); /* waits even after a failure */
        if (st == STRATA_OK)
            st = tst;
    }
    strata_status rst = release_buffers(&c);
    if (st == STRATA_OK)
        st = rst;
    if (st != STRATA_OK) {
        step_forget(c.sp); /* a slot may hold a half-done update */
        host_cache_forget(e); /* a mirror may hold a write the drive did not take */
        return st;
    }
    grads_consumed(e->grads, job->grad_index);
    if (!res->skipped)
        c.sp->count++;
    res->step = c.sp->count;
    return STRATA_OK;
}
