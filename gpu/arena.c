/*
 * Segregated best-fit carving with coalescing free lists (see arena.h).
 *
 * Every block, live or free, sits on one list in address order, so freeing a block finds its
 * neighbours in O(1) and merges them. Free blocks also sit on one of 64 lists by size class
 * (class c holds sizes in [align * 2^c, align * 2^(c+1))), with a bitmap of the non-empty ones:
 * a request searches its own class for the best fit and otherwise takes a block of the next larger
 * non-empty class, which always fits, so a fragmented arena does not make every request walk every
 * hole. Live blocks are found by offset through an open-addressing hash table, so arena_free()
 * never scans, however many parameters the engine holds.
 */
#include "gpu/arena.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "base/error.h"
#include "base/util.h"

typedef struct block block;
struct block {
    size_t off, size;
    bool free;
    block *prev, *next;   /* address order, all blocks */
    block *fprev, *fnext; /* free blocks only */
};

struct arena {
    size_t size, align;
    size_t used, peak, allocs;
    size_t used_blocks, free_blocks;
    block *head;  /* lowest address */
    block *free_heads[64];
    uint64_t nonempty; /* bit c: free_heads[c] has a block */
    block **table; /* live blocks by offset; linear probing; capacity a power of two */
    size_t table_cap;
};

/* ---------------------------------------------------------------- live-block table */

static size_t slot_of(const arena *a, size_t off)
{
    /* Offsets are multiples of the alignment: drop those zero bits before mixing. */
    uint64_t x = (uint64_t)(off / a->align) * 0x9e3779b97f4a7c15ull;
    return (size_t)(x >> 17) & (a->table_cap - 1);
}

static void table_put(arena *a, block *b)
{
    size_t i = slot_of(a, b->off);
    while (a->table[i])
        i = (i + 1) & (a->table_cap - 1);
    a->table[i] = b;
}

static size_t table_find(const arena *a, size_t off)
{
    if (a->table_cap == 0)
        return SIZE_MAX;
    for (size_t i = slot_of(a, off);; i = (i + 1) & (a->table_cap - 1)) {
        if (!a->table[i])
            return SIZE_MAX;
        if (a->table[i]->off == off)
            return i;
    }
}

/* Removes slot i and shifts later members of its probe run back, so lookups never need tombstones. */
static void table_remove(arena *a, size_t i)
{
    size_t mask = a->table_cap - 1;
    a->table[i] = NULL;
    for (size_t j = (i + 1) & mask; a->table[j]; j = (j + 1) & mask) {
        size_t home = slot_of(a, a->table[j]->off);
        /* Move j into the hole at i unless its home lies cyclically in (i, j]. */
        bool stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            a->table[i] = a->table[j];
            a->table[j] = NULL;
            i = j;
        }
    }
}

/* Keeps the load at most one half so probe runs stay short. */
static strata_status table_reserve(arena *a)
{
    if ((a->used_blocks + 1) * 2 <= a->table_cap)
        return STRATA_OK;
    size_t old_cap = a->table_cap;
    block **old = a->table;
    size_t cap = old_cap ? old_cap * 2 : 64;
    block **t = calloc(cap, sizeof *t);
    if (!t)
        return err_set(STRATA_ENOMEM, "arena: cannot grow the block table to %zu entries", cap);
    a->table = t;
    a->table_cap = cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i])
            table_put(a, old[i]);
    free(old);
    return STRATA_OK;
}

/* ---------------------------------------------------------------- free list */

static unsigned class_of(const arena *a, size_t size)
{
    return 63u - (unsigned)__builtin_clzll((unsigned long long)(size / a->align));
}

static void free_link(arena *a, block *b)
{
    unsigned c = class_of(a, b->size);
    b->free = true;
    b->fprev = NULL;
    b->fnext = a->free_heads[c];
    if (b->fnext)
        b->fnext->fprev = b;
    a->free_heads[c] = b;
    a->nonempty |= 1ull << c;
    a->free_blocks++;
}

/* Takes b off its class list; its size must not have changed since free_link(). */
static void free_unlink(arena *a, block *b)
{
    unsigned c = class_of(a, b->size);
    if (b->fprev)
        b->fprev->fnext = b->fnext;
    else
        a->free_heads[c] = b->fnext;
    if (b->fnext)
        b->fnext->fprev = b->fprev;
    if (!a->free_heads[c])
        a->nonempty &= ~(1ull << c);
    b->fprev = b->fnext = NULL;
    b->free = false;
    a->free_blocks--;
}

/* Merges next (free, already unlinked from its class) into b, its address-order predecessor. */
static void absorb_next(block *b)
{
    block *n = b->next;
    b->size += n->size;
    b->next = n->next;
    if (n->next)
        n->next->prev = b;
    free(n);
}

/* The best fit in need's own class, else any block of the next larger non-empty class. */
static block *find_fit(const arena *a, size_t need)
{
    unsigned c = class_of(a, need);
    block *best = NULL;
    for (block *b = a->free_heads[c]; b; b = b->fnext) {
        if (b->size >= need && (!best || b->size < best->size)) {
            best = b;
            if (b->size == need)
                break;
        }
    }
    if (best || c == 63)
        return best;
    uint64_t above = a->nonempty & (~0ull << (c + 1));
    return above ? a->free_heads[__builtin_ctzll(above)] : NULL;
}

/* ---------------------------------------------------------------- API */

strata_status arena_create(size_t size_bytes, size_t align_bytes, arena **out)
{
    *out = NULL;
    if (align_bytes == 0 || (align_bytes & (align_bytes - 1)))
        return err_set(STRATA_EINVAL, "arena: alignment %zu is not a power of two", align_bytes);
    size_t size = size_bytes / align_bytes * align_bytes;
    if (size == 0)
        return err_set(STRATA_EINVAL, "arena: size %zu bytes is smaller than one %zu-byte block", size_bytes,
                       align_bytes);
    arena *a = calloc(1, sizeof *a);
    block *b = calloc(1, sizeof *b);
    if (!a || !b) {
        free(a);
        free(b);
        return err_set(STRATA_ENOMEM, "arena: out of host memory for bookkeeping");
    }
    a->size = size;
    a->align = align_bytes;
    b->size = size;
    a->head = b;
    free_link(a, b);
    *out = a;
    return STRATA_OK;
}

void arena_destroy(arena *a)
{
    if (!a)
        return;
    for (block *b = a->head, *n; b; b = n) {
        n = b->next;
        free(b);
    }
    free(a->table);
    free(a);
}

strata_status arena_alloc(arena *a, size_t bytes, size_t *offset_out)
{
    if (bytes == 0)
        return err_set(STRATA_EINVAL, "arena: a request of 0 bytes");
    if (bytes > a->size)
        return err_set(STRATA_EBUDGET, "arena: %zu bytes asked of a %zu-byte range", bytes, a->size);
    size_t need = align_up(bytes, a->align);
    block *best = find_fit(a, need);
    if (!best)
        return err_set(STRATA_EBUDGET, "arena: no free block of %zu bytes", need);
    ERR_CHECK(table_reserve(a));

    block *use = best;
    if (best->size > need) {
        /* Split: the front becomes the live block, the rest stays free (in the class of its new size). */
        use = calloc(1, sizeof *use);
        if (!use)
            return err_set(STRATA_ENOMEM, "arena: out of host memory for bookkeeping");
        free_unlink(a, best);
        use->off = best->off;
        use->size = need;
        use->prev = best->prev;
        use->next = best;
        if (best->prev)
            best->prev->next = use;
        else
            a->head = use;
        best->prev = use;
        best->off += need;
        best->size -= need;
        free_link(a, best);
    } else {
        free_unlink(a, best);
    }
    table_put(a, use);
    a->used_blocks++;
    a->used += need;
    a->peak = MAX(a->peak, a->used);
    a->allocs++;
    *offset_out = use->off;
    return STRATA_OK;
}

strata_status arena_free(arena *a, size_t offset, size_t *bytes_out)
{
    size_t slot = table_find(a, offset);
    if (slot == SIZE_MAX)
        return err_set(STRATA_EINVAL, "arena: no live block at offset %zu (double free or foreign pointer)", offset);
    block *b = a->table[slot];
    table_remove(a, slot);
    a->used_blocks--;
    a->used -= b->size;
    if (bytes_out)
        *bytes_out = b->size;

    if (b->next && b->next->free) {
        free_unlink(a, b->next);
        absorb_next(b);
    }
    if (b->prev && b->prev->free) {
        b = b->prev;
        free_unlink(a, b);
        absorb_next(b);
    }
    free_link(a, b);
    return STRATA_OK;
}

size_t arena_block_bytes(const arena *a, size_t offset)
{
    size_t slot = table_find(a, offset);
    return slot == SIZE_MAX ? 0 : a->table[slot]->size;
}

void arena_get_stats(const arena *a, arena_stats *out)
{
    /* The largest free block is in the highest non-empty class. */
    size_t largest = 0;
    if (a->nonempty)
        for (const block *b = a->free_heads[63 - __builtin_clzll(a->nonempty)]; b; b = b->fnext)
            largest = MAX(largest, b->size);
    *out = (arena_stats){
        .size_bytes = a->size,
        .used_bytes = a->used,
        .peak_bytes = a->peak,
        .free_bytes = a->size - a->used,
        .largest_free_bytes = largest,
        .used_blocks = a->used_blocks,
        .free_blocks = a->free_blocks,
        .alloc_count = a->allocs,
    };
}

void arena_reset_peak(arena *a)
{
    a->peak = a->used;
}
