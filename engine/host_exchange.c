/*
 * Host arrays exchanged with the stores directly (strata.h, "host arrays, without the device"): a trainer whose
 * parameters and gradients are host memory already gains nothing from a fetch, a device buffer and the copies
 * through it, and on the host backend those copies are three passes over memory for one. Here gradients go from
 * the trainer's arrays into the gradient store and weights from the parameter tier into the trainer's arrays, one
 * copy each; an array that is the store's (or the tier's) own memory is not copied at all.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "offload/accum.h"

/* What both directions refuse: a trainer that must reduce across ranks, or whose updates run in backward, goes
 * through the device calls. */
static strata_status require_single(strata_engine *e, const char *what)
{
    if (e->world > 1)
        return err_set(STRATA_ESTATE, "%s: the engine is one of %d ranks; gradients are reduced and parameters "
                       "gathered as they move through the device: use strata_fetch / strata_grad_data", what, e->world);
    if (e->in_backward)
        return err_set(STRATA_ESTATE, "%s: strata.step_in_backward updates each module from its device hand-off; "
                       "use strata_grad_data / strata_grads_ready, or turn step_in_backward off", what);
    return STRATA_OK;
}

static const reg_param *find_param(strata_engine *e, strata_param_id id, const char *what)
{
    if (engine_require_finalized(e, what) != STRATA_OK || require_single(e, what) != STRATA_OK)
        return NULL;
    return registry_find_param(e->reg, id, what);
}

static strata_status find_module(strata_engine *e, strata_module_id id, size_t count, const void *arrays,
                                 const char *what, const reg_module **out)
{
    ERR_CHECK(engine_require_module(e, id, what));
    ERR_CHECK(require_single(e, what));
    const reg_module *m = registry_module(e->reg, id);
    if (!arrays)
        return err_set(STRATA_EINVAL, "%s(\"%s\"): the array of pointers is NULL; pass one per parameter (NULL "
                       "entries allowed)", what, m->name);
    if (count != m->nparams)
        return err_set(STRATA_EINVAL, "%s(\"%s\"): count = %zu, but the module has %zu parameters; pass one "
                       "pointer per parameter, in the order of strata_param_add", what, m->name, count, m->nparams);
    *out = m;
    return STRATA_OK;
}

/* The host address of parameter `param`'s elements in array a (indexed like the flat view), or
 * NULL with the error set: a not in host memory says so and names `instead`, the call that copies. */
static void *host_slot(strata_engine *e, strata_param_id param, const tier_array *a, const char *what,
                       const char *instead)
{
    const reg_param *p = find_param(e, param, what);
    void *at = p && a->numel && a->tier == STRATA_TIER_HOST ? tarr_host_ptr(a, &e->tiers.env, p->offset) : NULL;
    if (p && !at)
        err_set(STRATA_ESTATE, "%s(\"%s\"): the array is on %s, not in host memory; use %s", what, p->name,
                strata_tier_name(a->tier), instead);
    if (!at)
        err_copy(&e->err, err_last_status());
    return at;
}

STRATA_API float *strata_grad_store_data(strata_engine *e, strata_param_id param)
{
    return e ? host_slot(e, param, grads_store(e->grads, grads_front(e->grads)), "strata_grad_store_data",
                         "strata_grads_from_host") : NULL;
}

/* Writes the module's gradients into dst (the module's fp32 range of the store, or a buffer for it): the first of
 * a step overwrite, and the padding between parameters is zeroed then, so the range holds nothing stale. */
static void gather_grads(strata_engine *e, const reg_module *m, const void *const *grads, float *dst,
                         const float *store, bool first)
{
    size_t at = 0; /* module-relative: the end of what is written */
    for (size_t i = 0; i < m->nparams; i++) {
        const reg_param *p = registry_param(e->reg, m->params[i]);
        size_t rel = p->offset - m->offset;
        if (first && rel > at)
            memset(dst + at, 0, (rel - at) * 4);
        at = rel + p->numel;
        if (store && grads[i] == (const void *)(store + rel))
            continue; /* the trainer wrote (and accumulated) it in place */
        if (grads[i])
            accum_add(dst + rel, grads[i], e->cfg.param_dtype, p->numel, first);
        else if (first)
            memset(dst + rel, 0, p->numel * 4);
    }
    if (first && at < m->numel)
        memset(dst + at, 0, (m->numel - at) * 4);
}

static strata_status grads_from_host(strata_engine *e, strata_module_id id, const void *const *grads, size_t count)
{
    const char *what = "strata_grads_from_host";
    const reg_module *m;
    ERR_CHECK(find_module(e, id, count, grads, what, &m));
    if (m->frozen)
        return err_set(STRATA_ESTATE, "%s(\"%s\"): the module is frozen (strata_module_freeze): it has no "
                       "gradients to hand over", what, m->name);
    grad_store *g = e->grads;
    if (grads_has_buffers(g, id))
        return err_set(STRATA_ESTATE, "%s(\"%s\"): the module's device gradient buffers were taken this step "
                       "(strata_grad_data); hand them over with strata_grads_ready, not both ways", what, m->name);
    /* Hand-offs from the device still queued into the same store land first: the order of accumulation is the
     * order of the calls. */
    ERR_CHECK(grads_drain(e));
    int front = grads_front(g);
    tier_array *store = grads_store(g, front);
    bool first = !grads_touched(g, front)[id];
    float *host = tarr_host_ptr(store, &e->tiers.env, m->offset);
    if (host) {
        gather_grads(e, m, grads, host, host, first);
    } else {
        /* NVMe: read-add-write of the module's range through one pinned buffer. */
        float *buf = NULL;
        ERR_CHECK(pool_acquire(e->tiers.pool, POOL_ACCUM, m->numel * 4, "gradient accumulation", (void **)&buf));
        strata_status st = first ? STRATA_OK : tarr_read_sync(store, &e->tiers.env, m->offset, m->numel, buf);
        if (st == STRATA_OK) {
            gather_grads(e, m, grads, buf, NULL, first);
            st = tarr_write_sync(store, &e->tiers.env, m->offset, m->numel, buf);
        }
        pool_release(e->tiers.pool, buf);
        if (st != STRATA_OK)
            return err_set(st, "%s(\"%s\"): %s", what, m->name, err_last());
    }
    grads_mark_touched(g, front, id);
    return STRATA_OK;
}

STRATA_API strata_status strata_grads_from_host(strata_engine *e, strata_module_id module, const void *const *grads,
                                                size_t count)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_grads_from_host: engine is NULL");
    return err_copy(&e->err, grads_from_host(e, module, grads, count));
}

STRATA_API void *strata_param_home_data(strata_engine *e, strata_param_id param)
{
    return e ? host_slot(e, param, &e->tiers.param[e->tiers.param_front], "strata_param_home_data",
                         "strata_params_to_host") : NULL;
}

static strata_status params_to_host(strata_engine *e, strata_module_id id, void *const *params, size_t count)
{
    const char *what = "strata_params_to_host";
    const reg_module *m;
    ERR_CHECK(find_module(e, id, count, params, what, &m));
    const tier_array *home = &e->tiers.param[e->tiers.param_front];
    size_t elem = e->tiers.param_bytes;
    const char *src = home->tier == STRATA_TIER_HOST ? tarr_host_ptr(home, &e->tiers.env, m->offset) : NULL;
    void *buf = NULL;
    if (!src) {
        /* NVMe or device memory: the module's range once through a buffer aligned for O_DIRECT. No pool part is
         * sized for this rare path (the pinned pool serves the pipelined ones), so it is allocated per call. */
        if (posix_memalign(&buf, 4096, m->numel * elem))
            return err_set(STRATA_ENOMEM, "%s(\"%s\"): out of host memory for a %zu-byte read buffer", what, m->name,
                           m->numel * elem);
        strata_status st = tarr_read_sync(home, &e->tiers.env, m->offset, m->numel, buf);
        if (st != STRATA_OK) {
            free(buf);
            return err_set(st, "%s(\"%s\"): %s", what, m->name, err_last());
        }
        src = buf;
    }
    for (size_t i = 0; i < m->nparams; i++) {
        const reg_param *p = registry_param(e->reg, m->params[i]);
        const char *from = src + (p->offset - m->offset) * elem;
        if (params[i] && params[i] != (const void *)from)
            memcpy(params[i], from, p->numel * elem);
    }
    free(buf);
    return STRATA_OK;
}

STRATA_API strata_status strata_params_to_host(strata_engine *e, strata_module_id module, void *const *params,
                                               size_t count)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_params_to_host: engine is NULL");
    return err_copy(&e->err, params_to_host(e, module, params, count));
}
