/*
 * Residency: which modules have a device copy, the fetches that bring them there, and the prefetch window.
 * A module's parameters come to the device from their home tier: host (one host->device copy) or NVMe
 * (io_uring read into a pinned staging buffer, then the copy), on the h2d stream, with the module's `ready`
 * event recorded after. The prefetcher follows the fetch order and keeps the modules that come next in
 * flight, up to prefetch_bytes ahead and never more than max_live_bytes resident. Private to residency.c.
 */
#ifndef STRATA_ENGINE_RESIDENCY_H
#define STRATA_ENGINE_RESIDENCY_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/registry.h"

typedef struct residency residency;
struct strata_engine;

/* Built by finalize after the tiers: one entry per registered module; with device-tier parameters every
 * module points into the parameter array and is never fetched. */
strata_status residency_create(struct strata_engine *e, residency **out);
/* Drops every device copy (waiting for fetches in flight); the buffers go to the engine's deferred frees. */
void residency_destroy(struct strata_engine *e, residency *r);

bool residency_held(const residency *r, strata_module_id id);
/* A module the trainer still holds, or STRATA_INVALID_ID. */
strata_module_id residency_first_held(const residency *r);
/* The parameter if its module is held; else NULL with STRATA_ESTATE naming the call (what). */
const reg_param *residency_held_param(struct strata_engine *e, strata_param_id id, const char *what);

/* Drops every device copy of the parameters (they changed: a published update, a load); device-tier
 * modules point into the current front copy. */
void residency_invalidate_all(struct strata_engine *e);
/* Frees the device copy of the unheld module used furthest in the future (room for a gradient buffer); false
 * when there is none. */
bool residency_evict_one(struct strata_engine *e);
/* Starts fetches of the modules that come next in the order, within the window. */
strata_status residency_prefetch(struct strata_engine *e);

void residency_stats(const residency *r, uint64_t *fetches, uint64_t *prefetch_hits, uint64_t *stall_ns);

#endif
