/*
 * strata_engine_finalize(): lay out the flat partition, prove the plan fits the budgets, open the
 * tiers, and write the initial state through the trainer's init callbacks, chunk by chunk, straight
 * into each state's tier (so a model larger than RAM never needs to fit in RAM).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/size.h"
#include "base/util.h"
#include "cpu_adam/convert.h"
#include "cpu_adam/driver.h"
#include "engine/engine.h"
#include "engine/plan.h"

#define INIT_CHUNK_NUMEL ((size_t)1 << 20) /* a multiple of ENGINE_MODULE_ALIGN */

static strata_status layout(strata_engine *e)
{
    size_t most = 1;
    for (size_t i = 0; i < e->nmodules; i++)
        most = MAX(most, e->modules[i].nparams);
    size_t *sizes = malloc(most * sizeof *sizes), *offs = malloc(most * sizeof *offs);
    if (!sizes || !offs) {
        free(sizes);
        free(offs);
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory for the layout");
    }
    size_t pos = 0;
    e->largest_module_numel = 0;
    for (size_t i = 0; i < e->nmodules; i++) {
        eng_module *m = &e->modules[i];
        m->offset = pos;
        for (size_t j = 0; j < m->nparams; j++)
            sizes[j] = e->params[m->params[j]].numel;
        m->numel = plan_module_layout(sizes, m->nparams, offs, &m->used_numel);
        for (size_t j = 0; j < m->nparams; j++)
            e->params[m->params[j]].offset = pos + offs[j];
        m->persistent = m->used_numel < e->cfg.param_persistence_threshold;
        pos += m->numel;
        e->largest_module_numel = MAX(e->largest_module_numel, m->numel);
    }
    e->total_numel = pos;
    free(sizes);
    free(offs);
    return STRATA_OK;
}

static void plan_input_of(const strata_engine *e, plan_input *in)
{
    *in = (plan_input){
        .total_numel = e->total_numel,
        .largest_module_numel = e->largest_module_numel,
        .param_bytes = e->param_bytes,
        .param_tier = e->param_tier,
        .opt_tier = e->opt_tier,
        .grad_tier = e->grad_tier,
        .delayed = e->cfg.delayed_update,
        .sub_group_numel = align_up(e->cfg.sub_group_size, ENGINE_MODULE_ALIGN),
        .prefetch_bytes = e->prefetch_bytes,
        .max_live_bytes = e->max_live_bytes,
        .activation_bytes = e->cfg.activation_bytes,
    };
}

static strata_status open_nvme(strata_engine *e, size_t capacity)
{
    const char *paths[PLAN_MAX_SWAP_PATHS];
    int n = plan_swap_paths(&e->cfg, paths);
    ERR_CHECK(nvme_io_create(&e->cfg.aio, &e->io));
    ERR_CHECK(swap_create(e->io, paths, n, capacity, &e->swap));
    swap_set_checksum(e->swap, e->cfg.swap_checksum);
    return STRATA_OK;
}

/* Fills one chunk [first, first + count) of fp32 initial values, calling each parameter's init
 * for the part of it inside the chunk; padding is zero. */
static strata_status fill_chunk(strata_engine *e, size_t first, size_t count, float *out, size_t *param_cursor)
{
    memset(out, 0, count * sizeof *out);
    size_t end = first + count;
    while (*param_cursor < e->nparams) {
        eng_param *p = &e->params[*param_cursor];
        if (p->offset >= end)
            break;
        size_t lo = MAX(p->offset, first), hi = MIN(p->offset + p->numel, end);
        if (p->init && hi > lo) {
            strata_status st = p->init(p->init_ctx, (strata_param_id)*param_cursor, lo - p->offset, hi - lo,
                                       out + (lo - first));
            if (st != STRATA_OK)
                return err_set(st == STRATA_OK ? STRATA_EINVAL : st,
                               "init of parameter \"%s.%s\" failed at elements [%zu, %zu): %s",
                               e->modules[p->module].name, p->name, lo - p->offset, hi - p->offset,
                               err_last()[0] ? err_last() : strata_status_str(st));
        }
        if (p->offset + p->numel > end)
            break; /* continues in the next chunk */
        (*param_cursor)++;
    }
    return STRATA_OK;
}

static void to_param_dtype(const float *src, void *dst, strata_dtype dtype, size_t n)
{
    if (dtype == STRATA_DTYPE_FP32) {
        memcpy(dst, src, n * sizeof *src);
        return;
    }
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i++)
        d[i] = dtype == STRATA_DTYPE_BF16 ? cvt_f32_to_bf16(src[i]) : cvt_f32_to_fp16(src[i]);
}

static strata_status write_initial_state(strata_engine *e)
{
    size_t chunk = MIN(INIT_CHUNK_NUMEL, e->total_numel);
    float *vals = NULL, *zeros = NULL;
    void *pbuf = NULL;
    strata_status st = STRATA_OK;
    if (posix_memalign((void **)&vals, 4096, chunk * 4) || posix_memalign((void **)&zeros, 4096, chunk * 4) ||
        posix_memalign(&pbuf, 4096, chunk * e->param_bytes)) {
        st = err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory for the initialisation buffers");
        goto out;
    }
    memset(zeros, 0, chunk * 4);
    io_wait w;
    io_wait_init(&w);
    size_t cursor = 0;
    for (size_t first = 0; first < e->total_numel && st == STRATA_OK; first += chunk) {
        size_t n = MIN(chunk, e->total_numel - first);
        st = fill_chunk(e, first, n, vals, &cursor);
        if (st != STRATA_OK)
            break;
        to_param_dtype(vals, pbuf, e->cfg.param_dtype, n);
        tier_array *targets[] = {&e->master, &e->exp_avg, &e->exp_avg_sq, &e->param[0], &e->param[1]};
        const void *sources[] = {vals, zeros, zeros, pbuf, pbuf};
        for (size_t t = 0; t < ARRAY_LEN(targets) && st == STRATA_OK; t++)
            if (targets[t]->numel)
                st = tarr_write(targets[t], &e->env, first, n, sources[t], &w);
        /* NVMe writes read from the buffers: wait before refilling them. */
        strata_status wst = io_wait_wait(&w);
        if (st == STRATA_OK)
            st = wst;
    }
    io_wait_destroy(&w);
    for (int g = 0; g < 2 && st == STRATA_OK; g++) {
        void *host = e->grad[g].numel ? tarr_host_ptr(&e->grad[g], &e->env, 0) : NULL;
        if (host)
            memset(host, 0, e->total_numel * 4);
    }
out:
    free(vals);
    free(zeros);
    free(pbuf);
    return st;
}

static strata_status allocate_tiers(strata_engine *e)
{
    size_t n = e->total_numel;
    ERR_CHECK(tarr_alloc(&e->param[0], &e->env, e->param_tier, n, e->param_bytes, "parameters"));
    if (e->cfg.delayed_update)
        ERR_CHECK(tarr_alloc(&e->param[1], &e->env, e->param_tier, n, e->param_bytes, "parameters (second copy)"));
    ERR_CHECK(tarr_alloc(&e->master, &e->env, e->opt_tier, n, 4, "master weights"));
    ERR_CHECK(tarr_alloc(&e->exp_avg, &e->env, e->opt_tier, n, 4, "Adam exp_avg"));
    ERR_CHECK(tarr_alloc(&e->exp_avg_sq, &e->env, e->opt_tier, n, 4, "Adam exp_avg_sq"));
    ERR_CHECK(tarr_alloc(&e->grad[0], &e->env, e->grad_tier, n, 4, "gradient store"));
    if (e->cfg.delayed_update)
        ERR_CHECK(tarr_alloc(&e->grad[1], &e->env, e->grad_tier, n, 4, "gradient store (second)"));
    e->grad_touched[0] = calloc(e->nmodules, 1);
    e->grad_touched[1] = calloc(e->nmodules, 1);
    if (!e->grad_touched[0] || !e->grad_touched[1])
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory");
    return STRATA_OK;
}

static strata_status prepare_modules(strata_engine *e)
{
    for (size_t i = 0; i < e->nmodules; i++) {
        eng_module *m = &e->modules[i];
        io_wait_init(&m->io);
        ERR_CHECK(dev_event_create(e->dev, &m->ready));
        ERR_CHECK(dev_event_create(e->dev, &m->grads_written));
        m->fetch_bytes = m->numel * e->param_bytes;
        if (e->param_tier == STRATA_TIER_DEVICE) {
            /* Device-resident parameters are never fetched: the module points into the array. */
            m->dev = (char *)e->param[e->param_front].mem + m->offset * e->param_bytes;
            m->state = MOD_RESIDENT;
        }
    }
    return STRATA_OK;
}

static strata_status finalize(strata_engine *e)
{
    if (e->finalized)
        return err_set(STRATA_ESTATE, "strata_engine_finalize: already finalized");
    if (e->nparams == 0)
        return err_set(STRATA_ESTATE, "strata_engine_finalize: the model has no parameters; add modules and "
                       "parameters first");
    e->param_bytes = plan_dtype_bytes(e->cfg.param_dtype);
    plan_tiers(&e->cfg, &e->param_tier, &e->opt_tier, &e->grad_tier);
    if (e->opt_tier == STRATA_TIER_DEVICE && e->backend != STRATA_BACKEND_HOST)
        return err_set(STRATA_EUNSUPPORTED, "zero_optimization.offload_optimizer.device = \"none\" keeps the "
                       "optimizer state on the GPU, but strata's optimizer runs on the CPU; set it to \"cpu\" or "
                       "\"nvme\"");
    plan_windows(&e->cfg, e->param_bytes, &e->prefetch_bytes, &e->max_live_bytes);
    ERR_CHECK(layout(e));

    plan_input in;
    plan pl;
    plan_input_of(e, &in);
    plan_choose_grad_tier(&e->cfg, &in, plan_host_budget(&e->cfg), &pl);
    e->grad_tier = in.grad_tier;
    dev_mem_stats ds;
    dev_mem_stats_get(e->dev, &ds);
    ERR_CHECK(plan_check(&pl, &in, ds.budget_bytes, plan_host_budget(&e->cfg)));
    e->host_tier_bytes = pl.tier_bytes[STRATA_TIER_HOST];

    ERR_CHECK(dev_stream_create(e->dev, "h2d", &e->h2d));
    ERR_CHECK(dev_stream_create(e->dev, "d2h", &e->d2h));
    ERR_CHECK(dev_stream_create(e->dev, "copy", &e->copy));
    ERR_CHECK(dev_stream_create(e->dev, "update", &e->upd));
    /* The trainer computes on a stream strata orders fetches before: on the host backend that is the
     * calling thread itself, so the same code orders by blocking it. */
    if (e->backend == STRATA_BACKEND_HOST)
        ERR_CHECK(dev_stream_wrap(e->dev, NULL, "compute", &e->compute));
    else
        ERR_CHECK(dev_stream_create(e->dev, "compute", &e->compute));
    if (pl.tier_bytes[STRATA_TIER_NVME])
        ERR_CHECK(open_nvme(e, pl.tier_bytes[STRATA_TIER_NVME]));
    e->env = (tier_env){.dev = e->dev, .copy_stream = e->copy, .swap = e->swap,
                        .host_addressable_device = e->backend == STRATA_BACKEND_HOST};
    ERR_CHECK(pool_create(e->dev, e->io, pl.pool_part_bytes, &e->pool));
    ERR_CHECK(allocate_tiers(e));
    ERR_CHECK(write_initial_state(e));
    ERR_CHECK(prepare_modules(e));

    ERR_CHECK(adam_ops_default(&e->adam));
    e->adam_threads = e->cfg.cpu_threads ? e->cfg.cpu_threads : adam_default_threads();
    if (e->cfg.param_dtype == STRATA_DTYPE_FP16)
        e->loss_scale = e->cfg.loss_scale > 0 ? e->cfg.loss_scale : (double)(1ull << e->cfg.initial_scale_power);
    else
        e->loss_scale = 1.0;
    e->hysteresis_left = e->cfg.hysteresis;
    if (e->cfg.delayed_update)
        ERR_CHECK(opt_thread_start(e));

    char tot[32];
    LOG_INFO(LOG_CORE, "finalized %zu modules, %zu parameters, %zu elements (%s of parameters); tiers: param %d, "
             "optimizer %d, gradients %d", e->nmodules, e->nparams, e->total_numel,
             size_format(e->total_numel * e->param_bytes, tot, sizeof tot), e->param_tier, e->opt_tier, e->grad_tier);
    e->finalized = true;
    return STRATA_OK;
}

STRATA_API strata_status strata_engine_finalize(strata_engine *e)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_engine_finalize: engine is NULL");
    return err_copy(&e->err, finalize(e));
}
