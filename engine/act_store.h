/*
 * Offloaded activations (strata_act_push / pop / drop): the trainer's activations kept from forward to backward
 * in strata.offload_activations's tier instead of device memory.
 *
 * Keeping. A push copies the device bytes off on the "act out" stream after the trainer's work so far: into a
 * pinned host store (host tier), or into one of two pinned staging buffers whose NVMe write a host function
 * queues once the copy is done (NVMe tier). The kept copies sit at increasing offsets of the store (or of one
 * swap extent), each rounded up to PLAN_ACT_ALIGN; the space is reused from the top down as the trainer drops
 * them, so a step's pushes and backward's drops in reverse order never fragment it.
 *
 * Restoring. A pop needs a device copy: a block of device memory from the arena, filled on the "act in" stream
 * from the host store, or from the drive through one of two pinned read buffers (the read's completion queues
 * the copy, as a parameter fetch does). After each pop the store starts restoring the activations the next pops
 * will ask for, while the device holds fewer than PLAN_ACT_RESTORED of them: those pushed just before it, walking
 * down the push order (a backward pops in the reverse of it), or, where the trainer pops in another order that
 * repeats (a layer-wise pass, autograd's order of saved tensors), the order the last round popped in.
 *
 * Private to act_store.c; engine.c's public calls come here.
 */
#ifndef STRATA_ENGINE_ACT_STORE_H
#define STRATA_ENGINE_ACT_STORE_H

#include <stdint.h>

#include "engine/plan/plan.h"
#include "strata.h"

typedef struct act_store act_store;
struct strata_engine;

/* What the stats report (strata_stats' act_* fields). */
typedef struct act_counters {
    uint64_t pushes, offload_bytes, restore_bytes, stall_ns;
    size_t kept_peak_bytes, device_peak_bytes;
} act_counters;

/* Built by finalize after the tiers and the deferred frees, for the tier the plan placed the activations in (no
 * store when it is the device: strata.offload_activations "none"). */
strata_status act_store_create(struct strata_engine *e, strata_tier tier, const plan *pl, act_store **out);
/* Waits for every copy and I/O in flight, then frees everything. NULL is a no-op. */
void act_store_destroy(struct strata_engine *e, act_store *s);

/* Activations pushed and not yet dropped (strata_step refuses while there are any). */
size_t act_store_kept(const act_store *s);
void act_store_counters(const act_store *s, act_counters *out);

#endif
