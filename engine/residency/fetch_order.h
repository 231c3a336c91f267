/*
 * The fetch order of one step: declared by the trainer (strata_module_order) or recorded during a step
 * and adopted at its end. The prefetcher reads ahead in it; eviction asks how soon a module comes again.
 * The order is cyclic: a step with several micro-batches repeats it, and the next step starts it again,
 * so what comes after its end is its beginning. Private to fetch_order.c.
 */
#ifndef STRATA_ENGINE_FETCH_ORDER_H
#define STRATA_ENGINE_FETCH_ORDER_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/registry.h"

typedef struct fetch_order fetch_order;

strata_status fetch_order_create(fetch_order **out);
void fetch_order_destroy(fetch_order *o);

/* The trainer's declared order (ids already checked against the registry). */
strata_status fetch_order_declare(fetch_order *o, const strata_module_id *ids, size_t count);
/* Notes a fetch of id: records it, and keeps the order in step with it; a divergence drops the order (a
 * warning naming the modules, once per engine) and records the step anew. */
void fetch_order_track(fetch_order *o, const registry *reg, strata_module_id id);
/* At a step boundary: adopts the recording when there is no valid order (or the step ended early). */
void fetch_order_step_boundary(fetch_order *o);

bool fetch_order_valid(const fetch_order *o);
size_t fetch_order_len(const fetch_order *o);
/* The module k fetches from now (k < fetch_order_len; the order must be valid). */
strata_module_id fetch_order_ahead(const fetch_order *o, size_t k);
/* Whether the order expects another fetch in this step (the next one is not the next step's first). */
bool fetch_order_step_has_more(const fetch_order *o);
/* Whether the order expects another fetch of id in the rest of this step (false without a valid order). */
bool fetch_order_step_fetches_again(const fetch_order *o, strata_module_id id);
/* Fetches the order expects in the rest of this step (0 without a valid order). */
size_t fetch_order_step_left(const fetch_order *o);
/* How many fetches from now id is needed again (SIZE_MAX: not in the order, or no valid order). */
size_t fetch_order_next_use(const fetch_order *o, strata_module_id id);

#endif
