/*
 * The host cache of an NVMe-homed tier array: chosen ranges of it mirrored in pinned host memory and written
 * through. Every write lands in the mirror and on the drive, so NVMe always holds the newest state (checkpoints
 * and a dropped cache lose nothing); a read finds the mirror instead of the drive when the whole range it asks
 * for is mirrored and valid. Validity is kept per TCACHE_BLOCK elements of a range: everything starts invalid,
 * a write makes the blocks it covers valid, tcache_forget (after a failed step or around a load) makes all of
 * them invalid again, so a mirror never serves what the drive does not hold.
 *
 * Not thread-safe: the engine already orders a range's writes before its reads (as it must for the drive).
 */
#ifndef STRATA_OFFLOAD_TIER_CACHE_H
#define STRATA_OFFLOAD_TIER_CACHE_H

#include <stdbool.h>
#include <stddef.h>

#include "gpu/device.h"

#define TCACHE_BLOCK ((size_t)4096) /* elements: the module and sub-group alignment */

typedef struct tier_cache tier_cache;

typedef struct tcache_range {
    size_t first, count;  /* elements of the array */
} tcache_range;

/* Mirrors ranges (sorted by first, disjoint) of an array of elem_bytes elements in pinned host memory of dev,
 * all invalid. STRATA_ENOMEM / the allocator's status naming what (the array) when the memory is not there. */
strata_status tcache_create(device *dev, const tcache_range *ranges, size_t n, size_t elem_bytes, const char *what,
                            tier_cache **out);
/* Frees the mirror; NULL is a no-op. */
void tcache_destroy(tier_cache *c, device *dev);

/* The mirrored copy of elements [first, first + count) when one range holds all of them, valid; else NULL. */
const void *tcache_lookup(const tier_cache *c, size_t first, size_t count);
/* Copies buf (elements [first, first + count)) into what the mirror holds of that span; the blocks it covers
 * whole (or up to their range's end) become valid. */
void tcache_write(tier_cache *c, size_t first, size_t count, const void *buf);
/* Whether one mirror is exactly elements [first, first + count) (valid or not). */
bool tcache_mirrors(const tier_cache *c, size_t first, size_t count);
/* The memory of the mirror that is exactly [first, first + count), to be filled by the caller from the drive and
 * then declared valid with tcache_mark_valid; NULL when no mirror is that range. */
void *tcache_fill_target(tier_cache *c, size_t first, size_t count);
void tcache_mark_valid(tier_cache *c, size_t first, size_t count);
/* Every block invalid: the next reads go to the drive until writes refill the mirror. */
void tcache_forget(tier_cache *c);

/* Bytes mirrored; elements mirrored. */
size_t tcache_bytes(const tier_cache *c);
size_t tcache_numel(const tier_cache *c);

#endif
