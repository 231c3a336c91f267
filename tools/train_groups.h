/* The optimizer parameter groups of a `strata train` run on its engine: the weight-decay recipe's (decay_recipe.h)
 * made before finalize, every group's values written before each step (the schedule's lr goes to every group, and
 * strata_step takes lr 0), and a checkpoint's groups compared with this run's before --resume loads it, so that a run
 * with another recipe is refused in the flags' words rather than the engine's. */
#ifndef STRATA_TOOLS_TRAIN_GROUPS_H
#define STRATA_TOOLS_TRAIN_GROUPS_H

#include <stddef.h>

#include "model/gpt_engine.h"
#include "strata.h"
#include "tools/decay_recipe.h"

typedef struct train_groups {
    decay_recipe recipe;
    strata_group_hparams hp[DECAY_GROUPS]; /* this run's values of each group; lr is the step's */
    size_t n;                              /* 1 (the recipe is off) or DECAY_GROUPS */
} train_groups;

/* Adds the recipe's groups to e (not finalized; m registered) and puts m's parameters in them; their betas and eps
 * are the config's (group "default"'s). Fails as the engine call does (strata_last_error(e)). */
strata_status train_groups_make(train_groups *g, strata_engine *e, gpt_model *m, const decay_recipe *r);

/* Before a step begins (strata_step_begin): every group's values, with lr. A checkpoint's load put its own values in
 * the groups; this puts this run's back. Fails as strata_group_set does. */
strata_status train_groups_set(train_groups *g, strata_engine *e, double lr);

/* The checkpoint at dir against this run's groups, before strata_load: 0, or 2 with the difference said in the
 * flags' terms (train_err). The groups may differ in the decay's value alone, which this run's then replaces (as its
 * lr does the saved lr): *saved_decay is the checkpoint's value (this run's when the checkpoint has no groups
 * recorded: saved before strata had them, it passes, as strata_load takes it). */
int train_groups_check_checkpoint(const train_groups *g, const char *dir, double *saved_decay);

#endif
