/* A host mirror of chosen ranges of an NVMe array that holds its writes; see tier_cache.h. */
#include "offload/tier_cache.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/util.h"

/* A block's state: not valid, valid and equal to the drive's, or valid and newer than the drive's (held). */
enum { BLOCK_INVALID = 0, BLOCK_CLEAN = 1, BLOCK_HELD = 2 };

typedef struct mirror {
    size_t first, count;
    char *mem;
    uint8_t *state;        /* one BLOCK_* per TCACHE_BLOCK of the range */
    size_t nblocks;
} mirror;

struct tier_cache {
    size_t elem_bytes, numel;
    size_t n;
    mirror m[];
};

strata_status tcache_create(device *dev, const tcache_range *ranges, size_t n, size_t elem_bytes, const char *what,
                            tier_cache **out)
{
    *out = NULL;
    tier_cache *c = calloc(1, sizeof *c + n * sizeof c->m[0]);
    if (!c)
        return err_set(STRATA_ENOMEM, "%s: out of memory for the host cache's table", what);
    c->elem_bytes = elem_bytes;
    for (size_t i = 0; i < n; i++) {
        mirror *m = &c->m[c->n++]; /* counted first: destroy frees whatever it holds */
        m->first = ranges[i].first;
        m->count = ranges[i].count;
        m->nblocks = (m->count + TCACHE_BLOCK - 1) / TCACHE_BLOCK;
        m->state = calloc(m->nblocks ? m->nblocks : 1, 1);
        strata_status st = m->state ? dev_host_alloc(dev, m->count * elem_bytes, (void **)&m->mem) : STRATA_ENOMEM;
        if (st != STRATA_OK) {
            char detail[ERR_MSG_BYTES - 96];
            snprintf(detail, sizeof detail, "%s", m->state ? err_last() : "out of memory");
            m->mem = NULL;
            tcache_destroy(c, dev);
            return err_set(st, "%s: the host cache of %zu elements: %s", what, ranges[i].count, detail);
        }
        c->numel += m->count;
    }
    *out = c;
    return STRATA_OK;
}

void tcache_destroy(tier_cache *c, device *dev)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n; i++) {
        if (c->m[i].mem)
            dev_host_free(dev, c->m[i].mem);
        free(c->m[i].state);
    }
    free(c);
}

/* The index of the first mirror that ends past element at, c->n when none does (ranges are sorted and disjoint:
 * binary search). The mirrors that overlap a span starting at `at` are this one and those after it. */
static size_t first_ending_after(const tier_cache *c, size_t at)
{
    size_t lo = 0, hi = c->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c->m[mid].first + c->m[mid].count <= at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The mirror whose range holds element at, or NULL. */
static const mirror *find(const tier_cache *c, size_t at)
{
    size_t i = first_ending_after(c, at);
    return i < c->n && c->m[i].first <= at ? &c->m[i] : NULL;
}

const void *tcache_lookup(const tier_cache *c, size_t first, size_t count)
{
    const mirror *m = c && count ? find(c, first) : NULL;
    if (!m || first + count > m->first + m->count)
        return NULL;
    size_t lo = (first - m->first) / TCACHE_BLOCK, hi = (first + count - m->first - 1) / TCACHE_BLOCK;
    for (size_t b = lo; b <= hi; b++)
        if (m->state[b] == BLOCK_INVALID)
            return NULL;
    return m->mem + (first - m->first) * c->elem_bytes;
}

void tcache_write(tier_cache *c, size_t first, size_t count, const void *buf)
{
    if (!c)
        return;
    size_t end = first + count;
    for (size_t i = first_ending_after(c, first); i < c->n && c->m[i].first < end; i++) {
        mirror *m = &c->m[i];
        size_t lo = MAX(first, m->first), hi = MIN(end, m->first + m->count);
        memcpy(m->mem + (lo - m->first) * c->elem_bytes, (const char *)buf + (lo - first) * c->elem_bytes,
               (hi - lo) * c->elem_bytes);
        /* A block is the drive's once a write has covered all of it (a range's last block ends at the range's
         * end); one covered in part keeps its state (held stays held: the rest of it is still only here). */
        for (size_t b = (lo - m->first + TCACHE_BLOCK - 1) / TCACHE_BLOCK; b < m->nblocks; b++) {
            size_t b_end = MIN((b + 1) * TCACHE_BLOCK, m->count) + m->first;
            if (b_end > hi)
                break;
            m->state[b] = BLOCK_CLEAN;
        }
    }
}

bool tcache_next_overlap(const tier_cache *c, size_t first, size_t count, size_t *lo, size_t *hi)
{
    size_t i = c ? first_ending_after(c, first) : 0, end = first + count;
    if (!c || i == c->n || c->m[i].first >= end)
        return false;
    *lo = MAX(first, c->m[i].first);
    *hi = MIN(end, c->m[i].first + c->m[i].count);
    return true;
}

bool tcache_hold(tier_cache *c, size_t first, size_t count, const void *buf)
{
    mirror *m = c && count ? (mirror *)find(c, first) : NULL;
    if (!m || first + count > m->first + m->count)
        return false;
    size_t lo = (first - m->first) / TCACHE_BLOCK, hi = (first + count - m->first - 1) / TCACHE_BLOCK;
    size_t end = first + count - m->first;
    /* A block the write covers in part must hold valid bytes already, or the mirror would hold a mix. */
    bool head_part = (first - m->first) % TCACHE_BLOCK != 0;
    bool tail_part = end % TCACHE_BLOCK != 0 && end != m->count;
    if ((head_part && m->state[lo] == BLOCK_INVALID) || (tail_part && m->state[hi] == BLOCK_INVALID))
        return false;
    memcpy(m->mem + (first - m->first) * c->elem_bytes, buf, count * c->elem_bytes);
    memset(m->state + lo, BLOCK_HELD, hi - lo + 1);
    return true;
}

bool tcache_next_held(const tier_cache *c, size_t first, size_t count, size_t *span_first, size_t *span_count,
                      const void **mem)
{
    size_t end = first + count;
    for (size_t i = c ? first_ending_after(c, first) : 0; c && i < c->n && c->m[i].first < end; i++) {
        const mirror *m = &c->m[i];
        size_t lo = MAX(first, m->first), hi = MIN(end, m->first + m->count);
        size_t b = (lo - m->first) / TCACHE_BLOCK, b_hi = (hi - m->first - 1) / TCACHE_BLOCK;
        while (b <= b_hi && m->state[b] != BLOCK_HELD)
            b++;
        if (b > b_hi)
            continue;
        size_t e = b;
        while (e + 1 < m->nblocks && m->state[e + 1] == BLOCK_HELD)
            e++;
        *span_first = m->first + b * TCACHE_BLOCK;
        *span_count = MIN((e + 1) * TCACHE_BLOCK, m->count) - b * TCACHE_BLOCK;
        *mem = m->mem + b * TCACHE_BLOCK * c->elem_bytes;
        return true;
    }
    return false;
}

void tcache_mark_clean(tier_cache *c, size_t first, size_t count)
{
    mirror *m = c && count ? (mirror *)find(c, first) : NULL;
    if (!m)
        return;
    size_t lo = (first - m->first) / TCACHE_BLOCK, hi = (MIN(first + count, m->first + m->count) - m->first - 1) /
                                                         TCACHE_BLOCK;
    for (size_t b = lo; b <= hi; b++)
        if (m->state[b] == BLOCK_HELD)
            m->state[b] = BLOCK_CLEAN;
}

bool tcache_mirrors(const tier_cache *c, size_t first, size_t count)
{
    const mirror *m = c ? find(c, first) : NULL;
    return m && m->first == first && m->count == count;
}

void *tcache_fill_target(tier_cache *c, size_t first, size_t count)
{
    mirror *m = tcache_mirrors(c, first, count) ? (mirror *)find(c, first) : NULL;
    for (size_t b = 0; m && b < m->nblocks; b++)
        if (m->state[b] == BLOCK_HELD)
            return NULL; /* the drive's older bytes would overwrite the only copy of newer ones */
    return m ? m->mem : NULL;
}

void tcache_mark_valid(tier_cache *c, size_t first, size_t count)
{
    mirror *m = tcache_mirrors(c, first, count) ? (mirror *)find(c, first) : NULL;
    if (m)
        memset(m->state, BLOCK_CLEAN, m->nblocks);
}

void tcache_forget(tier_cache *c)
{
    for (size_t i = 0; c && i < c->n; i++)
        for (size_t b = 0; b < c->m[i].nblocks; b++)
            if (c->m[i].state[b] == BLOCK_CLEAN)
                c->m[i].state[b] = BLOCK_INVALID;
}

size_t tcache_bytes(const tier_cache *c)
{
    return c ? c->numel * c->elem_bytes : 0;
}

size_t tcache_numel(const tier_cache *c)
{
    return c ? c->numel : 0;
}
