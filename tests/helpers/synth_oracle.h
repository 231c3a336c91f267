/*
 * The synthetic model (synth.h) trained without strata, the oracle of the engine's optimizer tests: plain arrays in
 * the engine's layout (modules padded to PLAN_MODULE_ALIGN, parameters on PLAN_PARAM_ALIGN, a parameter group boundary
 * on PLAN_GROUP_ALIGN, frozen modules after the trained ones), the same layer math, the gradients of a step's
 * micro-batches summed in fp32 in their order as the engine's store sums them, and each parameter group's run updated
 * by the reference kernel of the moments' form (adam_step_ref, adam_step_bf16_ref with the rounding key step_moments_key
 * gives, adam_step_q8_ref) with its group's constants. Cutting a run into sub-groups or tiles changes no bit (the update
 * is elementwise, bf16 draws its rounding by element index, 8-bit blocks never span runs), so the engine must give its
 * bits, whatever its placement, slots and threads.
 */
#ifndef STRATA_TEST_SYNTH_ORACLE_H
#define STRATA_TEST_SYNTH_ORACLE_H

#include "synth.h"

/* Every parameter's master weights after o->steps steps (concatenated as synth_train returns them, malloc'd), with
 * cfg's optimizer (group 0) and o->groups / o->frozen_layers; fp32 parameters, world 1, no clipping. */
float *synth_oracle(const synth_opts *o, const strata_config *cfg, strata_moments form, size_t *n);

/* Three groups for a model of `layers`: layer l's weight in group 1 (lr 3e-3, decay 0.1, betas 0.9 / 0.95), its bias
 * in group 2 (lr 2e-2, no decay, betas 0.8 / 0.99, eps 1e-6), the last layer's weight in group 0 (the config's):
 * every module holds two groups. */
synth_groups synth_three_groups(int layers);

#endif
