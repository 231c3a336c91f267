/*
 * What the host cache mirrors (offload/tier_cache.h is how): within the plan's cache bytes, the parameter modules
 * the trainer fetches most per step, soonest first (the fetch order once it is known, else the modules' order),
 * then the optimizer state sub-group by sub-group in the step's order. Chosen at finalize, chosen again once a
 * step's fetch order is known if that changes the choice. The mirrors hold their writes (the drive gets a mirrored
 * module's or sub-group's update only when a read needs the drive's copy or the choice changes). After a failed
 * step and around a load they are forgotten: what they share with the drive is dropped (a write the drive did not
 * take may have reached them), what only they hold is kept, the newest copy.
 */
#ifndef STRATA_ENGINE_HOST_CACHE_H
#define STRATA_ENGINE_HOST_CACHE_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/plan/plan.h"

struct strata_engine;

/* At finalize, after the arrays exist and before the initial state is written (which fills the mirrors). */
strata_status host_cache_open(struct strata_engine *e, const plan *pl);
/* At a step boundary with no fetch in flight: adopts the fetch order's choice of parameter modules if it differs,
 * filling the new mirrors from NVMe. */
strata_status host_cache_follow_order(struct strata_engine *e);
/* Every mirror invalid (a failed step, a load). */
void host_cache_forget(struct strata_engine *e);
/* Bytes mirrored now. */
size_t host_cache_bytes(const struct strata_engine *e);

#endif
