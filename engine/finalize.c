/*
 * strata_engine_finalize(): lay out the flat partition, prove the plan fits the budgets, then build the
 * engine stage by stage — streams, tiers, deferred frees, gradient store, initial state, residency, step
 * pipeline, step driver, optimizer thread. A stage that fails unwinds every stage before it
 * (engine_unbuild), so a failed finalize leaves nothing half-built and can be called again.
 */
#include <stdio.h>

#include "base/log.h"
#include "base/size.h"
#include "base/util.h"
#include "engine/act_store.h"
#include "engine/config/config.h"
#include "engine/engine.h"
#include "engine/plan/host_cache.h"
#include "engine/plan/plan.h"
#include "engine/ranks/rank_agree.h"
#include "engine/ranks/ranks.h"
#include "engine/step/step_in_backward.h"
#include "engine/step/step.h"
#include "engine/step/train_step.h"
#include "engine/step/twin_flow.h"
#include "engine/weights/weights.h"

static void plan_input_of(const strata_engine *e, plan_input *in)
{
    size_t prefetch_bytes, max_live_bytes;
    plan_windows(&e->cfg, e->tiers.param_bytes, &prefetch_bytes, &max_live_bytes);
    *in = (plan_input){
        .total_numel = registry_total_numel(e->reg),
        .largest_module_numel = registry_largest_module_numel(e->reg),
        .param_bytes = e->tiers.param_bytes,
        .param_tier = e->tiers.param_tier,
        .opt_tier = e->tiers.opt_tier,
        .grad_tier = e->tiers.grad_tier,
        .delayed = e->cfg.delayed_update,
        .sub_group_numel = align_up(e->cfg.sub_group_size, ENGINE_MODULE_ALIGN),
        .prefetch_bytes = prefetch_bytes,
        .max_live_bytes = max_live_bytes,
        .activation_bytes = e->cfg.activation_bytes,
        .world_size = e->world,
        .zero_stage = e->cfg.zero_stage,
        .shard_numel = registry_view_numel(e->reg, REG_SHARD),
        .frozen = registry_nfrozen(e->reg) > 0,
        .trained_numel = registry_view_numel(e->reg, REG_FULL_TRAINED),
        .largest_trained_numel = registry_largest_trained_numel(e->reg),
        .shard_trained_numel = registry_view_numel(e->reg, REG_SHARD_TRAINED),
        .step_in_backward = e->cfg.step_in_backward,
        .speculate = cfg_speculates(&e->cfg),
        .keep_grads = cfg_keeps_grads(&e->cfg),
        .moments = e->cfg.optimizer_moments,
    };
    size_t opt_numel = registry_view_numel(e->reg, e->views.opt);
    in->opt_device_numel = opt_numel - twin_flow_split(opt_numel, MIN(in->sub_group_numel, opt_numel),
                                                       e->cfg.offload_optimizer_ratio);
}

/* Places every state class (an offload device "auto" chosen by plan_place) and proves the plan fits the budgets;
 * *pl receives the plan. The chosen tiers are written into the engine's copy of the config too, so that every
 * reader of it (the swap space's paths, the ranks' fingerprint, a checkpoint's manifest) sees where state lives,
 * never "auto"; a retried finalize places again from what the caller asked. */
static strata_status make_plan(strata_engine *e, plan *pl)
{
    engine_tiers *t = &e->tiers;
    t->param_bytes = strata_dtype_bytes(e->cfg.param_dtype);
    if (e->placement.placed) {
        e->cfg.offload_param.device = e->placement.asked_param;
        e->cfg.offload_optimizer.device = e->placement.asked_opt;
        e->cfg.offload_activations = e->placement.asked_act;
        e->placement.placed = false;
    }
    /* Step in backward names the settings it cannot run with, whatever else is pending. */
    if (e->cfg.step_in_backward || e->cfg.norm_pass)
        ERR_CHECK(step_in_backward_check_config(e));
    ranks_views(e->cfg.zero_stage, &e->views.param, &e->views.opt, &e->views.grad);
    ERR_CHECK(registry_layout(e->reg, e->cfg.param_persistence_threshold, e->world));
    ERR_CHECK(registry_check_parts(e->reg));
    ERR_CHECK(opt_groups_map(e->groups, e->reg, e->views.opt, e->rank));
    plan_input in;
    plan_input_of(e, &in);
    dev_mem_stats ds;
    dev_mem_stats_get(e->dev, &ds);
    plan_placement *pp = &e->placement;
    ERR_CHECK(plan_place(&e->cfg, e->backend == STRATA_BACKEND_HOST, &in, ds.budget_bytes, plan_host_budget(&e->cfg),
                         pp, pl));
    t->param_tier = pp->param_tier;
    t->opt_tier = pp->opt_tier;
    t->grad_tier = pp->grad_tier;
    e->cfg.offload_param.device = pp->param_tier;
    e->cfg.offload_optimizer.device = pp->opt_tier;
    e->cfg.offload_activations = pp->act_tier;
    if (pp->reason[0])
        LOG_INFO(LOG_CORE, "rank %d: placement %s", e->rank, pp->reason);
    return STRATA_OK;
}

static strata_status open_streams(strata_engine *e)
{
    ERR_CHECK(dev_stream_create(e->dev, "h2d", &e->h2d));
    ERR_CHECK(dev_stream_create(e->dev, "d2h", &e->d2h));
    ERR_CHECK(dev_stream_create(e->dev, "copy", &e->copy));
    ERR_CHECK(dev_stream_create(e->dev, "update", &e->upd));
    /* The trainer computes on a stream strata orders fetches before: on the host backend that is the
     * calling thread itself, so the same code orders by blocking it. */
    if (e->backend == STRATA_BACKEND_HOST)
        return dev_stream_wrap(e->dev, NULL, "compute", &e->compute);
    return dev_stream_create(e->dev, "compute", &e->compute);
}

static strata_status build(strata_engine *e)
{
    uint64_t t0 = now_ns();
    /* Weights from files are checked whole before anything is allocated or written: a wrong tensor is found in
     * milliseconds, not after the initial state of every parameter before it. */
    ERR_CHECK(weights_check(e));
    plan pl;
    ERR_CHECK(make_plan(e, &pl));
    ERR_CHECK(open_streams(e));
    ERR_CHECK(tiers_open(&e->tiers, &e->cfg, e->dev, e->copy, e->backend == STRATA_BACKEND_HOST, &pl,
                         registry_view_numel(e->reg, e->views.param), registry_view_numel(e->reg, e->views.opt),
                         e->world == 1));
    ERR_CHECK(deferred_create(e->dev, &e->frees));
    ERR_CHECK(grads_create(e, &e->grads));
    ERR_CHECK(ranks_create(e, &e->ranks));
    ERR_CHECK(host_cache_open(e, &pl)); /* before the initial state, whose writes fill it */
    uint64_t t1 = now_ns();
    e->ctr.finalize_alloc_ns = t1 - t0;
    ERR_CHECK(tiers_write_initial(&e->tiers, e->reg, e->cfg.param_dtype, &e->views, e->rank, agree_weight_crcs(e)));
    ERR_CHECK(twin_flow_create(e, &e->twin)); /* after the initial state, which it copies */
    e->ctr.finalize_init_ns = now_ns() - t1;
    ERR_CHECK(residency_create(e, &e->res));
    ERR_CHECK(act_store_create(e, e->placement.act_tier, &pl, &e->acts));
    ERR_CHECK(step_create(&e->cfg, &e->step));
    ERR_CHECK(driver_create(&e->cfg, &e->driver));
    if (e->cfg.delayed_update)
        ERR_CHECK(opt_thread_start(e, &e->opt));
    if (e->cfg.step_in_backward)
        ERR_CHECK(step_in_backward_create(e, &e->in_backward));
    return STRATA_OK;
}

static strata_status finalize(strata_engine *e)
{
    if (e->finalized)
        return err_set(STRATA_ESTATE, "strata_engine_finalize: already finalized");
    if (registry_nparams(e->reg) == 0)
        return err_set(STRATA_ESTATE, "strata_engine_finalize: the model has no parameters; add modules and "
                       "parameters first");
    /* Every rank learns how every other's build went before any rank goes on, so none waits for a rank that
     * failed (a budget, an NVMe path) in the first collective of training. */
    strata_status st = agree_finalize(e, build(e));
    if (st != STRATA_OK) {
        /* Unwinding may touch the thread's error: keep the stage's message. */
        char msg[ERR_MSG_BYTES];
        snprintf(msg, sizeof msg, "%s", err_last());
        engine_unbuild(e);
        return err_set(st, "%s", msg);
    }
    char tot[32];
    size_t total = registry_total_numel(e->reg);
    LOG_INFO(LOG_CORE, "rank %d of %d: finalized %zu modules, %zu parameters, %zu elements (%s of parameters); "
             "tiers: param %s, optimizer %s, gradients %s", e->rank, e->world, registry_nmodules(e->reg),
             registry_nparams(e->reg), total,
             size_format(total * e->tiers.param_bytes, tot, sizeof tot), strata_tier_name(e->tiers.param_tier),
             strata_tier_name(e->tiers.opt_tier), strata_tier_name(e->tiers.grad_tier));
    e->finalized = true;
    weights_finalized(e->weights); /* read: their files are closed */
    return STRATA_OK;
}

STRATA_API strata_status strata_engine_placement(strata_engine *e, strata_tier *param, strata_tier *optimizer,
                                                 strata_tier *gradients, char *reason, size_t reason_len)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_engine_placement: engine is NULL");
    strata_status st = engine_require_finalized(e, "strata_engine_placement");
    if (st != STRATA_OK)
        return err_copy(&e->err, st);
    if (param)
        *param = e->tiers.param_tier;
    if (optimizer)
        *optimizer = e->tiers.opt_tier;
    if (gradients)
        *gradients = e->tiers.grad_tier;
    if (reason && reason_len)
        snprintf(reason, reason_len, "%s", e->placement.reason);
    return STRATA_OK;
}

STRATA_API strata_status strata_engine_finalize(strata_engine *e)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_engine_finalize: engine is NULL");
    return err_copy(&e->err, finalize(e));
}
