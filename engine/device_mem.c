/* The trainer's own device memory and copies, through the engine's device. */
#include <stdio.h>

#include "base/size.h"
#include "engine/engine.h"

STRATA_API strata_status strata_device_alloc(strata_engine *e, size_t bytes, void **out)
{
    if (!e || !out)
        return err_set(STRATA_EINVAL, "strata_device_alloc: engine and out must not be NULL");
    *out = NULL;
    if (bytes == 0)
        return err_copy(&e->err, err_set(STRATA_EINVAL, "strata_device_alloc: bytes is 0"));
    strata_status st = dev_alloc(e->dev, bytes, out);
    if (st == STRATA_EBUDGET) {
        char want[32], res[32];
        st = err_set(STRATA_EBUDGET, "strata_device_alloc(%s): %s; strata.activation_bytes reserves %s for the "
                     "trainer: raise it (and strata.device_budget_bytes)", size_format(bytes, want, sizeof want),
                     err_last(), size_format(e->cfg.activation_bytes, res, sizeof res));
    }
    return err_copy(&e->err, st);
}

STRATA_API strata_status strata_device_free(strata_engine *e, void *ptr)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_device_free: engine is NULL");
    return err_copy(&e->err, dev_free(e->dev, ptr));
}

STRATA_API strata_status strata_device_copy(strata_engine *e, void *dst, const void *src, size_t bytes)
{
    if (!e || !dst || !src)
        return err_set(STRATA_EINVAL, "strata_device_copy: engine, dst and src must not be NULL");
    ERR_CHECK(engine_require_finalized(e, "strata_device_copy"));
    strata_status st = dev_memcpy_async(e->copy, dst, src, bytes);
    if (st == STRATA_OK)
        st = dev_stream_sync(e->copy);
    return err_copy(&e->err, st);
}

STRATA_API void *strata_compute_stream(strata_engine *e)
{
    return e && e->compute ? dev_stream_native(e->compute) : NULL;
}
