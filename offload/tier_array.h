/*
 * A flat array of model state (numel elements of elem_bytes) living in one tier: device memory,
 * host memory or an NVMe swap extent. The engine keeps every state class (parameters, gradients,
 * master weights, Adam moments) as one such array over the whole per-rank partition, so a module
 * or an optimizer sub-group is always one contiguous range of it.
 */
#ifndef STRATA_OFFLOAD_TIER_ARRAY_H
#define STRATA_OFFLOAD_TIER_ARRAY_H

#include <stdbool.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/device.h"
#include "nvme/swap.h"
#include "offload/tier_cache.h"

/* What the NVMe tier moved, counted where it moves (any thread): bytes read from and written to the drive, reads
 * the host cache served instead (count and bytes), and bytes of writes it held instead of the drive. */
typedef struct tier_counters {
    _Atomic uint64_t nvme_read_bytes, nvme_write_bytes;
    _Atomic uint64_t cache_hits, cache_read_bytes, cache_held_bytes;
} tier_counters;

/* What a tier array needs from the engine to allocate and move its bytes. */
typedef struct tier_env {
    device *dev;
    dev_stream *copy_stream;  /* for synchronous device<->host copies outside the hot path */
    nvme_swap *swap;          /* NULL when nothing lives on NVMe */
    bool host_addressable_device; /* device memory is host memory (host backend) */
    tier_counters *ctr;       /* may be NULL */
} tier_env;

typedef struct tier_array {
    strata_tier tier;
    size_t numel, elem_bytes;
    void *mem;        /* DEVICE: device memory; HOST: pinned host memory, or ordinary memory (cpu_only) */
    bool cpu_only;    /* HOST: allocated by tarr_alloc_cpu, not pinned */
    swap_extent ext;  /* NVME */
    tier_cache *cache; /* NVME: the ranges mirrored in host memory (tarr_cache), or NULL */
    const char *what; /* "parameters", "master weights", ... for messages */
} tier_array;

/* Allocates the array in tier (device arena, pinned host memory or a swap extent). Contents are
 * undefined. Errors are the allocator's (STRATA_EBUDGET, STRATA_ENOMEM, STRATA_ENOSPC) with what named. */
strata_status tarr_alloc(tier_array *a, const tier_env *env, strata_tier tier, size_t numel, size_t elem_bytes,
                         const char *what);

/* tarr_alloc for an array that only the CPU reads and writes in host memory: the optimizer state and the gradient
 * store, which the step, the hand-off and the checkpoints reach with memcpy, the Adam kernels and the drive, never with
 * a device copy on the hot path. In host memory it is ordinary memory on huge pages (base/big_alloc.h), not pinned:
 * pinning (cudaHostAlloc) faults in and locks every page on the calling thread at allocation, about a hundred GB for a
 * 7B model's optimizer state, and its 4 KiB pages cost Adam's streaming about a fifth of its rate; ordinary pages are
 * first touched by whoever writes them first, the initial state's copies spread over the cores. Other tiers as
 * tarr_alloc. A device copy that does reach such an array is still correct (CUDA copies pageable memory, only
 * synchronously); where that copy is hot, pin the range it copies (dev_host_register), as Twin-Flow does. */
strata_status tarr_alloc_cpu(tier_array *a, const tier_env *env, strata_tier tier, size_t numel, size_t elem_bytes,
                             const char *what);

/* Gives an NVMe array a host cache of the given ranges (tier_cache.h; sorted, disjoint), replacing any it had
 * (whose held blocks are written to the drive first): reads of a whole mirrored valid range come from host
 * memory; a write's mirrored parts stay there until a read of a range the mirrors cannot serve, or the cache's
 * replacement, hands them to the drive. The allocator's status naming the array when the memory is not there (the
 * array keeps no cache then), the drive's when a held block cannot be written. n 0 drops the cache. */
strata_status tarr_cache(tier_array *a, const tier_env *env, const tcache_range *ranges, size_t n);

/* Fills the cache's mirror of exactly [first, first + count) from the drive (waits) and makes it valid. */
strata_status tarr_cache_fill(tier_array *a, const tier_env *env, size_t first, size_t count);

/* The host copy of elements [first, first + count) when the array's cache holds them valid (counted as a cache
 * read), else NULL: a fetch copies straight from there instead of staging a drive read. */
const void *tarr_cached(const tier_array *a, const tier_env *env, size_t first, size_t count);

/* Frees it (and its cache); nothing may be in flight on it. Safe on a zeroed array. */
void tarr_free(tier_array *a, const tier_env *env);

/* The host pointer of element index, or NULL when the host cannot address the array's tier
 * (NVMe, or device memory of a real GPU). */
void *tarr_host_ptr(const tier_array *a, const tier_env *env, size_t index);

/* Bytes of count elements (helper for ranges). */
static inline size_t tarr_bytes(const tier_array *a, size_t count)
{
    return count * a->elem_bytes;
}

/* Reads elements [first, first + count) into buf (host memory; pinned and 4 KiB-aligned when the
 * tier is NVMe). NVMe reads are queued on w (wait with io_wait_wait), unless the host cache holds the range:
 * then, as for the other tiers, the copy is done on return. A read the cache cannot serve whole first writes
 * the held blocks it overlaps to the drive (waits). The range must be 4 KiB-aligned in bytes for NVMe. */
strata_status tarr_read(const tier_array *a, const tier_env *env, size_t first, size_t count, void *buf, io_wait *w);

/* Writes buf into elements [first, first + count), as tarr_read; on NVMe the parts the host cache mirrors stay
 * there (done on return) and only the rest is queued for the drive. */
strata_status tarr_write(tier_array *a, const tier_env *env, size_t first, size_t count, const void *buf,
                         io_wait *w);

/* As tarr_read / tarr_write, returning when the transfer is done (its own wait for NVMe); for the paths that
 * are not pipelined: the collectives' exchanges, inspection. */
strata_status tarr_read_sync(const tier_array *a, const tier_env *env, size_t first, size_t count, void *buf);
strata_status tarr_write_sync(tier_array *a, const tier_env *env, size_t first, size_t count, const void *buf);

#endif