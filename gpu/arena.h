/*
 * The carving allocator behind every device's memory: one range [0, size) reserved once,
 * handed out in aligned blocks and given back to a free list that coalesces neighbours.
 *
 * It deals in offsets, not pointers, and keeps its bookkeeping outside the range it manages,
 * because the range may be GPU memory that the host cannot touch. Both device backends use it
 * through gpu/device.c, so the training loop never calls cudaMalloc or mmap.
 *
 * Not thread-safe: the device serialises calls with its own lock.
 */
#ifndef STRATA_GPU_ARENA_H
#define STRATA_GPU_ARENA_H

#include <stddef.h>

#include "strata.h"

typedef struct arena arena;

/* What the arena holds right now; every byte figure counts whole aligned blocks. */
typedef struct arena_stats {
    size_t size_bytes;          /* the whole range */
    size_t used_bytes;          /* in live blocks */
    size_t peak_bytes;          /* highest used_bytes since create or arena_reset_peak() */
    size_t free_bytes;          /* size_bytes - used_bytes */
    size_t largest_free_bytes;  /* the biggest single request that can succeed now */
    size_t used_blocks;
    size_t free_blocks;         /* 1 when everything is free: the free list coalesced fully */
    size_t alloc_count;         /* successful arena_alloc() calls, ever */
} arena_stats;

/* Creates an arena over [0, size_bytes) carved in multiples of align_bytes (a power of two).
 * size_bytes is rounded down to the alignment. STRATA_EINVAL for a bad alignment or a range
 * smaller than one block; STRATA_ENOMEM when the bookkeeping cannot be allocated. */
strata_status arena_create(size_t size_bytes, size_t align_bytes, arena **out);

/* Frees the bookkeeping (not the range: the caller owns that). Live blocks are forgotten. NULL is a no-op. */
void arena_destroy(arena *a);

/* Carves a block of at least bytes (rounded up to the alignment) and returns its offset: the best
 * fit among blocks of the request's size class, else a block of the next larger class. It fails only
 * when no free block at all is large enough. STRATA_EINVAL for bytes == 0; STRATA_EBUDGET when no free block is large enough (the
 * caller words the message: it knows what the range is for); STRATA_ENOMEM when bookkeeping fails. */
strata_status arena_alloc(arena *a, size_t bytes, size_t *offset_out);

/* Returns the block that starts at offset and merges it with free neighbours; *bytes_out (may be
 * NULL) receives its aligned size. STRATA_EINVAL when no live block starts there (a double free
 * or a foreign pointer). */
strata_status arena_free(arena *a, size_t offset, size_t *bytes_out);

/* The aligned size of the live block at offset, or 0 when there is none. */
size_t arena_block_bytes(const arena *a, size_t offset);

void arena_get_stats(const arena *a, arena_stats *out);

/* Starts a new peak measurement from the current use. */
void arena_reset_peak(arena *a);

#endif
