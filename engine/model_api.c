/* The trainer describes its model: modules, parameters, and (optionally) the order it fetches them in. */
#include "engine/engine.h"

STRATA_API strata_status strata_module_add(strata_engine *e, const char *name, strata_module_id *out)
{
    if (!e || !out)
        return err_set(STRATA_EINVAL, "strata_module_add: engine and out must not be NULL");
    *out = STRATA_INVALID_ID;
    if (e->finalized)
        return err_copy(&e->err, err_set(STRATA_ESTATE, "strata_module_add(\"%s\"): the engine is already finalized; "
                                         "add every module before strata_engine_finalize()", name ? name : ""));
    return err_copy(&e->err, registry_module_add(e->reg, name, out));
}

STRATA_API strata_status strata_param_add(strata_engine *e, strata_module_id module, const char *name, size_t numel,
                                          strata_init_fn init, void *init_ctx, strata_param_id *out)
{
    if (!e || !out)
        return err_set(STRATA_EINVAL, "strata_param_add: engine and out must not be NULL");
    *out = STRATA_INVALID_ID;
    if (e->finalized)
        return err_copy(&e->err, err_set(STRATA_ESTATE, "strata_param_add(\"%s\"): the engine is already finalized; "
                                         "add every parameter before strata_engine_finalize()", name ? name : ""));
    return err_copy(&e->err, registry_param_add(e->reg, module, name, numel, init, init_ctx, out));
}

STRATA_API strata_status strata_param_set_shape(strata_engine *e, strata_param_id param, int ndim, const int64_t *dims)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_param_set_shape: engine is NULL");
    if (e->finalized)
        return err_copy(&e->err, err_set(STRATA_ESTATE, "strata_param_set_shape(param %u): the engine is already "
                                         "finalized; declare shapes before strata_engine_finalize()", param));
    return err_copy(&e->err, registry_param_set_shape(e->reg, param, ndim, dims));
}

static strata_status module_order(strata_engine *e, const strata_module_id *order, size_t count)
{
    if (count == 0 || !order)
        return err_set(STRATA_EINVAL, "strata_module_order: the order is empty");
    size_t n = registry_nmodules(e->reg);
    for (size_t i = 0; i < count; i++)
        if (order[i] >= n)
            return err_set(STRATA_ESTATE, "strata_module_order: entry %zu is module id %u, which is unknown (the "
                           "engine has %zu modules)", i, order[i], n);
    return fetch_order_declare(e->order, order, count);
}

STRATA_API strata_status strata_module_order(strata_engine *e, const strata_module_id *order, size_t count)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_module_order: engine is NULL");
    return err_copy(&e->err, module_order(e, order, count));
}
