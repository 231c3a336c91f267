/*
 * The host cache of an NVMe-homed tier array: chosen ranges of it mirrored in pinned host memory. A read finds
 * the mirror instead of the drive when the whole range it asks for is mirrored and valid. State is kept per
 * TCACHE_BLOCK elements of a range: everything starts invalid.
 *
 * Every write lands in the mirror alone (tcache_hold): its blocks become held, newer than the drive's, and the
 * drive gets them only when its copy is needed -- a read of a range the mirror cannot serve whole, the cache
 * replaced (offload/tier_array.c writes what tcache_next_held finds, then tcache_mark_clean). A write that covers
 * part of a block not yet valid cannot be held (the mirror would hold a mix): it goes to the mirror and the drive
 * (tcache_write), and the blocks it covers whole become clean, equal to the drive's. A mirrored module's or sub-group's update (engine/plan/host_cache.c) then costs the drive no write at all.
 * tcache_forget (after a failed step, around a load) makes the clean blocks invalid, as a write the drive did not
 * take may have reached them, and leaves held blocks valid: they are the only copy.
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
/* Copies buf (elements [first, first + count)) into what the mirror holds of that span, for a write that also
 * goes to the drive; the blocks it covers whole (or up to their range's end) become valid and the drive's. */
void tcache_write(tier_cache *c, size_t first, size_t count, const void *buf);
/* The part [*lo, *hi) of [first, first + count) that the first mirror overlapping it covers; false when no
 * mirror overlaps it. */
bool tcache_next_overlap(const tier_cache *c, size_t first, size_t count, size_t *lo, size_t *hi);
/* Takes the write of buf (elements [first, first + count)) in place of the drive when one mirror holds the whole
 * span and any block it covers in part is valid already; its blocks become held. False (nothing
 * copied) otherwise: the caller writes through. */
bool tcache_hold(tier_cache *c, size_t first, size_t count, const void *buf);
/* The first run of held blocks that overlaps [first, first + count), whole: its elements and their bytes in the
 * mirror. False when none does. */
bool tcache_next_held(const tier_cache *c, size_t first, size_t count, size_t *span_first, size_t *span_count,
                      const void **mem);
/* The held blocks of [first, first + count) are the drive's again (the caller has written them). */
void tcache_mark_clean(tier_cache *c, size_t first, size_t count);
/* Whether one mirror is exactly elements [first, first + count) (valid or not). */
bool tcache_mirrors(const tier_cache *c, size_t first, size_t count);
/* The memory of the mirror that is exactly [first, first + count), to be filled by the caller from the drive and
 * then declared valid with tcache_mark_valid; NULL when no mirror is that range or it holds a block newer than
 * the drive's. */
void *tcache_fill_target(tier_cache *c, size_t first, size_t count);
void tcache_mark_valid(tier_cache *c, size_t first, size_t count);
/* Every block the drive also has invalid (held blocks stay): the next reads of them go to the drive until
 * writes refill the mirror. */
void tcache_forget(tier_cache *c);

/* Bytes mirrored; elements mirrored. */
size_t tcache_bytes(const tier_cache *c);
size_t tcache_numel(const tier_cache *c);

#endif
