#include "offload/tier_array.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/big_alloc.h"
#include "base/error.h"
#include "base/size.h"

strata_status tarr_alloc(tier_array *a, const tier_env *env, strata_tier tier, size_t numel, size_t elem_bytes,
                         const char *what)
{
    memset(a, 0, sizeof *a);
    a->tier = tier;
    a->numel = numel;
    a->elem_bytes = elem_bytes;
    a->what = what;
    size_t bytes = numel * elem_bytes;
    strata_status st;
    switch (tier) {
    case STRATA_TIER_DEVICE:
        st = dev_alloc(env->dev, bytes, &a->mem);
        break;
    case STRATA_TIER_HOST:
        st = dev_host_alloc(env->dev, bytes, &a->mem);
        break;
    case STRATA_TIER_NVME:
        if (!env->swap)
            return err_set(STRATA_EINTERNAL, "%s: NVMe tier without swap space", what);
        st = swap_alloc(env->swap, bytes, &a->ext);
        a->ext.what = what; /* names the state in checksum errors */
        break;
    default:
        return err_set(STRATA_EINTERNAL, "%s: unknown tier %d", what, (int)tier);
    }
    if (st != STRATA_OK) {
        char detail[ERR_MSG_BYTES - 64];
        snprintf(detail, sizeof detail, "%s", err_last());
        a->tier = STRATA_TIER_DEVICE;
        a->mem = NULL;
        return err_set(st, "%s: %s", what, detail);
    }
    return STRATA_OK;
}

strata_status tarr_alloc_cpu(tier_array *a, const tier_env *env, strata_tier tier, size_t numel, size_t elem_bytes,
                             const char *what)
{
    if (tier != STRATA_TIER_HOST)
        return tarr_alloc(a, env, tier, numel, elem_bytes, what);
    *a = (tier_array){.tier = tier, .numel = numel, .elem_bytes = elem_bytes, .what = what, .cpu_only = true};
    if (!(a->mem = big_alloc(numel * elem_bytes))) {
        char b[32];
        a->tier = STRATA_TIER_DEVICE; /* as tarr_alloc leaves a failed array: nothing to free */
        return err_set(STRATA_ENOMEM, "%s: %s of host memory refused", what,
                       size_format(numel * elem_bytes, b, sizeof b));
    }
    return STRATA_OK;
}

/* Adds v to one of env's counters (a tier_env may have none). */
#define COUNT(env, field, v)                                                                            \
    do {                                                                                                \
        if ((env)->ctr)                                                                                 \
            atomic_fetch_add(&(env)->ctr->field, (uint64_t)(v));                                        \
    } while (0)

/* One transfer between mem and elements [first, first + count) of the drive, waited for, counted. */
static strata_status swap_sync(const tier_array *a, const tier_env *env, bool write, size_t first, size_t count,
                               void *mem)
{
    io_wait w;
    io_wait_init(&w);
    size_t off = tarr_bytes(a, first), len = tarr_bytes(a, count);
    if (write)
        COUNT(env, nvme_write_bytes, len);
    else
        COUNT(env, nvme_read_bytes, len);
    strata_status st = write ? swap_write(env->swap, &a->ext, off, mem, len, &w)
                             : swap_read(env->swap, &a->ext, off, mem, len, &w);
    strata_status wst = io_wait_wait(&w);
    io_wait_destroy(&w);
    return st != STRATA_OK ? st : wst;
}

/* Hands the drive the held blocks of the cache that overlap [first, first + count) (waits): before a read the
 * mirror cannot serve whole, and before the cache goes. */
static strata_status write_held(const tier_array *a, const tier_env *env, size_t first, size_t count)
{
    size_t at, n;
    const void *mem;
    while (tcache_next_held(a->cache, first, count, &at, &n, &mem)) {
        ERR_CHECK(swap_sync(a, env, true, at, n, (void *)mem));
        tcache_mark_clean(a->cache, at, n);
    }
    return STRATA_OK;
}

strata_status tarr_cache(tier_array *a, const tier_env *env, const tcache_range *ranges, size_t n)
{
    ERR_CHECK(write_held(a, env, 0, a->numel));
    tcache_destroy(a->cache, env->dev);
    a->cache = NULL;
    if (n == 0)
        return STRATA_OK;
    if (a->tier != STRATA_TIER_NVME)
        return err_set(STRATA_EINTERNAL, "%s: a host cache over the %s tier", a->what, strata_tier_name(a->tier));
    return tcache_create(env->dev, ranges, n, a->elem_bytes, a->what, &a->cache);
}

const void *tarr_cached(const tier_array *a, const tier_env *env, size_t first, size_t count)
{
    const void *p = a->tier == STRATA_TIER_NVME ? tcache_lookup(a->cache, first, count) : NULL;
    if (p) {
        COUNT(env, cache_hits, 1);
        COUNT(env, cache_read_bytes, tarr_bytes(a, count));
    }
    return p;
}

strata_status tarr_cache_fill(tier_array *a, const tier_env *env, size_t first, size_t count)
{
    void *mem = tcache_fill_target(a->cache, first, count);
    if (!mem)
        return err_set(STRATA_EINTERNAL, "%s: no host cache mirror is [%zu, %zu)", a->what, first, first + count);
    ERR_CHECK(swap_sync(a, env, false, first, count, mem));
    tcache_mark_valid(a->cache, first, count);
    return STRATA_OK;
}

void tarr_free(tier_array *a, const tier_env *env)
{
    if (!a)
        return;
    tcache_destroy(a->cache, env->dev);
    a->cache = NULL;
    if (!a->mem && a->ext.bytes == 0)
        return;
    if (a->tier == STRATA_TIER_DEVICE)
        dev_free(env->dev, a->mem);
    else if (a->tier == STRATA_TIER_HOST && a->cpu_only)
        free(a->mem);
    else if (a->tier == STRATA_TIER_HOST)
        dev_host_free(env->dev, a->mem);
    else
        swap_free(env->swap, a->ext);
    a->mem = NULL;
    a->ext.bytes = 0;
}

void *tarr_host_ptr(const tier_array *a, const tier_env *env, size_t index)
{
    if (a->tier == STRATA_TIER_HOST || (a->tier == STRATA_TIER_DEVICE && env->host_addressable_device))
        return (char *)a->mem + index * a->elem_bytes;
    return NULL;
}

static strata_status check_range(const tier_array *a, size_t first, size_t count)
{
    if (first > a->numel || count > a->numel - first)
        return err_set(STRATA_EINTERNAL, "%s: range [%zu, %zu) outside the array of %zu elements", a->what, first,
                       first + count, a->numel);
    return STRATA_OK;
}

/* Device memory of a real GPU: a copy on the engine's copy stream, waited for. */
static strata_status device_copy(const tier_env *env, void *dst, const void *src, size_t bytes)
{
    ERR_CHECK(dev_memcpy_async(env->copy_stream, dst, src, bytes));
    return dev_stream_sync(env->copy_stream);
}

strata_status tarr_read(const tier_array *a, const tier_env *env, size_t first, size_t count, void *buf, io_wait *w)
{
    ERR_CHECK(check_range(a, first, count));
    size_t off = tarr_bytes(a, first), len = tarr_bytes(a, count);
    if (a->tier == STRATA_TIER_NVME) {
        const void *mirrored = tarr_cached(a, env, first, count);
        if (mirrored) {
            memcpy(buf, mirrored, len);
            return STRATA_OK;
        }
        ERR_CHECK(write_held(a, env, first, count)); /* the drive's copy of them is older */
        COUNT(env, nvme_read_bytes, len);
        return swap_read(env->swap, &a->ext, off, buf, len, w);
    }
    void *src = tarr_host_ptr(a, env, first);
    if (src) {
        memcpy(buf, src, len);
        return STRATA_OK;
    }
    return device_copy(env, buf, (char *)a->mem + off, len);
}

/* tarr_write on NVMe: each part a mirror covers stays there (or, where it cannot hold it, is written through), the
 * parts between mirrors go to the drive, queued on w. */
static strata_status write_nvme(tier_array *a, const tier_env *env, size_t first, size_t count, const void *buf,
                                   io_wait *w)
{
    size_t at = first, end = first + count, lo, hi;
    while (at < end) {
        bool mirrored = tcache_next_overlap(a->cache, at, end - at, &lo, &hi);
        size_t gap_end = mirrored ? lo : end;
        const char *src = (const char *)buf + tarr_bytes(a, at - first);
        if (gap_end > at) {
            COUNT(env, nvme_write_bytes, tarr_bytes(a, gap_end - at));
            ERR_CHECK(swap_write(env->swap, &a->ext, tarr_bytes(a, at), src, tarr_bytes(a, gap_end - at), w));
        }
        if (!mirrored)
            break;
        src = (const char *)buf + tarr_bytes(a, lo - first);
        if (tcache_hold(a->cache, lo, hi - lo, src)) {
            COUNT(env, cache_held_bytes, tarr_bytes(a, hi - lo));
        } else {
            tcache_write(a->cache, lo, hi - lo, src);
            COUNT(env, nvme_write_bytes, tarr_bytes(a, hi - lo));
            ERR_CHECK(swap_write(env->swap, &a->ext, tarr_bytes(a, lo), src, tarr_bytes(a, hi - lo), w));
        }
        at = hi;
    }
    return STRATA_OK;
}

strata_status tarr_write(tier_array *a, const tier_env *env, size_t first, size_t count, const void *buf,
                         io_wait *w)
{
    ERR_CHECK(check_range(a, first, count));
    size_t off = tarr_bytes(a, first), len = tarr_bytes(a, count);
    if (a->tier == STRATA_TIER_NVME)
        return write_nvme(a, env, first, count, buf, w);
    void *dst = tarr_host_ptr(a, env, first);
    if (dst) {
        memcpy(dst, buf, len);
        return STRATA_OK;
    }
    return device_copy(env, (char *)a->mem + off, buf, len);
}

strata_status tarr_read_sync(const tier_array *a, const tier_env *env, size_t first, size_t count, void *buf)
{
    io_wait w;
    io_wait_init(&w);
    strata_status st = tarr_read(a, env, first, count, buf, &w);
    strata_status wst = io_wait_wait(&w);
    io_wait_destroy(&w);
    return st != STRATA_OK ? st : wst;
}

strata_status tarr_write_sync(tier_array *a, const tier_env *env, size_t first, size_t count, const void *buf)
{
    io_wait w;
    io_wait_init(&w);
    strata_status st = tarr_write(a, env, first, count, buf, &w);
    strata_status wst = io_wait_wait(&w);
    io_wait_destroy(&w);
    return st != STRATA_OK ? st : wst;
}
