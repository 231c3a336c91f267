/* Checks a whole strata_config: every field's range (for configs filled from C) and the
 * relations between fields that no single key shows. */
#ifndef STRATA_ENGINE_CONFIG_H
#define STRATA_ENGINE_CONFIG_H

#include "engine/config/config_report.h"
#include "strata.h"

/* Adds every problem of cfg (a whole struct of this library's layout) to report. */
void cfg_validate_into(const strata_config *cfg, cfg_report *report);

/* The versioning rule of strata_config (see strata.h): the caller's struct may be any released layout, whose
 * size it carries in struct_size. cfg_from_caller reads only that prefix into out, giving later fields their
 * defaults; false (with the problem in report) for a size this library does not know. cfg_to_caller writes the
 * prefix the caller's struct has back into it. */
bool cfg_from_caller(const strata_config *in, strata_config *out, cfg_report *report);
void cfg_to_caller(const strata_config *full, strata_config *out);
/* The optimizer's doubles beside its fp32 fields (strata.h, lr_exact): cfg_set_exact stores the exact value of the
 * float field at single_offset (no-op for any other field); cfg_exact_of is that double (NULL for other fields);
 * cfg_reconcile_exact makes every double whose float no longer agrees take the float's value (cfg_from_caller
 * does it: a float set from C, or a struct that predates the doubles, means the float). */
void cfg_set_exact(strata_config *cfg, size_t single_offset, double value);
const double *cfg_exact_of(const strata_config *cfg, size_t single_offset);
void cfg_reconcile_exact(strata_config *cfg);
/* The Adam hyperparameters of a reconciled config (a whole struct of this layout) at lr. */
strata_adam_hparams cfg_adam_hparams(const strata_config *cfg, double lr);
/* Whether a step in backward's updates speculate (engine/step/step_rollback.h): with gradient clipping or fp16 they
 * cannot know the global norm (or an overflow) when they run, unless strata.norm_pass measured it first. With
 * clipping they also keep their gradients for a redo (cfg_keeps_grads). */
bool cfg_speculates(const strata_config *cfg);
bool cfg_keeps_grads(const strata_config *cfg);
/* cfg_from_caller, then cfg_validate_into: STRATA_ECONFIG with every problem as the thread's error. */
strata_status config_from_caller(const strata_config *in, strata_config *out);
/* strata.optimizer_moments as the JSON spells it: "fp32", "bf16", "8bit" ("?" outside the enum), for messages. */
const char *cfg_moments_name(strata_moments moments);

#endif
