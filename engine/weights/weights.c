/* strata_weights_open, strata_param_load and the queries: the engine's weights and the parameters that load them. */
#include "engine/weights/weights.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/weights/weights_source.h"

#define MAX_WEIGHTS 1024 /* sources one engine may open */

/* One loaded parameter: its init_ctx (the pointer stays put while the set grows). */
typedef struct weights_binding {
    strata_engine *e;
    strata_param_id param;
    weights_source *src;
    const weights_entry *entry;
    bool transpose;
} weights_binding;

struct weights_set {
    weights_source **src;
    size_t nsrc;
    weights_binding **bind;
    size_t nbind;
};

void weights_destroy(weights_set *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->nsrc; i++)
        weights_source_destroy(w->src[i]);
    for (size_t i = 0; i < w->nbind; i++)
        free(w->bind[i]);
    free(w->src);
    free(w->bind);
    free(w);
}

void weights_finalized(weights_set *w)
{
    for (size_t i = 0; w && i < w->nsrc; i++)
        weights_source_close_files(w->src[i]);
}

static const reg_param *param_of(const weights_binding *b)
{
    return registry_param(b->e->reg, b->param);
}

/* "<module>.<param>" of a binding's parameter, for messages. */
static void param_name(const strata_engine *e, strata_param_id id, char *out, size_t len)
{
    const reg_param *p = registry_param(e->reg, id);
    snprintf(out, len, "%s.%s", registry_module(e->reg, p->module)->name, p->name);
}

/* The declared shape [rows, cols] of the parameter's tensor (its own, or the whole one it is a part of) for a
 * transposed load; false when it has none of 2 dimensions. */
static bool rows_cols(reg_tensor whole, uint64_t *rows, uint64_t *cols)
{
    if (whole.ndim != 2)
        return false;
    *rows = whole.dims[0];
    *cols = whole.dims[1];
    return true;
}

/* A part of a larger tensor (strata_param_set_part) reads its elements of the file's whole tensor. */
static strata_status init_from_weights(void *ctx, strata_param_id param, size_t offset, size_t count, float *out)
{
    weights_binding *b = ctx;
    reg_tensor whole = registry_param_tensor(param_of(b));
    uint64_t rows = 0, cols = 0;
    if (b->transpose && !rows_cols(whole, &rows, &cols))
        return err_set(STRATA_EINTERNAL, "weights: the transposed load of parameter %u lost its shape", param);
    return weights_source_read(b->src, b->entry, b->transpose, rows, cols, (size_t)whole.first + offset, count, out);
}

/* What strata_param_load checks at once (at_finalize false) and finalize again with the shape (true). The message
 * names the call (what), the parameter, the tensor and its file. */
static strata_status check_binding(const weights_binding *b, bool at_finalize, const char *what)
{
    const reg_param *p = param_of(b);
    const ckpt_tensor *t = b->entry->t;
    const char *file = weights_source_file(b->src, b->entry);
    char pn[2 * ENGINE_NAME_BYTES + 2];
    param_name(b->e, b->param, pn, sizeof pn);
    if (!weights_dtype_readable(t->st_dtype))
        return err_set(STRATA_EINVAL, "%s: parameter \"%s\" loads tensor \"%s\" of \"%s\", whose dtype %s is not "
                       "one strata reads into fp32 parameters (F32, F16, BF16, F64)", what, pn, t->name, file,
                       ckpt_st_dtype_name(t->st_dtype));
    /* A part of a larger tensor loads from the whole tensor: its size and shape are the whole one's. */
    reg_tensor whole = registry_param_tensor(p);
    const char *of = registry_param_is_part(p) ? ", as a part of tensor " : "";
    const char *part = registry_param_is_part(p) ? p->part_of : "";
    if (t->total != whole.total)
        return err_set(STRATA_EINVAL, "%s: parameter \"%s\"%s%s has %" PRIu64 " elements, tensor \"%s\" of \"%s\" has "
                       "%" PRIu64 "%s", what, pn, of, part, whole.total, t->name, file, t->total,
                       !registry_param_is_part(p) && t->total > p->numel
                           ? " (a part of a larger tensor loads from the whole one: declare it with "
                             "strata_param_set_part before strata_param_load)"
                           : "");
    if (!at_finalize)
        return STRATA_OK;
    char ps[160], ts[160];
    registry_shape_str(whole.ndim, whole.dims, ps, sizeof ps);
    registry_shape_str(t->ndim, t->dims, ts, sizeof ts);
    if (b->transpose) {
        uint64_t rows, cols;
        if (!rows_cols(whole, &rows, &cols))
            return err_set(STRATA_EINVAL, "%s: parameter \"%s\" loads tensor \"%s\" of \"%s\" transposed "
                           "(STRATA_LOAD_TRANSPOSE), which needs a 2-D shape declared with strata_param_set_shape "
                           "(or strata_param_set_part); it has %s", what, pn, t->name, file, whole.ndim ? ps : "none");
        if (t->ndim != 2 || t->dims[0] != cols || t->dims[1] != rows)
            return err_set(STRATA_EINVAL, "%s: parameter \"%s\" has shape %s; tensor \"%s\" of \"%s\" has shape %s, "
                           "which is not its transpose [%" PRIu64 ", %" PRIu64 "]", what, pn, ps, t->name, file, ts,
                           cols, rows);
    } else if (whole.ndim) {
        bool same = whole.ndim == t->ndim;
        for (int d = 0; same && d < whole.ndim; d++)
            same = whole.dims[d] == t->dims[d];
        if (!same)
            return err_set(STRATA_EINVAL, "%s: parameter \"%s\" has shape %s, tensor \"%s\" of \"%s\" has shape %s",
                           what, pn, ps, t->name, file, ts);
    }
    return weights_source_recheck(b->src, b->entry);
}

strata_status weights_check(strata_engine *e)
{
    weights_set *w = e->weights;
    if (!w)
        return STRATA_OK;
    strata_status first = STRATA_OK;
    char msg[ERR_MSG_BYTES];
    size_t failed = 0;
    for (size_t i = 0; i < w->nbind; i++) {
        strata_status st = check_binding(w->bind[i], true, "strata_engine_finalize");
        if (st != STRATA_OK && failed++ == 0) {
            first = st;
            snprintf(msg, sizeof msg, "%s", err_last());
        }
    }
    if (failed > 1)
        return err_set(first, "%s (and %zu more loaded parameters fail their checks; nothing was written)", msg,
                       failed - 1);
    return failed ? err_set(first, "%s (nothing was written)", msg) : STRATA_OK;
}

/* ---------------------------------------------------------------- the public calls */

static strata_status weights_get(const strata_engine *e, strata_weights_id id, const char *what,
                                 weights_source **out)
{
    if (!e->weights || id >= e->weights->nsrc)
        return err_set(STRATA_EINVAL, "%s: weights id %u is not one strata_weights_open returned (%zu opened)", what,
                       id, e->weights ? e->weights->nsrc : 0);
    *out = e->weights->src[id];
    return STRATA_OK;
}

static strata_status open_weights(strata_engine *e, const char *path, strata_weights_id *out)
{
    if (e->finalized)
        return err_set(STRATA_ESTATE, "strata_weights_open: the engine is finalized; initial weights are read by "
                       "strata_engine_finalize, so open them before it");
    if (!e->weights && !(e->weights = calloc(1, sizeof *e->weights)))
        return err_set(STRATA_ENOMEM, "strata_weights_open: out of memory");
    weights_set *w = e->weights;
    if (w->nsrc == MAX_WEIGHTS)
        return err_set(STRATA_ENOMEM, "strata_weights_open: %d weights are open already, the most one engine holds",
                       MAX_WEIGHTS);
    weights_source **grown = realloc(w->src, (w->nsrc + 1) * sizeof *grown);
    if (!grown)
        return err_set(STRATA_ENOMEM, "strata_weights_open: out of memory");
    w->src = grown;
    weights_source *s = NULL;
    ERR_CHECK(weights_source_open(path, &s));
    w->src[w->nsrc] = s;
    *out = (strata_weights_id)w->nsrc++;
    return STRATA_OK;
}

STRATA_API strata_status strata_weights_open(strata_engine *e, const char *path, strata_weights_id *out)
{
    if (!e || !out)
        return err_set(STRATA_EINVAL, "strata_weights_open: engine or out is NULL");
    *out = STRATA_INVALID_ID;
    return err_copy(&e->err, open_weights(e, path, out));
}

STRATA_API strata_status strata_weights_count(const strata_engine *e, strata_weights_id id, size_t *count)
{
    if (!e || !count)
        return err_set(STRATA_EINVAL, "strata_weights_count: engine or count is NULL");
    weights_source *s = NULL;
    strata_status st = weights_get(e, id, "strata_weights_count", &s);
    *count = st == STRATA_OK ? weights_source_count(s) : 0;
    return err_copy((err_slot *)&e->err, st);
}

static void describe(const weights_source *s, const weights_entry *en, strata_weights_tensor *out)
{
    memset(out, 0, sizeof *out);
    out->name = en->t->name;
    out->file = weights_source_file(s, en);
    out->dtype = ckpt_st_dtype_name(en->t->st_dtype);
    out->ndim = en->t->ndim;
    for (int d = 0; d < en->t->ndim; d++)
        out->dims[d] = (int64_t)en->t->dims[d];
    out->numel = en->t->total;
}

STRATA_API strata_status strata_weights_tensor_at(strata_engine *e, strata_weights_id id, size_t index,
                                                  strata_weights_tensor *out)
{
    if (!e || !out)
        return err_set(STRATA_EINVAL, "strata_weights_tensor_at: engine or out is NULL");
    weights_source *s = NULL;
    strata_status st = weights_get(e, id, "strata_weights_tensor_at", &s);
    if (st == STRATA_OK && index >= weights_source_count(s))
        st = err_set(STRATA_EINVAL, "strata_weights_tensor_at: index %zu is past the %zu tensors of \"%s\"", index,
                     weights_source_count(s), weights_source_path(s));
    if (st == STRATA_OK)
        describe(s, weights_source_entry(s, index), out);
    return err_copy(&e->err, st);
}

/* The entry called name, or STRATA_ENOTFOUND naming the weights and the nearest name. */
static strata_status find(const weights_source *s, const char *name, const char *what, const weights_entry **out)
{
    *out = name ? weights_source_find(s, name) : NULL;
    if (*out)
        return STRATA_OK;
    const char *near = name ? weights_source_nearest(s, name) : NULL;
    return err_set(STRATA_ENOTFOUND, "%s: weights \"%s\" hold no tensor \"%s\" (%zu tensors)%s%s%s", what,
                   weights_source_path(s), name ? name : "(NULL)", weights_source_count(s),
                   near ? "; did you mean \"" : "", near ? near : "", near ? "\"?" : "");
}

STRATA_API strata_status strata_weights_find(strata_engine *e, strata_weights_id id, const char *name,
                                             strata_weights_tensor *out)
{
    if (!e || !out)
        return err_set(STRATA_EINVAL, "strata_weights_find: engine or out is NULL");
    weights_source *s = NULL;
    const weights_entry *en = NULL;
    strata_status st = weights_get(e, id, "strata_weights_find", &s);
    if (st == STRATA_OK)
        st = find(s, name, "strata_weights_find", &en);
    if (st == STRATA_OK)
        describe(s, en, out);
    return err_copy(&e->err, st);
}

static strata_status load(strata_engine *e, strata_param_id param, strata_weights_id id, const char *tensor,
                          unsigned flags)
{
    const char *what = "strata_param_load";
    if (e->finalized)
        return err_set(STRATA_ESTATE, "%s: the engine is finalized; load parameters before strata_engine_finalize",
                       what);
    if (!registry_find_param(e->reg, param, what))
        return STRATA_ESTATE; /* as every call on a parameter: the registry's message names the id */
    if (flags & ~STRATA_LOAD_TRANSPOSE)
        return err_set(STRATA_EINVAL, "%s: flags 0x%x: allowed is STRATA_LOAD_TRANSPOSE (0x%x) or 0", what, flags,
                       STRATA_LOAD_TRANSPOSE);
    weights_source *s = NULL;
    const weights_entry *en;
    ERR_CHECK(weights_get(e, id, what, &s));
    ERR_CHECK(find(s, tensor, what, &en));
    weights_set *w = e->weights;
    weights_binding *b = NULL;
    for (size_t i = 0; i < w->nbind && !b; i++)
        if (w->bind[i]->param == param)
            b = w->bind[i];
    weights_binding next = {e, param, s, en, (flags & STRATA_LOAD_TRANSPOSE) != 0};
    ERR_CHECK(check_binding(&next, false, what));
    if (!b) {
        weights_binding **grown = realloc(w->bind, (w->nbind + 1) * sizeof *grown);
        if (!grown || !(b = malloc(sizeof *b))) {
            if (grown)
                w->bind = grown;
            return err_set(STRATA_ENOMEM, "%s: out of memory", what);
        }
        w->bind = grown;
        w->bind[w->nbind++] = b;
    }
    *b = next;
    registry_param_set_init(e->reg, param, init_from_weights, b);
    return STRATA_OK;
}

STRATA_API strata_status strata_param_load(strata_engine *e, strata_param_id param, strata_weights_id weights,
                                           const char *tensor, unsigned flags)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_param_load: engine is NULL");
    return err_copy(&e->err, load(e, param, weights, tensor, flags));
}
