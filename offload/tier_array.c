#include "offload/tier_array.h"

#include <stdio.h>
#include <string.h>

#include "base/error.h"

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

void tarr_free(tier_array *a, const tier_env *env)
{
    if (!a || (!a->mem && a->ext.bytes == 0))
        return;
    if (a->tier == STRATA_TIER_DEVICE)
        dev_free(env->dev, a->mem);
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
    if (a->tier == STRATA_TIER_NVME)
        return swap_read(env->swap, &a->ext, off, buf, len, w);
    void *src = tarr_host_ptr(a, env, first);
    if (src) {
        memcpy(buf, src, len);
        return STRATA_OK;
    }
    return device_copy(env, buf, (char *)a->mem + off, len);
}

strata_status tarr_write(tier_array *a, const tier_env *env, size_t first, size_t count, const void *buf,
                         io_wait *w)
{
    ERR_CHECK(check_range(a, first, count));
    size_t off = tarr_bytes(a, first), len = tarr_bytes(a, count);
    if (a->tier == STRATA_TIER_NVME)
        return swap_write(env->swap, &a->ext, off, buf, len, w);
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
