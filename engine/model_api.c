/* The trainer describes its model: modules, parameters, and (optionally) the order it fetches them in. */
#include "engine/engine.h"
#include "engine/step/step_in_backward.h"

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

static strata_status module_freeze(strata_engine *e, strata_module_id module)
{
    if (e->finalized)
        return err_set(STRATA_ESTATE, "strata_module_freeze(module %u): the engine is already finalized; freeze "
                       "modules before strata_engine_finalize()", module);
    if (!registry_find_module(e->reg, module, "strata_module_freeze"))
        return STRATA_ESTATE;
    registry_module_freeze(e->reg, module);
    return STRATA_OK;
}

STRATA_API strata_status strata_module_freeze(strata_engine *e, strata_module_id module)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_module_freeze: engine is NULL");
    return err_copy(&e->err, module_freeze(e, module));
}

STRATA_API bool strata_module_frozen(const strata_engine *e, strata_module_id module)
{
    return e && module < registry_nmodules(e->reg) && registry_module(e->reg, module)->frozen;
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

STRATA_API strata_status strata_param_set_part(strata_engine *e, strata_param_id param, const char *tensor,
                                               uint64_t first, int ndim, const int64_t *dims)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_param_set_part: engine is NULL");
    if (e->finalized)
        return err_copy(&e->err, err_set(STRATA_ESTATE, "strata_param_set_part(param %u): the engine is already "
                                         "finalized; declare parts before strata_engine_finalize()", param));
    return err_copy(&e->err, registry_param_set_part(e->reg, param, tensor, first, ndim, dims));
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

/* ---------------------------------------------------------------- parameter groups */

STRATA_API strata_status strata_group_add(strata_engine *e, const char *name, const strata_group_hparams *hp,
                                          strata_group_id *out)
{
    if (!e || !out)
        return err_set(STRATA_EINVAL, "strata_group_add: engine and out must not be NULL");
    *out = STRATA_INVALID_ID;
    if (e->finalized)
        return err_copy(&e->err, err_set(STRATA_ESTATE, "strata_group_add(\"%s\"): the engine is already finalized; "
                                         "add every parameter group before strata_engine_finalize()",
                                         name ? name : ""));
    return err_copy(&e->err, opt_groups_add(e->groups, name, hp, out));
}

static strata_status find_group(strata_engine *e, strata_group_id group, const char *what)
{
    if (group >= opt_groups_count(e->groups))
        return err_set(STRATA_EINVAL, "%s: parameter group %u is unknown (the engine has %zu groups, ids 0..%zu)",
                       what, group, opt_groups_count(e->groups), opt_groups_count(e->groups) - 1);
    return STRATA_OK;
}

static strata_status param_set_group(strata_engine *e, strata_param_id param, strata_group_id group)
{
    if (e->finalized)
        return err_set(STRATA_ESTATE, "strata_param_set_group(param %u): the engine is already finalized; put "
                       "parameters in groups before strata_engine_finalize()", param);
    const reg_param *p = registry_find_param(e->reg, param, "strata_param_set_group");
    if (!p)
        return STRATA_EINVAL;
    ERR_CHECK(find_group(e, group, "strata_param_set_group"));
    if (p->group_set && p->group != group)
        return err_set(STRATA_EINVAL, "strata_param_set_group: parameter \"%s.%s\" is already in group \"%s\"; it "
                       "cannot also be in group \"%s\" (a parameter belongs to one group)",
                       registry_module(e->reg, p->module)->name, p->name, opt_groups_name(e->groups, p->group),
                       opt_groups_name(e->groups, group));
    registry_param_set_group(e->reg, param, group);
    return STRATA_OK;
}

STRATA_API strata_status strata_param_set_group(strata_engine *e, strata_param_id param, strata_group_id group)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_param_set_group: engine is NULL");
    return err_copy(&e->err, param_set_group(e, param, group));
}

static strata_status group_set(strata_engine *e, strata_group_id group, const strata_group_hparams *hp)
{
    ERR_CHECK(find_group(e, group, "strata_group_set"));
    if (e->in_backward && step_in_backward_open(e->in_backward))
        return err_set(STRATA_ESTATE, "strata_group_set(\"%s\"): a step is begun (strata.step_in_backward: its updates "
                       "run during backward with the values it began with); set groups before strata_step_begin",
                       opt_groups_name(e->groups, group));
    return opt_groups_set(e->groups, group, hp);
}

STRATA_API strata_status strata_group_set(strata_engine *e, strata_group_id group, const strata_group_hparams *hp)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_group_set: engine is NULL");
    return err_copy(&e->err, group_set(e, group, hp));
}

STRATA_API strata_status strata_group_get(strata_engine *e, strata_group_id group, strata_group_hparams *out)
{
    if (!e || !out)
        return err_set(STRATA_EINVAL, "strata_group_get: engine and out must not be NULL");
    strata_status st = find_group(e, group, "strata_group_get");
    if (st != STRATA_OK)
        return err_copy(&e->err, st);
    *out = *opt_groups_get(e->groups, group);
    return STRATA_OK;
}

STRATA_API size_t strata_group_count(const strata_engine *e)
{
    return e ? opt_groups_count(e->groups) : 0;
}

STRATA_API strata_group_id strata_param_group(const strata_engine *e, strata_param_id param)
{
    if (!e || param >= registry_nparams(e->reg))
        return STRATA_INVALID_ID;
    return registry_param(e->reg, param)->group;
}
