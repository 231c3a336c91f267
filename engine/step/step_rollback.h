/*
 * What lets a step in backward speculate (strata.step_in_backward with gradient_clipping): each module's update
 * runs during backward as if clipping will not trigger, because the global gradient norm that decides it is
 * known only when backward ends. To make a wrong guess undoable without a word of difference from the ordinary
 * step, the updates write a second copy of master, exp_avg and exp_avg_sq (the back copy) and keep each module's
 * gradients; strata_step then either commits the back copy (the copies trade places: no byte moves) or, when
 * clipping triggers, redoes every update from the front copy with the clipped gradients.
 *
 * The price: the optimizer state twice in its tier (12 B per element more: NVMe space, or host memory) and the
 * gradients once more (parameter dtype, or with ranks the fp32 reduced parts; written as each module is updated,
 * read only by a redo). A redo costs
 * what an ordinary step's optimizer pass costs; stats count the redone steps, their seconds and NVMe bytes.
 * Private to the step in backward (step_in_backward.c).
 */
#ifndef STRATA_ENGINE_STEP_ROLLBACK_H
#define STRATA_ENGINE_STEP_ROLLBACK_H

#include "engine/tiers.h"
#include "strata.h"

/* The optimizer state's arrays (front: t's; back: r's): the first ROLLBACK_PIECE_ARRAYS are indexed by element, the
 * 8-bit moments' block scales by block (they exist with 8-bit moments only). */
enum {
    ROLLBACK_MASTER,
    ROLLBACK_EXP_AVG,
    ROLLBACK_EXP_AVG_SQ,
    ROLLBACK_PIECE_ARRAYS,
    ROLLBACK_EXP_AVG_SCALE = ROLLBACK_PIECE_ARRAYS,
    ROLLBACK_EXP_AVG_SQ_SCALE,
    ROLLBACK_ARRAYS,
};

typedef struct step_rollback {
    tier_array back[ROLLBACK_ARRAYS]; /* as this step's updates write them (the scales: only with 8-bit moments) */
    tier_array kept;    /* the gradients the updates ran with (the parameter dtype; fp32 with ranks), for a redo */
} step_rollback;

tier_array *rollback_front(engine_tiers *t, int i);

/* Allocates the back copy (each array like its front) and the kept gradients (in the plan's kept_tier; kept_bytes
 * per gradient, 0: none, when no redo can come; numel of them). */
strata_status rollback_create(step_rollback *r, engine_tiers *t, size_t numel, size_t kept_bytes);
void rollback_destroy(step_rollback *r, engine_tiers *t);

/* The step's updates are final: the back copy becomes the optimizer state (the front), the front the next back. */
void rollback_commit(step_rollback *r, engine_tiers *t);

#endif
