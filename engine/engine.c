/* Engine lifetime: create (validate, choose a backend), destroy, last error. */
#include "engine/act_store.h"
#include "engine/engine.h"

#include <stdio.h>
#include <stdlib.h>

#include "base/log.h"
#include "engine/config/config.h"
#include "engine/ranks/rank_agree.h"
#include "engine/ranks/ranks.h"
#include "engine/step/step_in_backward.h"
#include "engine/step/step.h"
#include "engine/step/train_step.h"
#include "engine/step/twin_flow.h"
#include "engine/weights/weights.h"
#include "gpu/device.h"

/* Device collectives over NCCL: the embedder's communicator, or one made over MPI when every rank of this host
 * has a GPU of its own; ranks that share a GPU stage through pinned memory over MPI instead. */
static strata_status attach_nccl(strata_engine *e, void *nccl_comm)
{
    if (!nccl_comm && comm_local_size(e->comm) > dev_count(e->backend))
        return STRATA_OK;
    strata_status st = comm_attach_nccl(e->comm, e->dev, nccl_comm);
    if (st == STRATA_EUNSUPPORTED && !nccl_comm) {
        LOG_INFO(LOG_CORE, "device collectives over MPI through pinned memory: %s", err_last());
        err_clear();
        return STRATA_OK;
    }
    return st;
}

/* Opens the device backend the config asks for; AUTO falls back to the host backend when no GPU answers. */
static strata_status open_device(strata_engine *e)
{
    dev_options opt = DEV_OPTIONS_INIT;
    /* One GPU per rank of a host when there are enough (ranks share them round-robin otherwise). */
    int gpus = e->cfg.backend == STRATA_BACKEND_HOST ? 0 : dev_count(e->cfg.backend);
    if (gpus > 0 && e->cfg.device_id >= gpus)
        return err_set(STRATA_EINVAL, "strata.device_id = %d, but this host has %d GPU(s): allowed 0..%d; "
                       "hint: ranks of a host add their local rank to it by themselves (round-robin)",
                       e->cfg.device_id, gpus, gpus - 1);
    opt.device_id = e->cfg.device_id + comm_local_rank(e->comm);
    if (gpus > 0)
        opt.device_id %= gpus;
    opt.budget_bytes = e->cfg.device_budget_bytes;
    opt.budget_share = node_device_sharers(e->cfg.device_id, comm_local_rank(e->comm), comm_local_size(e->comm), gpus);
    ERR_CHECK(dev_create(e->cfg.backend, &opt, &e->dev));
    e->backend = dev_kind(e->dev);
    LOG_INFO(LOG_CORE, "engine on %s", dev_name(e->dev));
    return STRATA_OK;
}

/* The engine's place in its world: the caller's comm, or a world of 1 of its own. */
static strata_status join_world(strata_engine *e, strata_comm *c)
{
    if (c) {
        e->comm = c;
    } else {
        ERR_CHECK(comm_create_single(&e->comm));
        e->comm_owned = true;
    }
    e->rank = comm_rank(e->comm);
    e->world = comm_size(e->comm);
    /* The deadline is the config's (strata.comm_timeout_s); strata_comm_set_timeout after create overrides it. */
    comm_set_timeout(e->comm, (uint32_t)(e->cfg.comm_timeout_s * 1000.0 + 0.5));
    return STRATA_OK;
}

static strata_status create(const strata_config *cfg, strata_comm *c, void *nccl_comm, strata_engine **out)
{
    if (!out)
        return err_set(STRATA_EINVAL, "strata_engine_create: out is NULL");
    *out = NULL;
    if (!cfg)
        return err_set(STRATA_EINVAL, "strata_engine_create: cfg is NULL; fill one with strata_config_init()");
    strata_config full;
    ERR_CHECK(config_from_caller(cfg, &full));

    strata_engine *e = calloc(1, sizeof *e);
    if (!e)
        return err_set(STRATA_ENOMEM, "strata_engine_create: out of memory for the engine object");
    e->cfg = full;
    strata_status st = registry_create(&e->reg);
    if (st == STRATA_OK)
        st = opt_groups_create(&e->cfg, &e->groups);
    if (st == STRATA_OK)
        st = fetch_order_create(&e->order);
    if (st == STRATA_OK)
        st = join_world(e, c);
    if (st == STRATA_OK)
        st = open_device(e);
    /* A collective: a rank whose device failed takes part too, so the others do not wait for it. */
    if (e->comm)
        st = node_share_create(e, st, &e->node);
    if (st == STRATA_OK && e->world > 1 && e->backend != STRATA_BACKEND_HOST)
        st = attach_nccl(e, nccl_comm);
    if (st == STRATA_OK && cfg->trace_path[0]) {
        /* Ranks given one path (one config for the world) must not write one file: rank r > 0 writes PATH.rank<r>,
         * as strata train's --log-jsonl does. */
        char path[STRATA_PATH_BYTES + 16];
        snprintf(path, sizeof path, e->world > 1 && e->rank > 0 ? "%s.rank%d" : "%s", cfg->trace_path, e->rank);
        st = trace_create(path, &e->trace);
    }
    if (st != STRATA_OK) {
        strata_engine_destroy(e);
        return st;
    }
    *out = e;
    return STRATA_OK;
}

STRATA_API strata_status strata_engine_create(const strata_config *cfg, strata_engine **out)
{
    return create(cfg, NULL, NULL, out);
}

STRATA_API strata_status strata_engine_create_ranked(const strata_config *cfg, strata_comm *world, void *nccl_comm,
                                                     strata_engine **out)
{
    return create(cfg, world, nccl_comm, out);
}

strata_status engine_require_finalized(strata_engine *e, const char *what)
{
    if (!e->finalized)
        return err_set(STRATA_ESTATE, "%s: the engine is not finalized yet; call strata_engine_finalize() after "
                       "adding every module and parameter", what);
    return STRATA_OK;
}

strata_status engine_require_module(strata_engine *e, strata_module_id id, const char *what)
{
    ERR_CHECK(engine_require_finalized(e, what));
    return registry_find_module(e->reg, id, what) ? STRATA_OK : STRATA_ESTATE;
}

/* In reverse order of finalize: the optimizer thread's job, device copies, gradient hand-offs, deferred
 * frees (the dropped buffers wait for the compute stream), the step's slots, the tiers, the streams. */
void engine_unbuild(strata_engine *e)
{
    strata_step_result unused;
    bool had;
    opt_job_join(e->opt, &unused, &had);
    opt_thread_stop(e->opt);
    step_in_backward_destroy(e, e->in_backward); /* before the gradient staging and the tiers it updates go */
    e->in_backward = NULL;
    act_store_destroy(e, e->acts); /* before the deferred frees its device copies go to, and the swap */
    e->acts = NULL;
    driver_destroy(e->driver);
    twin_flow_destroy(e, e->twin); /* before the gradient stores it pinned a range of */
    ranks_destroy(e, e->ranks);
    residency_destroy(e, e->res);
    grads_destroy(e, e->grads); /* drains the gradient hand-offs first */
    deferred_destroy(e->frees);
    step_destroy(e, e->step);
    tiers_close(&e->tiers);
    dev_stream *streams[] = {e->h2d, e->d2h, e->copy, e->upd, e->compute};
    for (size_t i = 0; i < sizeof streams / sizeof streams[0]; i++)
        dev_stream_destroy(streams[i]);
    e->opt = NULL;
    e->driver = NULL;
    e->ranks = NULL;
    e->res = NULL;
    e->grads = NULL;
    e->frees = NULL;
    e->step = NULL;
    e->twin = NULL;
    e->h2d = e->d2h = e->copy = e->upd = e->compute = NULL;
    e->finalized = false;
}

/* Drains in-flight work first (engine_unbuild); also tears down a half-finalized engine. */
STRATA_API void strata_engine_destroy(strata_engine *e)
{
    if (!e)
        return;
    engine_unbuild(e);
    /* The comm may outlive the engine: it gives back what it made on this device (staging, NCCL) first. */
    if (e->comm && e->dev)
        comm_detach_device(e->comm, e->dev);
    dev_destroy(e->dev);
    trace_finish(e->trace);
    fetch_order_destroy(e->order);
    node_share_destroy(e->node);
    weights_destroy(e->weights);
    registry_destroy(e->reg);
    opt_groups_destroy(e->groups);
    agree_destroy(e->agree);
    if (e->comm_owned)
        comm_destroy(e->comm);
    free(e);
}

STRATA_API strata_status strata_trace_write(strata_engine *e)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_trace_write: engine is NULL");
    return err_copy(&e->err, trace_write(e->trace));
}

STRATA_API strata_backend_kind strata_engine_backend(const strata_engine *e)
{
    return e ? e->backend : STRATA_BACKEND_AUTO;
}

STRATA_API const char *strata_last_error(const strata_engine *e)
{
    return e ? e->err.msg : err_last();
}
