/* The parts of tensors (strata_param_set_part) checked once the layout is known: what a checkpoint needs to write
 * and read each tensor whole, whatever its split. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "engine/registry.h"

/* "<module>.<param>" of p into out. */
static const char *full_name(const registry *r, const reg_param *p, char *out, size_t len)
{
    snprintf(out, len, "%s.%s", registry_module(r, p->module)->name, p->name);
    return out;
}

static int by_first(const void *a, const void *b, void *ctx)
{
    const registry *r = ctx;
    uint64_t x = registry_param(r, *(const strata_param_id *)a)->part_first;
    uint64_t y = registry_param(r, *(const strata_param_id *)b)->part_first;
    return x < y ? -1 : x > y;
}

/* The order checkpoints walk parameters in: by module id, then by place in the module. */
static bool walks_before(const reg_param *a, const reg_param *b)
{
    return a->module != b->module ? a->module < b->module : a->offset < b->offset;
}

/* Whether a parameter lies between a and b in that order (a before b). */
static bool between(const registry *r, const reg_param *a, const reg_param *b)
{
    for (size_t i = 0; i < registry_nparams(r); i++) {
        const reg_param *q = registry_param(r, (strata_param_id)i);
        if (walks_before(a, q) && walks_before(q, b))
            return true;
    }
    return false;
}

/* Two neighbouring parts (by element) of one tensor: the same shape, group and freezing, adjacent elements, and
 * adjacent places in the walk of a checkpoint (ckpt_stream.h), which then writes them as one piece. */
static strata_status check_pair(const registry *r, const reg_param *a, const reg_param *b)
{
    char an[2 * ENGINE_NAME_BYTES + 2], bn[2 * ENGINE_NAME_BYTES + 2];
    full_name(r, a, an, sizeof an);
    full_name(r, b, bn, sizeof bn);
    if (a->part_ndim != b->part_ndim || memcmp(a->part_dims, b->part_dims, sizeof a->part_dims) != 0) {
        char as[STRATA_MAX_DIMS * 24 + 8], bs[STRATA_MAX_DIMS * 24 + 8];
        registry_shape_str(a->part_ndim, a->part_dims, as, sizeof as);
        registry_shape_str(b->part_ndim, b->part_dims, bs, sizeof bs);
        return err_set(STRATA_EINVAL, "strata_param_set_part: tensor \"%s\": part \"%s\" declares the shape %s, part "
                       "\"%s\" %s; every part declares the whole tensor's shape", a->part_of, an, as, bn, bs);
    }
    uint64_t end = a->part_first + a->numel;
    if (b->part_first != end)
        return err_set(STRATA_EINVAL, "strata_param_set_part: tensor \"%s\": %s: part \"%s\" ends at element %" PRIu64
                       ", part \"%s\" starts at %" PRIu64 "; the parts must cover the tensor exactly once", a->part_of,
                       b->part_first < end ? "two parts overlap" : "a gap", an, end, bn, b->part_first);
    if (a->group != b->group)
        return err_set(STRATA_EINVAL, "strata_param_set_part: tensor \"%s\": parts \"%s\" and \"%s\" are in different "
                       "parameter groups (%u and %u); a tensor trains with one set of hyperparameters", a->part_of, an,
                       bn, a->group, b->group);
    if (registry_module(r, a->module)->frozen != registry_module(r, b->module)->frozen)
        return err_set(STRATA_EINVAL, "strata_param_set_part: tensor \"%s\": part \"%s\" is frozen, part \"%s\" is "
                       "not; freeze the modules of all of a tensor's parts or none", a->part_of,
                       registry_module(r, a->module)->frozen ? an : bn, registry_module(r, a->module)->frozen ? bn : an);
    if (!walks_before(a, b) || between(r, a, b))
        return err_set(STRATA_EINVAL, "strata_param_set_part: tensor \"%s\": part \"%s\" does not follow part \"%s\" "
                       "with no other parameter between them; add the modules of a tensor's parts one after another, "
                       "in the order of their elements, each holding only its part", a->part_of, bn, an);
    return STRATA_OK;
}

/* Every part of the tensor of part p (p is the first of them by id). */
static strata_status check_tensor(const registry *r, const reg_param *p, strata_param_id *ids)
{
    size_t n = 0;
    for (size_t i = 0; i < registry_nparams(r); i++) {
        const reg_param *q = registry_param(r, (strata_param_id)i);
        if (registry_param_is_part(q) && strcmp(q->part_of, p->part_of) == 0)
            ids[n++] = (strata_param_id)i;
    }
    qsort_r(ids, n, sizeof *ids, by_first, (void *)r);
    const reg_param *lo = registry_param(r, ids[0]), *hi = registry_param(r, ids[n - 1]);
    char name[2 * ENGINE_NAME_BYTES + 2];
    if (lo->part_first != 0)
        return err_set(STRATA_EINVAL, "strata_param_set_part: tensor \"%s\": a gap: no part holds elements [0, %" PRIu64
                       "), where its first part \"%s\" starts", p->part_of, lo->part_first,
                       full_name(r, lo, name, sizeof name));
    for (size_t k = 1; k < n; k++)
        ERR_CHECK(check_pair(r, registry_param(r, ids[k - 1]), registry_param(r, ids[k])));
    if (hi->part_first + hi->numel != hi->part_total)
        return err_set(STRATA_EINVAL, "strata_param_set_part: tensor \"%s\": a gap: its last part \"%s\" ends at "
                       "element %" PRIu64 " of %" PRIu64 "; the parts must cover the tensor exactly once", p->part_of,
                       full_name(r, hi, name, sizeof name), hi->part_first + hi->numel, hi->part_total);
    return STRATA_OK;
}

/* A checkpoint names a whole parameter "<module>.<param>": a tensor of that name would be two tensors in one. */
static strata_status check_clash(const registry *r, const reg_param *p)
{
    char name[2 * ENGINE_NAME_BYTES + 2];
    for (size_t i = 0; i < registry_nparams(r); i++) {
        const reg_param *q = registry_param(r, (strata_param_id)i);
        if (!registry_param_is_part(q) && strcmp(full_name(r, q, name, sizeof name), p->part_of) == 0)
            return err_set(STRATA_EINVAL, "strata_param_set_part: tensor \"%s\" has the name of parameter %zu, a "
                           "whole tensor in checkpoints; give the parts' tensor another name", p->part_of, i);
    }
    return STRATA_OK;
}

/* Whether an earlier parameter (by id) is a part of p's tensor: each tensor is checked once, at its first part. */
static bool seen_before(const registry *r, strata_param_id id)
{
    const reg_param *p = registry_param(r, id);
    for (strata_param_id i = 0; i < id; i++) {
        const reg_param *q = registry_param(r, i);
        if (registry_param_is_part(q) && strcmp(q->part_of, p->part_of) == 0)
            return true;
    }
    return false;
}

strata_status registry_check_parts(const registry *r)
{
    size_t np = registry_nparams(r), nparts = 0;
    for (size_t i = 0; i < np; i++)
        nparts += registry_param_is_part(registry_param(r, (strata_param_id)i));
    if (!nparts)
        return STRATA_OK;
    strata_param_id *ids = malloc(nparts * sizeof *ids);
    if (!ids)
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory checking %zu parts", nparts);
    strata_status st = STRATA_OK;
    for (size_t i = 0; i < np && st == STRATA_OK; i++) {
        const reg_param *p = registry_param(r, (strata_param_id)i);
        if (!registry_param_is_part(p) || seen_before(r, (strata_param_id)i))
            continue;
        st = check_clash(r, p);
        if (st == STRATA_OK)
            st = check_tensor(r, p, ids);
    }
    free(ids);
    return st;
}
