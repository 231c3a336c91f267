/*
 * One module's optimizer update for the step in backward (step_in_backward.h), in pieces of step_piece_numel
 * elements: each piece's master weights and moments read from NVMe into pinned buffers (or updated in host memory),
 * Adam, the new parameters sent to their home. Speculating (gradient clipping or fp16 without strata.norm_pass:
 * cfg_speculates, step_rollback.h) it reads the front copy of the optimizer state and writes the back one; with
 * clipping it keeps the gradients it took, and a redo takes the kept ones; a skipped fp16 step puts the parameters
 * back.
 * Private to the step in backward.
 */
#ifndef STRATA_ENGINE_MODULE_UPDATE_H
#define STRATA_ENGINE_MODULE_UPDATE_H

#include <stdbool.h>

#include "cpu_adam/driver.h"
#include "engine/registry.h"
#include "engine/step/opt_groups.h"
#include "engine/step/step_rollback.h"
#include "strata.h"

struct strata_engine;

typedef struct module_updater {
    struct strata_engine *e;
    const adam_ops *adam;
    int threads;
    size_t chunk;                  /* elements per piece: the optimizer sub-group (what POOL_STEP holds) */
    bool speculate;                /* cfg_speculates: the back copy is written */
    bool keep_grads;               /* cfg_keeps_grads: the gradients are kept for a redo */
    strata_dtype kept_dtype;       /* of the gradients an update takes: the parameter dtype, or fp32 parts (ranks) */
    int64_t step;                  /* the update's step count (the bf16 moments' rounding key): set per step */
    step_rollback rb;
    /* pinned (POOL_STEP, the step pipeline's slice, which the step in backward never uses otherwise) */
    float *master;                 /* one piece of the optimizer state, when it is on NVMe */
    void *m, *v;                   /* (the moments in their form: tiers.moments) */
    void *pstage;                  /* updated parameters on their way to a device or NVMe home */
    void *gbuf;                    /* one piece of kept gradients read back from NVMe for a redo */
    float *zeros;                  /* fp32 zero gradients of one piece, for modules without gradients */
} module_updater;

/* Where an update takes a module's gradients from. */
typedef struct grad_src {
    const void *mem;    /* the module's gradients in memory (its staging, a reduced part, or the fp32 sum of tied
                           weights); NULL with from_kept false: zeros */
    strata_dtype dtype;
    bool from_kept;     /* a redo: from the kept array (kept_dtype) instead */
    bool keep;          /* speculating: written to the kept array as the update reads them */
} grad_src;

strata_status updater_create(module_updater *u, struct strata_engine *e);
void updater_destroy(module_updater *u);

/* Updates module id from g with consts. released (or NULL): the trainer's last read of the module's device copy,
 * which new parameters on the device wait for. Any one thread at a time. */
strata_status updater_run(module_updater *u, strata_module_id id, const grad_src *g, const step_consts *consts,
                          dev_event *released);
/* Adds the statistics of module id's gradients (grad in dtype), piece by piece as the ordinary step's norm sums
 * them (step_piece_gradstats), to *out. */
strata_status updater_stats(module_updater *u, strata_module_id id, const void *grad, strata_dtype dtype,
                            adam_gradstats *out);
/* A skipped fp16 step: the parameters module id's update wrote are put back, rounded from the front master weights
 * (what every update writes them as, so they are the ones the step before left). */
strata_status updater_restore_params(module_updater *u, strata_module_id id);
/* Keeps module id's gradients g (g->mem, kept_dtype) for an update at strata_step, without updating it. */
strata_status updater_keep(module_updater *u, strata_module_id id, const grad_src *g);

#endif
