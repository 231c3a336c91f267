/*
 * Step in backward (strata.step_in_backward): with gradient accumulation 1, a module's optimizer update runs as
 * soon as its gradients are off the device and the trainer has released it, on a thread of its own, while the
 * trainer goes on with the backward of the modules before it. Adam reads the gradients straight from the pinned
 * staging of the hand-off (in the parameter dtype, which converts to fp32 exactly), so the fp32 gradient store is
 * never written (finalize does not even allocate it) and with the optimizer state on NVMe the store's
 * read-modify-write is gone. Bit-identical to the ordinary step: the same fp32 gradients, the same constants,
 * the same per-element update. Private to step_in_backward.c.
 *
 * The hand-overs reach it as one of the gradient hand-off's ways (grad_handoff.h, grad_in_backward_create).
 *
 * The order of one step:
 *   strata_step_begin(lr)  the step's constants (step count, bias corrections, lr) are fixed here;
 *   grads_ready(m)         the copy off the device is queued; m's update waits for its release;
 *   release(m)             m's update is queued (its new parameters may now be written to their home);
 *   strata_step            waits for the updates, updates the modules that got no gradients with zero gradients
 *                          (as the ordinary step does), and publishes the new parameters.
 * A module used twice in a step (the GPT embeddings, tied to the head) is handed over at each use: a hand-over
 * after which the fetch order (declared, or recorded by an earlier step) fetches the module again is summed in
 * fp32 into a buffer of the module's own, as the ordinary step's store would sum it, and the update starts from
 * the sum at the last one. Without a valid order every hand-over is the last, and a second one is refused.
 * With gradient clipping or fp16 the updates speculate that clipping will not trigger and no gradient overflows
 * (step_rollback.h): they write a second copy of the optimizer state (and with clipping keep their gradients), and
 * strata_step, once the global norm is known (summed as the ordinary step sums it: each module's statistics over
 * its pieces, in module order), commits them, redoes them clipped, or (an fp16 overflow) skips the step, putting
 * the parameters they wrote back.
 * With strata.norm_pass the trainer runs the step's forward and backward twice instead: in the first (the norm pass)
 * each hand-over only adds to the statistics, strata_norm_pass_end decides the step from the global norm, and in the
 * second each update runs as the ordinary step would run it, clipped, after its statistics are found to be the norm
 * pass's. Nothing speculates, so nothing is kept: the optimizer state is written in place (and host-cached), and a
 * step costs one more forward and backward instead of the kept gradients' round trip.
 * With several ranks (stages 2 and 3) each hand-over's gradients are reduce-scattered on the comm's thread, started
 * by the trainer's in its order, and the update takes this rank's part (the worker waits for it).
 * Refused at finalize (step_in_backward_check_config): the delayed update, several ranks at stages 0 and 1 (they
 * reduce the whole gradient store at the step) and a partial optimizer offload.
 */
#ifndef STRATA_ENGINE_STEP_IN_BACKWARD_H
#define STRATA_ENGINE_STEP_IN_BACKWARD_H

#include <stdbool.h>

#include "engine/registry.h"
#include "strata.h"

typedef struct step_in_backward step_in_backward;
struct strata_engine;

/* STRATA_ECONFIG naming the key and value of a setting step in backward cannot run with; OK otherwise. */
strata_status step_in_backward_check_config(const struct strata_engine *e);
/* Built by finalize after the step pipeline (its step count) when strata.step_in_backward is on. */
strata_status step_in_backward_create(struct strata_engine *e, step_in_backward **out);
/* Waits for the update in flight, stops the thread and gives every buffer back. NULL is a no-op. */
void step_in_backward_destroy(struct strata_engine *e, step_in_backward *s);

/* strata_step_begin's part: the step is open, with the parameter groups' values frozen (lr > 0: group 0's lr, as
 * strata_step_args gives it) and the gradients scaled by loss_scale; STRATA_ESTATE when one is open already. */
strata_status step_in_backward_begin(step_in_backward *s, double lr, double loss_scale);
/* Whether a step is begun and not yet finished. */
bool step_in_backward_open(const step_in_backward *s);
/* Group 0's lr the begun step's updates run with. */
double step_in_backward_lr(const step_in_backward *s);
/* The trainer released id: a hand-over waiting for it is queued for its update. */
strata_status step_in_backward_released(struct strata_engine *e, strata_module_id id);
/* strata_norm_pass_end's part (strata.norm_pass), once the norm pass's hand-offs are done: the step decided from the
 * global norm (*grad_norm), as the ordinary step decides it; the second backward's updates run with it. */
strata_status step_in_backward_norm_pass_end(struct strata_engine *e, double *grad_norm);
/* Whether the begun step's hand-overs have started (its step count and constants are fixed, and updates or the norm
 * pass's statistics depend on the state as it was): a strata_load now would mix two states. */
bool step_in_backward_under_way(const step_in_backward *s);
/* strata_step's part: checks args against the begun step, waits for the updates, with gradient clipping decides it
 * (*grad_norm: the norm, else -1) and redoes the updates when it triggers, updates the modules without gradients,
 * counts the step. The step is over (begun again by the next strata_step_begin) even on failure. */
strata_status step_in_backward_finish(struct strata_engine *e, const strata_step_args *args, double *grad_norm,
                                      bool *skipped);

#endif
