/*
 * The optimizer's parameter groups: each group's hyperparameters (lr, weight decay, betas, eps) as the trainer
 * sets them, the copy a step runs with (frozen when the step starts, so a delayed update keeps its own step's
 * values while the trainer sets the next), where each group's elements lie in the optimizer's view, and the Adam
 * constants a step computes from them (step_consts). Group 0 ("default") is the config's optimizer.params.
 */
#ifndef STRATA_ENGINE_STEP_OPT_GROUPS_H
#define STRATA_ENGINE_STEP_OPT_GROUPS_H

#include <stdbool.h>
#include <stdint.h>

#include "cpu_adam/driver.h"
#include "engine/registry.h"
#include "strata.h"

typedef struct opt_groups opt_groups;

/* Group 0 from cfg's optimizer.params (its exact doubles). */
strata_status opt_groups_create(const strata_config *cfg, opt_groups **out);
void opt_groups_destroy(opt_groups *g);

/* STRATA_EINVAL naming what (the call), the group and the field for a value out of range. */
strata_status opt_groups_check(const char *what, const char *name, const strata_group_hparams *hp);
strata_status opt_groups_add(opt_groups *g, const char *name, const strata_group_hparams *hp, strata_group_id *out);
/* Replaces a known group's values (checked). */
strata_status opt_groups_set(opt_groups *g, strata_group_id id, const strata_group_hparams *hp);
size_t opt_groups_count(const opt_groups *g);
/* A known group's current values and name; NULL for an unknown id. */
const strata_group_hparams *opt_groups_get(const opt_groups *g, strata_group_id id);
const char *opt_groups_name(const opt_groups *g, strata_group_id id);

/* At finalize: where each group's elements lie in the optimizer's view v, as rank sees it. */
strata_status opt_groups_map(opt_groups *g, const registry *r, reg_view v, int rank);

/* STRATA_EINVAL naming what when a step's lr (> 0: group 0's lr for that step) is given with several groups. */
strata_status opt_groups_check_step_lr(const opt_groups *g, double lr, const char *what);
/* A step starts: its groups' values are the current ones, with lr (> 0) as group 0's lr for this step (one group
 * only, as opt_groups_check_step_lr says). */
strata_status opt_groups_freeze(opt_groups *g, double lr, const char *what);
/* A digest of the groups' names and current values and of every parameter's group (what ranks compare at
 * finalize). */
uint64_t opt_groups_digest(const opt_groups *g, const registry *r);
/* The frozen step's group 0 lr, and a digest of every frozen group's values (what ranks compare each step). */
double opt_groups_frozen_lr(const opt_groups *g);
uint64_t opt_groups_frozen_digest(const opt_groups *g);

/* One step's Adam constants, per group, over the groups' runs in the optimizer's view. */
typedef struct step_consts {
    adam_consts *by_group;
    adam_group_map groups;    /* by_group over the view's runs */
    size_t ngroups;
} step_consts;

/* The constants of the frozen groups at update step (from 1) with grad_scale folded into the gradient read, over
 * the runs opt_groups_map found; sc starts zeroed and is sized on first use (STRATA_ENOMEM). */
strata_status step_consts_fill(step_consts *sc, const opt_groups *g, const strata_config *cfg, int64_t step,
                               double grad_scale);
/* Frees what fill sized; the struct is zeroed again. */
void step_consts_free(step_consts *sc);
/* Points job at sc for the job's elements, which start at element first of the optimizer's view. */
void step_consts_apply(const step_consts *sc, size_t first, adam_job *job);
/* The runs of [first, first + numel) of the view, one at a time: *group and *count of the run holding first (count
 * cut at numel). For callers that launch one kernel per group (the device's Adam). */
void step_consts_run(const step_consts *sc, size_t first, size_t numel, uint32_t *group, size_t *count);

#endif
