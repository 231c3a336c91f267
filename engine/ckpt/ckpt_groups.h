/*
 * The parameter groups in a checkpoint's manifest ("param_groups"): each group's name and values, and which
 * parameters it holds (every one not listed is in group 0). A load checks that the engine made the same groups with
 * the same members, then takes the saved values, as torch's Optimizer.load_state_dict takes its param_groups; a
 * manifest without groups (saved before they existed) loads into any groups, which keep their values.
 */
#ifndef STRATA_ENGINE_CKPT_GROUPS_H
#define STRATA_ENGINE_CKPT_GROUPS_H

#include "strata.h"

/* The engine's groups as the manifest's "param_groups" JSON text (malloc'ed into *out); STRATA_ENOMEM. */
strata_status ckpt_groups_text(strata_engine *e, char **out);
/* STRATA_ECONFIG naming dir, the group and the parameter when text (NULL: no groups saved) does not fit the engine's
 * groups; STRATA_ECORRUPT when it is malformed. */
strata_status ckpt_groups_check(strata_engine *e, const char *text, const char *dir);
/* After a load that passed ckpt_groups_check: the groups take the saved values. */
void ckpt_groups_apply(strata_engine *e, const char *text);

#endif
