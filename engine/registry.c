/* The model registry: modules, their parameters, the declared fetch order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

/* Grows *arr (of *cap elements of size elem) to hold at least need. */
static bool grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t ncap = *cap ? *cap * 2 : 16;
    while (ncap < need)
        ncap *= 2;
    void *n = realloc(*arr, ncap * elem);
    if (!n)
        return false;
    *arr = n;
    *cap = ncap;
    return true;
}

static strata_status check_name(const char *name, const char *what)
{
    if (!name || !*name)
        return err_set(STRATA_EINVAL, "%s: the name is empty; give every module and parameter a name", what);
    if (strlen(name) >= ENGINE_NAME_BYTES)
        return err_set(STRATA_EINVAL, "%s: name \"%.40s...\" is %zu bytes; at most %d allowed", what, name,
                       strlen(name), ENGINE_NAME_BYTES - 1);
    return STRATA_OK;
}

strata_status engine_require_finalized(strata_engine *e, const char *what)
{
    if (!e->finalized)
        return err_set(STRATA_ESTATE, "%s: the engine is not finalized yet; call strata_engine_finalize() after "
                       "adding every module and parameter", what);
    return STRATA_OK;
}

eng_module *engine_module(strata_engine *e, strata_module_id id, const char *what)
{
    if (id >= e->nmodules) {
        err_set(STRATA_ESTATE, "%s: module id %u is unknown (the engine has %zu modules, ids 0..%zu)", what, id,
                e->nmodules, e->nmodules ? e->nmodules - 1 : 0);
        return NULL;
    }
    return &e->modules[id];
}

eng_param *engine_param(strata_engine *e, strata_param_id id, const char *what)
{
    if (id >= e->nparams) {
        err_set(STRATA_ESTATE, "%s: parameter id %u is unknown (the engine has %zu parameters)", what, id,
                e->nparams);
        return NULL;
    }
    return &e->params[id];
}

eng_param *engine_held_param(strata_engine *e, strata_param_id id, const char *what)
{
    strata_status st = engine_require_finalized(e, what);
    eng_param *p = st == STRATA_OK ? engine_param(e, id, what) : NULL;
    if (!p)
        return NULL;
    eng_module *m = &e->modules[p->module];
    if (!m->held) {
        err_set(STRATA_ESTATE, "%s(\"%s.%s\"): module \"%s\" is not fetched; call strata_fetch first", what, m->name,
                p->name, m->name);
        return NULL;
    }
    return p;
}

static strata_status module_add(strata_engine *e, const char *name, strata_module_id *out)
{
    if (e->finalized)
        return err_set(STRATA_ESTATE, "strata_module_add(\"%s\"): the engine is already finalized; add every "
                       "module before strata_engine_finalize()", name ? name : "");
    ERR_CHECK(check_name(name, "strata_module_add"));
    for (size_t i = 0; i < e->nmodules; i++)
        if (strcmp(e->modules[i].name, name) == 0)
            return err_set(STRATA_EINVAL, "strata_module_add: a module named \"%s\" already exists (id %zu)", name, i);
    if (e->nmodules >= STRATA_INVALID_ID - 1 ||
        !grow((void **)&e->modules, &e->modules_cap, e->nmodules + 1, sizeof *e->modules))
        return err_set(STRATA_ENOMEM, "strata_module_add: out of memory");
    eng_module *m = &e->modules[e->nmodules];
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", name);
    *out = (strata_module_id)e->nmodules++;
    return STRATA_OK;
}

STRATA_API strata_status strata_module_add(strata_engine *e, const char *name, strata_module_id *out)
{
    if (!e || !out)
        return err_set(STRATA_EINVAL, "strata_module_add: engine and out must not be NULL");
    *out = STRATA_INVALID_ID;
    return err_copy(&e->err, module_add(e, name, out));
}

static strata_status param_add(strata_engine *e, strata_module_id module, const char *name, size_t numel,
                               strata_init_fn init, void *ctx, strata_param_id *out)
{
    if (e->finalized)
        return err_set(STRATA_ESTATE, "strata_param_add(\"%s\"): the engine is already finalized; add every "
                       "parameter before strata_engine_finalize()", name ? name : "");
    eng_module *m = engine_module(e, module, "strata_param_add");
    if (!m)
        return STRATA_ESTATE;
    ERR_CHECK(check_name(name, "strata_param_add"));
    if (numel == 0)
        return err_set(STRATA_EINVAL, "strata_param_add(\"%s.%s\"): numel is 0; a parameter needs at least one "
                       "element", m->name, name);
    if (numel > ((size_t)1 << 48))
        return err_set(STRATA_EINVAL, "strata_param_add(\"%s.%s\"): numel %zu is larger than 2^48", m->name, name,
                       numel);
    for (size_t i = 0; i < m->nparams; i++)
        if (strcmp(e->params[m->params[i]].name, name) == 0)
            return err_set(STRATA_EINVAL, "strata_param_add: module \"%s\" already has a parameter \"%s\"", m->name,
                           name);
    if (e->nparams >= STRATA_INVALID_ID - 1 ||
        !grow((void **)&e->params, &e->params_cap, e->nparams + 1, sizeof *e->params) ||
        !grow((void **)&m->params, &m->cap, m->nparams + 1, sizeof *m->params))
        return err_set(STRATA_ENOMEM, "strata_param_add: out of memory");
    eng_param *p = &e->params[e->nparams];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->module = module;
    p->numel = numel;
    p->init = init;
    p->init_ctx = ctx;
    m->params[m->nparams++] = (strata_param_id)e->nparams;
    *out = (strata_param_id)e->nparams++;
    return STRATA_OK;
}

STRATA_API strata_status strata_param_add(strata_engine *e, strata_module_id module, const char *name, size_t numel,
                                          strata_init_fn init, void *init_ctx, strata_param_id *out)
{
    if (!e || !out)
        return err_set(STRATA_EINVAL, "strata_param_add: engine and out must not be NULL");
    *out = STRATA_INVALID_ID;
    return err_copy(&e->err, param_add(e, module, name, numel, init, init_ctx, out));
}

static strata_status module_order(strata_engine *e, const strata_module_id *order, size_t count)
{
    if (count == 0 || !order)
        return err_set(STRATA_EINVAL, "strata_module_order: the order is empty");
    for (size_t i = 0; i < count; i++)
        if (order[i] >= e->nmodules)
            return err_set(STRATA_ESTATE, "strata_module_order: entry %zu is module id %u, which is unknown (the "
                           "engine has %zu modules)", i, order[i], e->nmodules);
    if (!grow((void **)&e->order, &e->order_cap, count, sizeof *e->order))
        return err_set(STRATA_ENOMEM, "strata_module_order: out of memory");
    memcpy(e->order, order, count * sizeof *order);
    e->order_len = count;
    e->order_declared = true;
    e->order_valid = true;
    return STRATA_OK;
}

STRATA_API strata_status strata_module_order(strata_engine *e, const strata_module_id *order, size_t count)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_module_order: engine is NULL");
    return err_copy(&e->err, module_order(e, order, count));
}

/* Appends to this step's recorded order (fetch.c uses it to learn the order of the first step). */
bool registry_record(strata_engine *e, strata_module_id id)
{
    if (!grow((void **)&e->rec, &e->rec_cap, e->rec_len + 1, sizeof *e->rec))
        return false;
    e->rec[e->rec_len++] = id;
    return true;
}

/* Makes the recorded order the order (at a step boundary). */
void registry_adopt_recording(strata_engine *e)
{
    if (e->rec_len == 0)
        return;
    if (!grow((void **)&e->order, &e->order_cap, e->rec_len, sizeof *e->order))
        return;
    memcpy(e->order, e->rec, e->rec_len * sizeof *e->rec);
    e->order_len = e->rec_len;
    e->order_valid = true;
}
