/*
 * The gradient hand-off: where one module's gradients go once strata_grads_ready has queued their copy off the
 * device into pinned staging. There are three ways, and grads_create picks one at finalize; every hand-over then
 * goes through it, with no mode test on the way:
 *
 *   accumulate      grad_accumulate.c      a host function on the d2h stream adds them (fp32) into the front
 *                                          gradient store, in host memory or on NVMe (one rank, or several whose
 *                                          gradients are reduced at the step)
 *   reduce-scatter  grad_reduce_scatter.c  several ranks with sharded gradients (stages 2 and 3): the ranks
 *                                          reduce-scatter them while backward goes on, and this rank's part is
 *                                          added into its shard of the store
 *   in backward     step_in_backward.c     strata.step_in_backward: no store; the staging feeds the module's update
 *
 * grads.c does what the three share: the checks, the staging, the copy off the device and, once the way has taken
 * the gradients, the one epilogue (the module counts as having gradients, its device buffer goes).
 */
#ifndef STRATA_ENGINE_GRAD_HANDOFF_H
#define STRATA_ENGINE_GRAD_HANDOFF_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/registry.h"
#include "offload/tier_array.h"
#include "strata.h"

struct strata_engine;

/* One module's gradients, their copy off the device queued on the d2h stream. */
typedef struct grad_staged {
    strata_module_id id;
    const reg_module *module;
    void *staging;                 /* pinned, from POOL_GRAD, in the parameter dtype */
    tier_array *store;             /* the front gradient store */
    bool first;                    /* the module's first gradients in that store since its last step: they overwrite */
    uint64_t submit_ns;            /* when strata_grads_ready began (the trace) */
} grad_staged;

typedef struct grad_handoff grad_handoff;

/* A way of handing gradients off. admit, finish and reclaim may be NULL (nothing to do). */
typedef struct grad_handoff_ops {
    bool uses_store;               /* the gradients gather in the fp32 store (without it finalize allocates none) */
    /* Refuses a hand-over of module id before any staging is taken. */
    strata_status (*admit)(grad_handoff *h, struct strata_engine *e, strata_module_id id);
    /* Takes the staged gradients. On success the staging is the way's to give back to the pool; on failure it is
     * still the caller's. Runs on the trainer's thread. */
    strata_status (*take)(grad_handoff *h, struct strata_engine *e, const grad_staged *s);
    /* With the d2h stream synced: completes the hand-offs still in flight and reports the first failure of any
     * since the last call. */
    strata_status (*finish)(grad_handoff *h, struct strata_engine *e);
    /* Waits until the work the hand-offs started (beyond finish) is done and has given its staging back; reports
     * the first failure of that work since the last call. */
    strata_status (*reclaim)(grad_handoff *h, struct strata_engine *e);
    /* After the last finish. */
    void (*destroy)(grad_handoff *h, struct strata_engine *e);
} grad_handoff_ops;

/* Every way's object starts with this. */
struct grad_handoff {
    const grad_handoff_ops *ops;
};

strata_status grad_accumulate_create(struct strata_engine *e, grad_handoff **out);
strata_status grad_reduce_scatter_create(struct strata_engine *e, grad_handoff **out);
strata_status grad_in_backward_create(struct strata_engine *e, grad_handoff **out); /* step_in_backward.c */

/* Adds count gradients (src, of src_dtype) into store elements [off, off + count): in place in host memory, or
 * read-add-write through a pinned fp32 buffer on NVMe. first: the module's first gradients since its last step,
 * which overwrite. Any thread. */
strata_status grad_store_add(struct strata_engine *e, tier_array *store, size_t off, size_t count, const void *src,
                             strata_dtype src_dtype, bool first);

#endif
