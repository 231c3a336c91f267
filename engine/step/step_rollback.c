/* The back copy of the optimizer state and the kept gradients of a speculating step in backward; see
 * step_rollback.h. */
#include "engine/step/step_rollback.h"

#include <string.h>

tier_array *rollback_front(engine_tiers *t, int i)
{
    tier_array *front[ROLLBACK_ARRAYS] = {&t->master, &t->exp_avg, &t->exp_avg_sq, &t->exp_avg_scale,
                                          &t->exp_avg_sq_scale};
    return front[i];
}

strata_status rollback_create(step_rollback *r, engine_tiers *t, size_t numel, size_t kept_bytes)
{
    static const char *what[ROLLBACK_ARRAYS] = {
        "master weights (the copy a step in backward rolls back to)",
        "Adam exp_avg (the copy a step in backward rolls back to)",
        "Adam exp_avg_sq (the copy a step in backward rolls back to)",
        "Adam exp_avg block scales (the copy a step in backward rolls back to)",
        "Adam exp_avg_sq block scales (the copy a step in backward rolls back to)",
    };
    for (int i = 0; i < ROLLBACK_ARRAYS; i++) {
        const tier_array *f = rollback_front(t, i);
        if (f->numel) /* the scales exist with 8-bit moments only */
            ERR_CHECK(tarr_alloc_cpu(&r->back[i], &t->env, f->tier, f->numel, f->elem_bytes, what[i]));
    }
    if (!kept_bytes)
        return STRATA_OK;
    return tarr_alloc_cpu(&r->kept, &t->env, t->kept_tier, numel, kept_bytes,
                          "gradients kept for a redo (a clipped step in backward)");
}

void rollback_destroy(step_rollback *r, engine_tiers *t)
{
    for (int i = 0; i < ROLLBACK_ARRAYS; i++)
        tarr_free(&r->back[i], &t->env);
    tarr_free(&r->kept, &t->env);
}

void rollback_commit(step_rollback *r, engine_tiers *t)
{
    for (int i = 0; i < ROLLBACK_ARRAYS; i++) {
        tier_array *front = rollback_front(t, i), was = *front;
        *front = r->back[i];
        r->back[i] = was;
    }
}
