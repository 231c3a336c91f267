/*
 * The engine object: the handle every public call takes. It owns the shared services (the validated
 * config, the device and its streams, the tiers, the trace, the link counters) and one sub-object per
 * concern, each private to its file:
 *
 *   registry          registry.c                    modules, parameters, the flat layout
 *   groups            step/opt_groups.c             the optimizer's parameter groups and a step's constants
 *   acts              act_store.c                   offloaded activations: strata_act_push / pop / drop
 *   residency/        fetch_order.c                 the declared or recorded fetch order of a step
 *                     residency.c                   device copies of modules: fetch, release, prefetch window
 *                     deferred_free.c               device buffers freed once a stream is past them
 *   grads/            grads.c                       gradient buffers, their hand-off, the fp32 gradient stores;
 *                     grad_handoff.h                the hand-off goes one way, chosen at finalize:
 *                                                   grad_accumulate.c, grad_reduce_scatter.c, or the update in
 *                                                   backward (step/step_in_backward.c)
 *   plan/             plan.c, plan_auto.c           what lives where, proved against the budgets at finalize
 *                     plan_ranks.c                  a rank's slice of the flat partition
 *                     host_cache.c                  what the host cache mirrors
 *                     node_share.c                  this rank's share of its machine: host budget, Adam cores,
 *                                                   device budget
 *   step/             step.c                        the optimizer step pipeline and its pinned slots
 *                     train_step.c                  strata_step_begin, strata_step: loss scale, delayed
 *                                                   hand-offs, counts
 *                     opt_thread.c                  the delayed update's thread
 *                     twin_flow.c                   the optimizer's device share (offload_optimizer.ratio)
 *                     step_in_backward.c            module updates during backward, and their thread
 *   ranks/            ranks.c                       the data-parallel world: the step's collectives, their buffers
 *                     rank_agree.c                  what the ranks compare at finalize and every step
 *   checkpoint        ckpt/                         save and load (and the flag a failed load leaves)
 *   config            config/                       the validated config: JSON, schema, report
 *
 * The registry and the fetch order exist from strata_engine_create (the trainer adds modules and may
 * declare the order before finalize); everything else is built by strata_engine_finalize (finalize.c),
 * which unwinds what it built when a stage fails, so it can be called again.
 */
#ifndef STRATA_ENGINE_ENGINE_H
#define STRATA_ENGINE_ENGINE_H

#include <stdatomic.h>

#include "base/error.h"
#include "engine/residency/deferred_free.h"
#include "engine/residency/fetch_order.h"
#include "engine/grads/grads.h"
#include "engine/plan/node_share.h"
#include "engine/step/opt_thread.h"
#include "engine/plan/plan_auto.h"
#include "engine/registry.h"
#include "engine/step/opt_groups.h"
#include "engine/residency/residency.h"
#include "engine/tiers.h"
#include "engine/trace.h"
#include "comm/comm.h"
#include "gpu/device.h"
#include "strata.h"

typedef struct step_pipeline step_pipeline;
typedef struct step_driver step_driver;
typedef struct rank_state rank_state;
typedef struct step_in_backward step_in_backward;
typedef struct twin_flow twin_flow;
typedef struct act_store act_store;
typedef struct rank_agree rank_agree;
typedef struct weights_set weights_set;

/* Bytes moved per link and time spent, counted by whichever thread moves them. */
typedef struct eng_counters {
    _Atomic uint64_t host_to_device, device_to_host; /* NVMe's: engine_tiers.ctr */
    _Atomic uint64_t adam_ns, step_io_wait_ns;
    _Atomic uint64_t steps_redone, redo_ns, redo_nvme_bytes; /* a speculating step in backward's redos */
    _Atomic uint64_t norm_passes, norm_pass_ns;              /* strata.norm_pass: the first backward of each step */
    uint64_t finalize_alloc_ns, finalize_init_ns;             /* the last finalize's phases (strata_stats) */
} eng_counters;

struct strata_engine {
    strata_config cfg;              /* validated copy of the caller's config */
    strata_backend_kind backend;    /* resolved: never AUTO */
    err_slot err;                   /* strata_last_error(engine) */
    bool finalized;

    /* from strata_engine_create */
    comm *comm;                     /* the data-parallel world (a world of 1 when none was given) */
    bool comm_owned;                /* made by create (world 1), freed by destroy */
    int rank, world;
    device *dev;
    trace *trace;                   /* strata.trace_path, or NULL */
    registry *reg;
    opt_groups *groups;             /* the optimizer's parameter groups (step/opt_groups.c) */
    fetch_order *order;
    rank_agree *agree;              /* what the ranks compare at finalize (rank_agree.c), or NULL */
    node_share *node;               /* this rank's share of its machine (node_share.h) */
    weights_set *weights;           /* safetensors weights parameters load from (weights/weights.c), or NULL */

    /* from strata_engine_finalize, in the order it builds them */
    dev_stream *h2d, *d2h, *copy, *upd; /* fetches, gradients, sync copies, parameter updates */
    dev_stream *compute;            /* the trainer's: a CUDA stream, or the caller's thread (host backend) */
    plan_placement placement;       /* what the config asked and where finalize put each class, and why */
    engine_tiers tiers;
    deferred_frees *frees;
    grad_store *grads;
    residency *res;
    step_pipeline *step;
    step_driver *driver;
    rank_state *ranks;
    engine_views views;
    opt_thread *opt;                /* only with the delayed update */
    step_in_backward *in_backward;  /* only with strata.step_in_backward (step_in_backward.c) */
    twin_flow *twin;                /* the optimizer's device share (offload_optimizer.ratio < 1), or NULL */
    act_store *acts;                /* offloaded activations (strata.offload_activations), or NULL */

    eng_counters ctr;
    bool ckpt_incomplete;           /* a strata_load failed half-way: the state is a mix; steps refuse */
    bool failed_alike;              /* every rank found the last failure alike (rank_agree.c): none aborts */
};

/* STRATA_ESTATE unless finalize has run (what names the call). */
strata_status engine_require_finalized(strata_engine *e, const char *what);
/* As engine_require_finalized, and STRATA_ESTATE for a module id the registry does not know. */
strata_status engine_require_module(strata_engine *e, strata_module_id id, const char *what);
/* Tears down everything finalize builds, in reverse order, draining work in flight; the engine is as
 * strata_engine_create left it (plus its registry). Safe on a partly built engine. */
void engine_unbuild(strata_engine *e);

#endif
