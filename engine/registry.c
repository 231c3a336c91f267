/* The model registry: modules, their parameters, and the flat layout. */
#include "engine/registry.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/util.h"

struct registry {
    reg_module *modules;
    size_t nmodules, modules_cap;
    reg_param *params;
    size_t nparams, params_cap;
    size_t total_numel;             /* the padded flat partition (full view) */
    size_t shard_total_numel;       /* this rank's shards together (shard view) */
    size_t trained_numel, shard_trained_numel; /* the trained modules' part of each (they come first) */
    size_t largest_module_numel;
    size_t largest_trained_numel;   /* the largest module that is not frozen */
    strata_module_id *by_position;  /* module ids in layout order (after registry_layout) */
    size_t nfrozen;
};

strata_status registry_create(registry **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? STRATA_OK : err_set(STRATA_ENOMEM, "out of memory for the model registry");
}

void registry_destroy(registry *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->nmodules; i++)
        free(r->modules[i].params);
    free(r->modules);
    free(r->params);
    free(r->by_position);
    free(r);
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

strata_status registry_module_add(registry *r, const char *name, strata_module_id *out)
{
    ERR_CHECK(check_name(name, "strata_module_add"));
    for (size_t i = 0; i < r->nmodules; i++)
        if (strcmp(r->modules[i].name, name) == 0)
            return err_set(STRATA_EINVAL, "strata_module_add: a module named \"%s\" already exists (id %zu)", name, i);
    if (r->nmodules >= STRATA_INVALID_ID - 1 ||
        !array_grow((void **)&r->modules, &r->modules_cap, r->nmodules + 1, sizeof *r->modules))
        return err_set(STRATA_ENOMEM, "strata_module_add: out of memory");
    reg_module *m = &r->modules[r->nmodules];
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", name);
    *out = (strata_module_id)r->nmodules++;
    return STRATA_OK;
}

strata_status registry_param_add(registry *r, strata_module_id module, const char *name, size_t numel,
                                 strata_init_fn init, void *init_ctx, strata_param_id *out)
{
    if (!registry_find_module(r, module, "strata_param_add"))
        return STRATA_ESTATE;
    reg_module *m = &r->modules[module];
    ERR_CHECK(check_name(name, "strata_param_add"));
    if (numel == 0)
        return err_set(STRATA_EINVAL, "strata_param_add(\"%s.%s\"): numel is 0; a parameter needs at least one "
                       "element", m->name, name);
    if (numel > ((size_t)1 << 48))
        return err_set(STRATA_EINVAL, "strata_param_add(\"%s.%s\"): numel %zu is larger than 2^48", m->name, name,
                       numel);
    for (size_t i = 0; i < m->nparams; i++)
        if (strcmp(r->params[m->params[i]].name, name) == 0)
            return err_set(STRATA_EINVAL, "strata_param_add: module \"%s\" already has a parameter \"%s\"", m->name,
                           name);
    if (r->nparams >= STRATA_INVALID_ID - 1 ||
        !array_grow((void **)&r->params, &r->params_cap, r->nparams + 1, sizeof *r->params) ||
        !array_grow((void **)&m->params, &m->cap, m->nparams + 1, sizeof *m->params))
        return err_set(STRATA_ENOMEM, "strata_param_add: out of memory");
    reg_param *p = &r->params[r->nparams];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->module = module;
    p->numel = numel;
    p->init = init;
    p->init_ctx = init_ctx;
    m->params[m->nparams++] = (strata_param_id)r->nparams;
    *out = (strata_param_id)r->nparams++;
    return STRATA_OK;
}

void registry_module_freeze(registry *r, strata_module_id id)
{
    r->modules[id].frozen = true;
}

void registry_param_set_group(registry *r, strata_param_id param, strata_group_id group)
{
    r->params[param].group = group;
    r->params[param].group_set = true;
}

void registry_param_set_init(registry *r, strata_param_id param, strata_init_fn init, void *init_ctx)
{
    r->params[param].init = init;
    r->params[param].init_ctx = init_ctx;
}

void registry_shape_str(int ndim, const uint64_t *dims, char *out, size_t len)
{
    size_t at = (size_t)snprintf(out, len, "[");
    for (int i = 0; i < ndim && at < len; i++)
        at += (size_t)snprintf(out + at, len - at, "%s%" PRIu64, i ? ", " : "", dims[i]);
    if (at < len)
        snprintf(out + at, len - at, "]");
}

/* Checks ndim and dims for call `what` on parameter p ("<mod>.<name>") and gives them as uint64 in d with their
 * product (UINT64_MAX when it overflows). */
static strata_status read_dims(const char *what, const char *mod, const reg_param *p, int ndim, const int64_t *dims,
                               uint64_t *d, uint64_t *product)
{
    if (ndim < 1 || ndim > STRATA_MAX_DIMS || !dims)
        return err_set(STRATA_EINVAL, "%s(\"%s.%s\"): ndim = %d is outside [1, %d]%s", what, mod, p->name, ndim,
                       STRATA_MAX_DIMS, dims ? "" : " or dims is NULL");
    bool overflow = false;
    *product = 1;
    for (int i = 0; i < ndim; i++) {
        if (dims[i] < 1)
            return err_set(STRATA_EINVAL, "%s(\"%s.%s\"): dims[%d] = %" PRId64 "; every dimension must be at least "
                           "1", what, mod, p->name, i, dims[i]);
        d[i] = (uint64_t)dims[i];
        overflow |= *product > UINT64_MAX / d[i];
        *product = overflow ? UINT64_MAX : *product * d[i];
    }
    return STRATA_OK;
}

strata_status registry_param_set_shape(registry *r, strata_param_id param, int ndim, const int64_t *dims)
{
    if (!registry_find_param(r, param, "strata_param_set_shape"))
        return STRATA_ESTATE;
    reg_param *p = &r->params[param];
    const char *mod = r->modules[p->module].name;
    uint64_t d[STRATA_MAX_DIMS], product;
    ERR_CHECK(read_dims("strata_param_set_shape", mod, p, ndim, dims, d, &product));
    if (product != p->numel) {
        char shape[STRATA_MAX_DIMS * 24 + 8];
        registry_shape_str(ndim, d, shape, sizeof shape);
        return err_set(STRATA_EINVAL, "strata_param_set_shape(\"%s.%s\"): dims %s hold %s%" PRIu64 " elements, the "
                       "parameter has numel %zu; the product of the dims must equal numel", mod, p->name, shape,
                       product == UINT64_MAX ? "more than " : "", product, p->numel);
    }
    p->ndim = ndim;
    memcpy(p->dims, d, (size_t)ndim * sizeof *d);
    return STRATA_OK;
}

strata_status registry_param_set_part(registry *r, strata_param_id param, const char *tensor, uint64_t first,
                                      int ndim, const int64_t *dims)
{
    if (!registry_find_param(r, param, "strata_param_set_part"))
        return STRATA_ESTATE;
    reg_param *p = &r->params[param];
    const char *mod = r->modules[p->module].name;
    if (!tensor || !*tensor || strlen(tensor) >= ENGINE_NAME_BYTES)
        return err_set(STRATA_EINVAL, "strata_param_set_part(\"%s.%s\"): the tensor's name is %s; give it a name of "
                       "1 to %d bytes", mod, p->name, !tensor ? "NULL" : *tensor ? "too long" : "empty",
                       ENGINE_NAME_BYTES - 1);
    uint64_t d[STRATA_MAX_DIMS], total;
    ERR_CHECK(read_dims("strata_param_set_part", mod, p, ndim, dims, d, &total));
    if (first > total || p->numel > total - first) {
        char shape[STRATA_MAX_DIMS * 24 + 8];
        registry_shape_str(ndim, d, shape, sizeof shape);
        return err_set(STRATA_EINVAL, "strata_param_set_part(\"%s.%s\"): elements [%" PRIu64 ", %" PRIu64 ") lie "
                       "outside tensor \"%s\" of shape %s (%s%" PRIu64 " elements); first + numel must not exceed "
                       "the tensor's size", mod, p->name, first, first + p->numel, tensor, shape,
                       total == UINT64_MAX ? "more than " : "", total);
    }
    snprintf(p->part_of, sizeof p->part_of, "%s", tensor);
    p->part_first = first;
    p->part_total = total;
    p->part_ndim = ndim;
    memcpy(p->part_dims, d, (size_t)ndim * sizeof *d);
    return STRATA_OK;
}

size_t registry_nmodules(const registry *r)
{
    return r->nmodules;
}

size_t registry_nparams(const registry *r)
{
    return r->nparams;
}

const reg_module *registry_module(const registry *r, strata_module_id id)
{
    return &r->modules[id];
}

const reg_param *registry_param(const registry *r, strata_param_id id)
{
    return &r->params[id];
}

const reg_module *registry_find_module(const registry *r, strata_module_id id, const char *what)
{
    if (id >= r->nmodules) {
        err_set(STRATA_ESTATE, "%s: module id %u is unknown (the engine has %zu modules, ids 0..%zu)", what, id,
                r->nmodules, r->nmodules ? r->nmodules - 1 : 0);
        return NULL;
    }
    return &r->modules[id];
}

const reg_param *registry_find_param(const registry *r, strata_param_id id, const char *what)
{
    if (id >= r->nparams) {
        err_set(STRATA_ESTATE, "%s: parameter id %u is unknown (the engine has %zu parameters)", what, id,
                r->nparams);
        return NULL;
    }
    return &r->params[id];
}

strata_status registry_layout(registry *r, size_t persistence_threshold, int world_size)
{
    size_t most = 1, world = (size_t)world_size;
    for (size_t i = 0; i < r->nmodules; i++)
        most = MAX(most, r->modules[i].nparams);
    strata_module_id *order = realloc(r->by_position, MAX(r->nmodules, (size_t)1) * sizeof *order);
    if (!order)
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory for the layout");
    r->by_position = order;
    size_t *sizes = malloc(most * sizeof *sizes), *offs = malloc(most * sizeof *offs);
    uint32_t *groups = malloc(most * sizeof *groups);
    if (!sizes || !offs || !groups) {
        free(sizes);
        free(offs);
        free(groups);
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory for the layout");
    }
    /* Trained modules first, then the frozen ones, each in id order (see Frozen modules). */
    size_t k = 0;
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < r->nmodules; i++)
            if (r->modules[i].frozen == (pass == 1))
                order[k++] = (strata_module_id)i;
    size_t pos = 0, shard_pos = 0;
    r->largest_module_numel = 0;
    r->largest_trained_numel = 0;
    r->nfrozen = 0;
    for (k = 0; k < r->nmodules; k++) {
        reg_module *m = &r->modules[order[k]];
        if (m->frozen && r->nfrozen++ == 0) {
            r->trained_numel = pos;
            r->shard_trained_numel = shard_pos;
        }
        m->offset = pos;
        for (size_t j = 0; j < m->nparams; j++) {
            sizes[j] = r->params[m->params[j]].numel;
            groups[j] = r->params[m->params[j]].group;
        }
        size_t one_rank = plan_module_layout(sizes, groups, m->nparams, offs, &m->used_numel);
        m->shard_numel = align_up((one_rank + world - 1) / world, ENGINE_MODULE_ALIGN);
        m->shard_offset = shard_pos;
        m->numel = m->shard_numel * world;
        for (size_t j = 0; j < m->nparams; j++)
            r->params[m->params[j]].offset = pos + offs[j];
        m->persistent = m->used_numel < persistence_threshold;
        pos += m->numel;
        shard_pos += m->shard_numel;
        r->largest_module_numel = MAX(r->largest_module_numel, m->numel);
        if (!m->frozen)
            r->largest_trained_numel = MAX(r->largest_trained_numel, m->numel);
    }
    r->total_numel = pos;
    r->shard_total_numel = shard_pos;
    if (r->nfrozen == 0) {
        r->trained_numel = pos;
        r->shard_trained_numel = shard_pos;
    }
    free(sizes);
    free(offs);
    free(groups);
    return STRATA_OK;
}

/* Appends a run unless it continues the last one. */
static void add_run(adam_run *runs, size_t *n, size_t start, strata_group_id group)
{
    if (*n == 0)
        runs[(*n)++] = (adam_run){0, group};
    else if (runs[*n - 1].group != group)
        runs[(*n)++] = (adam_run){start, group};
}

strata_status registry_group_runs(const registry *r, reg_view v, int rank, adam_run **out, size_t *count)
{
    *out = NULL;
    *count = 0;
    adam_run *runs = malloc(MAX(r->nparams, (size_t)1) * sizeof *runs);
    if (!runs)
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory for the parameter groups' runs");
    size_t n = 0;
    for (size_t k = 0; k < r->nmodules; k++) {
        const reg_module *m = &r->modules[r->by_position[k]];
        if (registry_view_count(m, v) == 0)
            continue; /* frozen, in a trained view */
        /* This rank's slice of the module, in full-view positions, and where it starts in view v. */
        bool sharded = registry_view_sharded(v);
        size_t lo = sharded ? m->offset + (size_t)rank * m->shard_numel : m->offset;
        size_t hi = sharded ? lo + m->shard_numel : m->offset + m->numel;
        size_t base = registry_view_offset(m, v);
        for (size_t j = 0; j < m->nparams; j++) {
            const reg_param *p = &r->params[m->params[j]];
            size_t from = MAX(p->offset, lo);
            if (from < p->offset + p->numel && from < hi)
                add_run(runs, &n, base + (from - lo), p->group);
        }
    }
    if (n == 0)
        runs[n++] = (adam_run){0, 0};
    *out = runs;
    *count = n;
    return STRATA_OK;
}

size_t registry_total_numel(const registry *r)
{
    return r->total_numel;
}

size_t registry_largest_module_numel(const registry *r)
{
    return r->largest_module_numel;
}

size_t registry_largest_trained_numel(const registry *r)
{
    return r->largest_trained_numel;
}

size_t registry_view_numel(const registry *r, reg_view v)
{
    switch (v) {
    case REG_SHARD: return r->shard_total_numel;
    case REG_FULL_TRAINED: return r->trained_numel;
    case REG_SHARD_TRAINED: return r->shard_trained_numel;
    default: return r->total_numel;
    }
}

size_t registry_view_offset(const reg_module *m, reg_view v)
{
    return registry_view_sharded(v) ? m->shard_offset : m->offset;
}

size_t registry_view_count(const reg_module *m, reg_view v)
{
    if (m->frozen && registry_view_trained(v))
        return 0;
    return registry_view_sharded(v) ? m->shard_numel : m->numel;
}

strata_module_id registry_module_by_position(const registry *r, size_t k)
{
    return r->by_position[k];
}

size_t registry_nfrozen(const registry *r)
{
    return r->nfrozen;
}

size_t registry_position_at(const registry *r, reg_view v, size_t pos)
{
    size_t lo = 0, hi = r->nmodules;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (registry_view_offset(&r->modules[r->by_position[mid]], v) <= pos)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

strata_module_id registry_module_at(const registry *r, reg_view v, size_t pos)
{
    return r->by_position[registry_position_at(r, v, pos)];
}
