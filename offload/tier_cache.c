/* A written-through host mirror of chosen ranges of an NVMe array; see tier_cache.h. */
#include "offload/tier_cache.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/util.h"

typedef struct mirror {
    size_t first, count;
    char *mem;
    uint8_t *valid;        /* one flag per TCACHE_BLOCK of the range */
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
        m->valid = calloc(m->nblocks ? m->nblocks : 1, 1);
        strata_status st = m->valid ? dev_host_alloc(dev, m->count * elem_bytes, (void **)&m->mem) : STRATA_ENOMEM;
        if (st != STRATA_OK) {
            char detail[ERR_MSG_BYTES - 96];
            snprintf(detail, sizeof detail, "%s", m->valid ? err_last() : "out of memory");
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
        free(c->m[i].valid);
    }
    free(c);
}

/* The mirror whose range holds element at, or NULL (ranges are sorted: binary search). */
static const mirror *find(const tier_cache *c, size_t at)
{
    size_t lo = 0, hi = c->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (at < c->m[mid].first)
            hi = mid;
        else if (at >= c->m[mid].first + c->m[mid].count)
            lo = mid + 1;
        else
            return &c->m[mid];
    }
    return NULL;
}

const void *tcache_lookup(const tier_cache *c, size_t first, size_t count)
{
    const mirror *m = c && count ? find(c, first) : NULL;
    if (!m || first + count > m->first + m->count)
        return NULL;
    size_t lo = (first - m->first) / TCACHE_BLOCK, hi = (first + count - m->first - 1) / TCACHE_BLOCK;
    for (size_t b = lo; b <= hi; b++)
        if (!m->valid[b])
            return NULL;
    return m->mem + (first - m->first) * c->elem_bytes;
}

void tcache_write(tier_cache *c, size_t first, size_t count, const void *buf)
{
    if (!c)
        return;
    size_t end = first + count;
    for (size_t i = 0; i < c->n; i++) {
        mirror *m = &c->m[i];
        size_t lo = MAX(first, m->first), hi = MIN(end, m->first + m->count);
        if (hi <= lo)
            continue;
        memcpy(m->mem + (lo - m->first) * c->elem_bytes, (const char *)buf + (lo - first) * c->elem_bytes,
               (hi - lo) * c->elem_bytes);
        /* A block is valid once a write has covered all of it (a range's last block ends at the range's end). */
        for (size_t b = (lo - m->first + TCACHE_BLOCK - 1) / TCACHE_BLOCK; b < m->nblocks; b++) {
            size_t b_end = MIN((b + 1) * TCACHE_BLOCK, m->count) + m->first;
            if (b_end > hi)
                break;
            m->valid[b] = 1;
        }
    }
}

bool tcache_mirrors(const tier_cache *c, size_t first, size_t count)
{
    const mirror *m = c ? find(c, first) : NULL;
    return m && m->first == first && m->count == count;
}

void *tcache_fill_target(tier_cache *c, size_t first, size_t count)
{
    mirror *m = tcache_mirrors(c, first, count) ? (mirror *)find(c, first) : NULL;
    return m ? m->mem : NULL;
}

void tcache_mark_valid(tier_cache *c, size_t first, size_t count)
{
    mirror *m = tcache_mirrors(c, first, count) ? (mirror *)find(c, first) : NULL;
    if (m)
        memset(m->valid, 1, m->nblocks);
}

void tcache_forget(tier_cache *c)
{
    for (size_t i = 0; c && i < c->n; i++)
        memset(c->m[i].valid, 0, c->m[i].nblocks);
}

size_t tcache_bytes(const tier_cache *c)
{
    return c ? c->numel * c->elem_bytes : 0;
}

size_t tcache_numel(const tier_cache *c)
{
    return c ? c->numel : 0;
}
