/*
 * The gradient store: the device buffers the trainer writes during backward, their hand-off off the
 * device (one way chosen at finalize, grad_handoff.h), and the fp32 stores they accumulate into (host
 * memory, or NVMe), with which modules got gradients since the last step. With the delayed update there
 * are two stores: the trainer accumulates into the front one while the optimizer consumes the other.
 * Private to grads.c.
 */
#ifndef STRATA_ENGINE_GRADS_H
#define STRATA_ENGINE_GRADS_H

#include <stdbool.h>
#include <stdint.h>

#include "offload/tier_array.h"
#include "strata.h"

typedef struct grad_store grad_store;
struct strata_engine;

/* Built by finalize after the tiers: the store(s) in the planned gradient tier, zeroed. */
strata_status grads_create(struct strata_engine *e, grad_store **out);
/* Waits for the hand-offs in flight, then frees the device buffers and the stores. NULL is a no-op. */
void grads_destroy(struct strata_engine *e, grad_store *g);

/* Waits for every hand-off and reports the first failure since the last call. */
strata_status grads_drain(struct strata_engine *e);
/* grads_drain, then waits for the work the hand-offs started (the updates of step in backward) and reports its
 * first failure: afterwards the hand-offs hold no staging. */
strata_status grads_settle(struct strata_engine *e);
/* Whether module id's device gradient buffers were taken (strata_grad_data) and not yet handed over. */
bool grads_has_buffers(const grad_store *g, strata_module_id id);
/* A released module's gradient buffer that was never handed over: discarded (with a warning, once). */
void grads_discard(struct strata_engine *e, strata_module_id id);

/* The store the trainer's gradients go to now; grads_flip makes the other one the front (the delayed
 * update hands the filled one to the optimizer). */
int grads_front(const grad_store *g);
void grads_flip(grad_store *g);
tier_array *grads_store(grad_store *g, int index);
/* Per module: how often gradients arrived in store index since its last step (0 = none; counts stop at 255);
 * grads_consumed clears it. */
const uint8_t *grads_touched(const grad_store *g, int index);
void grads_consumed(grad_store *g, int index);
/* Counts one hand-over of a module's gradients into store index (or, from ranks.c, zeros every rank agreed on). */
void grads_mark_touched(grad_store *g, int index, strata_module_id id);
/* A module with gradients in the front store that no step has consumed, or STRATA_INVALID_ID. */
strata_module_id grads_first_unconsumed(const grad_store *g);
/* Forgets every accumulation (a checkpoint was loaded): store 0 is the front, nothing touched. */
void grads_reset(grad_store *g);

#endif
