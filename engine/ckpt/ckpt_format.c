/* Safetensors headers and the checkpoint manifest: build and bounds-checked parse (jansson). */
#include "engine/ckpt/ckpt_format.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "engine/ckpt/ckpt_seal.h"
#include "engine/config/config_schema.h"

const char *const ckpt_file_names[CKPT_FILE_COUNT] = {"model.safetensors", "optimizer.safetensors",
                                                      "params.safetensors"};
/* Every dtype the safetensors format names, indexed by ckpt_st_dtype; dt is the strata dtype that stores it, or
 * STRATA_DTYPE_NONE for those only a foreign file holds. */
static const struct {
    const char *name;
    strata_dtype dt;
    size_t bytes;
} dtypes[CKPT_ST_COUNT] = {
    [CKPT_ST_F32] = {"F32", STRATA_DTYPE_FP32, 4},  [CKPT_ST_BF16] = {"BF16", STRATA_DTYPE_BF16, 2},
    [CKPT_ST_F16] = {"F16", STRATA_DTYPE_FP16, 2},  [CKPT_ST_F64] = {"F64", STRATA_DTYPE_NONE, 8},
    [CKPT_ST_I64] = {"I64", STRATA_DTYPE_NONE, 8},  [CKPT_ST_I32] = {"I32", STRATA_DTYPE_NONE, 4},
    [CKPT_ST_I16] = {"I16", STRATA_DTYPE_NONE, 2},  [CKPT_ST_I8] = {"I8", STRATA_DTYPE_NONE, 1},
    [CKPT_ST_U64] = {"U64", STRATA_DTYPE_NONE, 8},  [CKPT_ST_U32] = {"U32", STRATA_DTYPE_NONE, 4},
    [CKPT_ST_U16] = {"U16", STRATA_DTYPE_NONE, 2},  [CKPT_ST_U8] = {"U8", STRATA_DTYPE_NONE, 1},
    [CKPT_ST_BOOL] = {"BOOL", STRATA_DTYPE_NONE, 1}, [CKPT_ST_F8_E4M3] = {"F8_E4M3", STRATA_DTYPE_NONE, 1},
    [CKPT_ST_F8_E5M2] = {"F8_E5M2", STRATA_DTYPE_NONE, 1},
};

const char *ckpt_dtype_name(strata_dtype dt)
{
    for (size_t i = 0; i < CKPT_ST_COUNT; i++)
        if (dtypes[i].dt == dt && dt != STRATA_DTYPE_NONE)
            return dtypes[i].name;
    return "?";
}

size_t ckpt_dtype_bytes(strata_dtype dt)
{
    for (size_t i = 0; i < CKPT_ST_COUNT; i++)
        if (dtypes[i].dt == dt && dt != STRATA_DTYPE_NONE)
            return dtypes[i].bytes;
    return 0;
}

const char *ckpt_st_dtype_name(ckpt_st_dtype st)
{
    return (unsigned)st < CKPT_ST_COUNT ? dtypes[st].name : "?";
}

size_t ckpt_st_dtype_bytes(ckpt_st_dtype st)
{
    return (unsigned)st < CKPT_ST_COUNT ? dtypes[st].bytes : 0;
}

/* A dtype name of the header: any safetensors dtype in a foreign file, only strata's own in a checkpoint. */
static bool st_dtype_parse(const char *s, bool foreign, ckpt_tensor *t)
{
    for (size_t i = 0; i < CKPT_ST_COUNT; i++)
        if (strcmp(dtypes[i].name, s) == 0 && (foreign || dtypes[i].dt != STRATA_DTYPE_NONE)) {
            t->st_dtype = (ckpt_st_dtype)i;
            t->dtype = dtypes[i].dt;
            return true;
        }
    return false;
}

/* One of strata's dtypes by its safetensors name. */
static bool dtype_parse(const char *s, strata_dtype *out)
{
    for (size_t i = 0; i < CKPT_ST_COUNT; i++)
        if (strcmp(dtypes[i].name, s) == 0 && dtypes[i].dt != STRATA_DTYPE_NONE) {
            *out = dtypes[i].dt;
            return true;
        }
    return false;
}

/* A non-negative JSON integer. */
static bool get_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

/* The fields every tensor entry shares (safetensors header and manifest): dtype, shape, data_offsets, and in a
 * manifest of version 2 the piece's "elements" [first, end) (else the piece is the whole tensor). data_bytes bounds
 * the offsets. */
static strata_status tensor_parse(const json_t *obj, const char *offsets_key, bool pieces, bool foreign,
                                  uint64_t data_bytes, const char *origin, ckpt_tensor *t)
{
    const char *nm = t->name;
    if (!json_is_object(obj))
        return err_set(STRATA_ECORRUPT, "%s: tensor \"%s\": its entry is not a JSON object", origin, nm);
    const json_t *dt = json_object_get(obj, "dtype");
    if (!json_is_string(dt) || !st_dtype_parse(json_string_value(dt), foreign, t))
        return err_set(STRATA_ECORRUPT, "%s: tensor \"%s\": dtype %s is not one of %s", origin, nm,
                       json_is_string(dt) ? json_string_value(dt) : "(missing)",
                       foreign ? "the safetensors dtypes (F64, F32, F16, BF16, I64, ..., BOOL, F8_E4M3, F8_E5M2)"
                               : "F32, BF16, F16");
    const json_t *shape = json_object_get(obj, "shape");
    if (!json_is_array(shape) || json_array_size(shape) > STRATA_MAX_DIMS)
        return err_set(STRATA_ECORRUPT, "%s: tensor \"%s\": shape is missing or has more than 8 dimensions", origin,
                       nm);
    uint64_t numel = 1;
    for (size_t i = 0; i < json_array_size(shape); i++) {
        uint64_t d;
        if (!get_u64(json_array_get(shape, i), &d))
            return err_set(STRATA_ECORRUPT, "%s: tensor \"%s\": shape[%zu] is not a non-negative integer", origin, nm,
                           i);
        if (d && numel > UINT64_MAX / 8 / d)
            return err_set(STRATA_ECORRUPT, "%s: tensor \"%s\": shape overflows 64 bits", origin, nm);
        numel *= d;
    }
    t->total = numel;
    t->first = 0;
    t->numel = numel;
    if (pieces) {
        const json_t *el = json_object_get(obj, "elements");
        uint64_t end = 0;
        if (!json_is_array(el) || json_array_size(el) != 2 || !get_u64(json_array_get(el, 0), &t->first) ||
            !get_u64(json_array_get(el, 1), &end) || t->first >= end || end > t->total)
            return err_set(STRATA_ECORRUPT, "%s: tensor \"%s\": elements must be [first, end) with first < end <= "
                           "%" PRIu64 " (its shape's elements)", origin, nm, t->total);
        t->numel = end - t->first;
    }
    const json_t *off = json_object_get(obj, offsets_key);
    if (!json_is_array(off) || json_array_size(off) != 2 || !get_u64(json_array_get(off, 0), &t->begin) ||
        !get_u64(json_array_get(off, 1), &t->end))
        return err_set(STRATA_ECORRUPT, "%s: tensor \"%s\": %s must be [begin, end] of non-negative integers",
                       origin, nm, offsets_key);
    if (t->begin > t->end || t->end > data_bytes)
        return err_set(STRATA_ECORRUPT, "%s: tensor \"%s\": %s [%" PRIu64 ", %" PRIu64 ") lie outside the %" PRIu64
                       " bytes of data (truncated file?)", origin, nm, offsets_key, t->begin, t->end, data_bytes);
    if (t->end - t->begin != t->numel * ckpt_st_dtype_bytes(t->st_dtype))
        return err_set(STRATA_ECORRUPT, "%s: tensor \"%s\": %" PRIu64 " bytes of data for %" PRIu64
                       " elements of %s", origin, nm, t->end - t->begin, t->numel, json_string_value(dt));
    return STRATA_OK;
}

static bool set_name(ckpt_tensor *t, const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n >= sizeof t->name)
        return false;
    memcpy(t->name, name, n + 1);
    return true;
}

strata_status ckpt_st_header_parse(const uint8_t *bytes, size_t len, uint64_t file_bytes, bool foreign,
                                   const char *origin, ckpt_st_header *out)
{
    memset(out, 0, sizeof *out);
    if (len < 8 || file_bytes < 8)
        return err_set(STRATA_ECORRUPT, "%s: %" PRIu64 " bytes is too short for a safetensors file (truncated?)",
                       origin, file_bytes);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | bytes[i];
    if (n > CKPT_MAX_HEADER_BYTES || n > file_bytes - 8)
        return err_set(STRATA_ECORRUPT, "%s: header length %" PRIu64 " exceeds the file (%" PRIu64 " bytes) or the "
                       "%" PRIu64 "-byte limit (truncated or not a safetensors file)", origin, n, file_bytes,
                       CKPT_MAX_HEADER_BYTES);
    if (len - 8 < n)
        return err_set(STRATA_EINTERNAL, "%s: the caller passed %zu bytes, the header needs %" PRIu64, origin, len,
                       n + 8);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)bytes + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return err_set(STRATA_ECORRUPT, "%s: the header is not valid JSON: %s (line %d)", origin, jerr.text,
                       jerr.line);
    strata_status st = STRATA_OK;
    uint64_t data_bytes = file_bytes - 8 - n;
    if (!json_is_object(root)) {
        st = err_set(STRATA_ECORRUPT, "%s: the header is not a JSON object", origin);
        goto out;
    }
    out->data_start = 8 + n;
    out->tensors = calloc(json_object_size(root) + 1, sizeof *out->tensors);
    if (!out->tensors) {
        st = err_set(STRATA_ENOMEM, "%s: out of memory for %zu tensors", origin, json_object_size(root));
        goto out;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0)
            continue;
        ckpt_tensor *t = &out->tensors[out->ntensors];
        if (!set_name(t, key)) {
            st = err_set(STRATA_ECORRUPT, "%s: a tensor name is empty or longer than %d bytes", origin,
                         CKPT_NAME_BYTES - 1);
            goto out;
        }
        t->file = -1;
        if ((st = tensor_parse(val, "data_offsets", false, foreign, data_bytes, origin, t)) != STRATA_OK)
            goto out;
        /* The shape the file stores it in (tensor_parse checked every dimension). */
        const json_t *shape = json_object_get(val, "shape");
        t->ndim = (int)json_array_size(shape);
        for (int d = 0; d < t->ndim; d++)
            t->dims[d] = (uint64_t)json_integer_value(json_array_get(shape, (size_t)d));
        out->ntensors++;
    }
out:
    json_decref(root);
    if (st != STRATA_OK)
        ckpt_st_header_free(out);
    return st;
}

void ckpt_st_header_free(ckpt_st_header *h)
{
    free(h->tensors);
    memset(h, 0, sizeof *h);
}

static json_t *u64_pair(uint64_t a, uint64_t b)
{
    return json_pack("[II]", (json_int_t)a, (json_int_t)b);
}

/* [d0, d1, ...]: the model shape, or [n] when there is none. */
static json_t *shape_json(int ndim, const uint64_t *dims, uint64_t n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < (ndim ? ndim : 1); i++)
        json_array_append_new(a, json_integer((json_int_t)(ndim ? dims[i] : n)));
    return a;
}

void ckpt_piece_key(const ckpt_tensor *prev, const ckpt_tensor *t, const ckpt_tensor *next, char *out)
{
    bool shared = (prev && strcmp(prev->name, t->name) == 0) || (next && strcmp(next->name, t->name) == 0);
    if (shared)
        snprintf(out, CKPT_NAME_BYTES, "%.*s@%" PRIu64, CKPT_NAME_BYTES - 22, t->name, t->first); /* names < 150 */
    else
        snprintf(out, CKPT_NAME_BYTES, "%s", t->name);
}

strata_status ckpt_st_header_build(ckpt_tensor *tensors, size_t n, bool model_shape, uint8_t **out, size_t *out_len)
{
    *out = NULL;
    json_t *root = json_object();
    uint64_t pos = 0;
    for (size_t i = 0; root && i < n; i++) {
        ckpt_tensor *t = &tensors[i];
        t->begin = pos;
        t->end = pos + t->numel * ckpt_dtype_bytes(t->dtype);
        pos = t->end;
        bool shaped = model_shape && t->ndim && t->numel == t->total;
        json_t *e = json_pack("{s:s, s:o, s:o}", "dtype", ckpt_dtype_name(t->dtype), "shape",
                              shape_json(shaped ? t->ndim : 0, t->dims, t->numel), "data_offsets",
                              u64_pair(t->begin, t->end));
        char key[CKPT_NAME_BYTES];
        ckpt_piece_key(i ? &tensors[i - 1] : NULL, t, i + 1 < n ? &tensors[i + 1] : NULL, key);
        if (!e || json_object_set_new(root, key, e) != 0) {
            json_decref(root);
            root = NULL;
        }
    }
    if (root)
        json_object_set_new(root, "__metadata__", json_pack("{s:s}", "format", "pt"));
    char *text = root ? json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!text)
        return err_set(STRATA_ENOMEM, "checkpoint: out of memory building a safetensors header");
    /* Pad the JSON with spaces so the data section starts 8-byte aligned (the format allows it). */
    size_t jl = strlen(text), padded = (jl + 7) / 8 * 8;
    uint8_t *buf = malloc(8 + padded);
    if (!buf) {
        free(text);
        return err_set(STRATA_ENOMEM, "checkpoint: out of memory building a safetensors header");
    }
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, text, jl);
    memset(buf + 8 + jl, ' ', padded - jl);
    free(text);
    *out = buf;
    *out_len = 8 + padded;
    return STRATA_OK;
}

/* ---------------------------------------------------------------- manifest */

/* Doubles travel as C99 hex floats: exact, and inf/NaN (an overflowed fp16 step's norm) survive. */
static json_t *hex_double(double v)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%a", v);
    return json_string(buf);
}

static bool parse_double(const json_t *v, double *out)
{
    if (json_is_number(v)) {
        *out = json_number_value(v);
        return true;
    }
    if (!json_is_string(v))
        return false;
    char *end;
    *out = strtod(json_string_value(v), &end);
    return end != json_string_value(v) && *end == '\0';
}

/* The form of the moments in the manifest's config (fp32 when it predates strata.optimizer_moments). */
static strata_moments moments_of(const json_t *root)
{
    const json_t *v = json_object_get(json_object_get(root, "config"), "strata.optimizer_moments");
    const cfg_key *k = cfg_key_find("strata.optimizer_moments");
    for (size_t i = 0; json_is_string(v) && k->choices[i].name; i++)
        if (strcmp(json_string_value(v), k->choices[i].name) == 0)
            return (strata_moments)k->choices[i].value;
    return STRATA_MOMENTS_FP32;
}

static json_t *config_object(const strata_config *cfg)
{
    json_t *o = json_object();
    for (size_t i = 0; o && i < cfg_key_count; i++) {
        const cfg_key *k = &cfg_keys[i];
        if (!cfg_key_is_setting(k))
            continue;
        char value[1024];
        cfg_key_format(k, cfg, value, sizeof value);
        json_object_set_new(o, k->path, json_string(value));
    }
    return o;
}

strata_status ckpt_manifest_build(const ckpt_manifest *m, const strata_config *cfg, char **out)
{
    *out = NULL;
    char fname[CKPT_FILE_NAME_BYTES];
    json_t *files = json_object(), *tensors = json_array();
    for (int r = 0; files && r < m->world; r++)
        for (int f = 0; f < CKPT_FILE_COUNT; f++)
            if (ckpt_manifest_file_bytes(m, r, f)) {
                ckpt_file_name(m->world, r, f, fname);
                json_object_set_new(files, fname, json_integer((json_int_t)ckpt_manifest_file_bytes(m, r, f)));
            }
    for (size_t i = 0; tensors && i < m->ntensors; i++) {
        const ckpt_tensor *t = &m->tensors[i];
        char crc[16];
        snprintf(crc, sizeof crc, "%08x", t->crc);
        ckpt_file_name(m->world, t->rank, t->file, fname);
        json_t *e = json_pack("{s:s, s:s, s:s, s:[I], s:[I,I], s:o, s:s}", "name", t->name, "file", fname, "dtype",
                              ckpt_dtype_name(t->dtype), "shape", (json_int_t)t->total, "elements",
                              (json_int_t)t->first, (json_int_t)(t->first + t->numel), "offsets",
                              u64_pair(t->begin, t->end), "crc32c", crc);
        if (e && t->ndim)
            json_object_set_new(e, "model_shape", shape_json(t->ndim, t->dims, 0));
        json_array_append_new(tensors, e);
    }
    json_t *pending = json_null();
    if (m->pending)
        pending = json_pack("{s:b, s:I, s:o, s:o}", "skipped", m->pending_result.skipped, "step",
                            (json_int_t)m->pending_result.step, "grad_norm", hex_double(m->pending_result.grad_norm),
                            "loss_scale", hex_double(m->pending_result.loss_scale));
    json_t *root = json_pack("{s:s, s:i, s:s, s:i, s:I, s:I, s:I, s:I, s:o, s:i, s:i, s:s, s:o, s:o, s:o}", "format",
                             "strata-checkpoint", "version", CKPT_FORMAT_VERSION, "strata_version", strata_version(),
                             "world_size", m->world, "step", (json_int_t)m->step, "iterations",
                             (json_int_t)m->iterations, "steps", (json_int_t)m->steps, "skipped_steps",
                             (json_int_t)m->skipped_steps, "loss_scale", hex_double(m->loss_scale), "good_steps",
                             m->good_steps, "hysteresis_left", m->hysteresis_left, "param_dtype",
                             ckpt_dtype_name(m->param_dtype), "pending_update", pending, "files", files, "tensors",
                             tensors);
    if (root && cfg)
        json_object_set_new(root, "config", config_object(cfg));
    if (root && m->groups_json)
        json_object_set_new(root, "param_groups", json_loads(m->groups_json, 0, NULL));
    if (root && ckpt_seal(root) != STRATA_OK) {
        json_decref(root);
        return STRATA_ENOMEM;
    }
    char *text = root ? json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!text)
        return err_set(STRATA_ENOMEM, "checkpoint: out of memory building the manifest");
    *out = text;
    return STRATA_OK;
}

static strata_status get_i64(const json_t *root, const char *key, const char *origin, int64_t *out)
{
    const json_t *v = json_object_get(root, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return err_set(STRATA_ECORRUPT, "%s: \"%s\" is missing or not a non-negative integer", origin, key);
    *out = json_integer_value(v);
    return STRATA_OK;
}

static strata_status get_int(const json_t *root, const char *key, const char *origin, int *out)
{
    int64_t v = 0;
    ERR_CHECK(get_i64(root, key, origin, &v));
    if (v > INT32_MAX)
        return err_set(STRATA_ECORRUPT, "%s: \"%s\" = %" PRId64 " is out of range", origin, key, v);
    *out = (int)v;
    return STRATA_OK;
}

static strata_status parse_pending(const json_t *p, const char *origin, ckpt_manifest *m)
{
    if (json_is_null(p) || !p)
        return STRATA_OK;
    const json_t *sk = json_object_get(p, "skipped");
    if (!json_is_object(p) || !json_is_boolean(sk) || !parse_double(json_object_get(p, "grad_norm"),
                                                                    &m->pending_result.grad_norm) ||
        !parse_double(json_object_get(p, "loss_scale"), &m->pending_result.loss_scale))
        return err_set(STRATA_ECORRUPT, "%s: \"pending_update\" must hold skipped, step, grad_norm and loss_scale",
                       origin);
    m->pending = true;
    m->pending_result.skipped = json_is_true(sk);
    m->pending_result.delayed = true;
    return get_i64(p, "step", origin, &m->pending_result.step);
}

/* An entry's optional "model_shape": 1 to STRATA_MAX_DIMS dimensions, each >= 1, whose product is the tensor's. */
static strata_status model_shape_parse(const json_t *a, const char *origin, ckpt_tensor *t)
{
    if (!a)
        return STRATA_OK;
    size_t n = json_is_array(a) ? json_array_size(a) : 0;
    uint64_t product = 1;
    bool ok = n >= 1 && n <= STRATA_MAX_DIMS;
    for (size_t i = 0; ok && i < n; i++) {
        ok = get_u64(json_array_get(a, i), &t->dims[i]) && t->dims[i] >= 1 && product <= UINT64_MAX / t->dims[i];
        product = ok ? product * t->dims[i] : 0;
    }
    if (!ok || product != t->total)
        return err_set(STRATA_ECORRUPT, "%s: tensor \"%s\": model_shape must be 1 to %d dimensions of at least 1 "
                       "whose product is its %" PRIu64 " elements", origin, t->name, STRATA_MAX_DIMS, t->total);
    t->ndim = (int)n;
    return STRATA_OK;
}

static strata_status parse_tensors(const json_t *arr, const char *origin, ckpt_manifest *m)
{
    if (!json_is_array(arr))
        return err_set(STRATA_ECORRUPT, "%s: \"tensors\" is missing or not an array", origin);
    m->tensors = calloc(json_array_size(arr) + 1, sizeof *m->tensors);
    if (!m->tensors)
        return err_set(STRATA_ENOMEM, "%s: out of memory for %zu tensors", origin, json_array_size(arr));
    for (size_t i = 0; i < json_array_size(arr); i++) {
        const json_t *e = json_array_get(arr, i);
        ckpt_tensor *t = &m->tensors[i];
        const json_t *nm = json_object_get(e, "name"), *file = json_object_get(e, "file");
        const json_t *crc = json_object_get(e, "crc32c");
        if (!json_is_string(nm) || !set_name(t, json_string_value(nm)))
            return err_set(STRATA_ECORRUPT, "%s: tensors[%zu] has no name (or one longer than %d bytes)", origin, i,
                           CKPT_NAME_BYTES - 1);
        if (!json_is_string(file) || !ckpt_file_name_parse(json_string_value(file), m->world, &t->rank, &t->file) ||
            !ckpt_manifest_file_bytes(m, t->rank, t->file))
            return err_set(STRATA_ECORRUPT, "%s: tensor \"%s\": file %s is not one of the checkpoint's files", origin,
                           t->name, json_is_string(file) ? json_string_value(file) : "(missing)");
        ERR_CHECK(tensor_parse(e, "offsets", m->version >= 2, false, ckpt_manifest_file_bytes(m, t->rank, t->file), origin,
                               t));
        char *end;
        unsigned long v = json_is_string(crc) ? strtoul(json_string_value(crc), &end, 16) : 0;
        if (!json_is_string(crc) || *end != '\0' || strlen(json_string_value(crc)) != 8 || v > UINT32_MAX)
            return err_set(STRATA_ECORRUPT, "%s: tensor \"%s\": crc32c must be 8 hex digits", origin, t->name);
        t->crc = (uint32_t)v;
        ERR_CHECK(model_shape_parse(json_object_get(e, "model_shape"), origin, t));
        m->ntensors++;
    }
    return STRATA_OK;
}

static strata_status manifest_fields(const json_t *root, const char *origin, ckpt_manifest *m)
{
    const json_t *fmt = json_object_get(root, "format");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "strata-checkpoint") != 0)
        return err_set(STRATA_ECORRUPT, "%s: not a strata checkpoint manifest (\"format\" is not "
                       "\"strata-checkpoint\")", origin);
    ERR_CHECK(get_int(root, "version", origin, &m->version));
    if (m->version < 1 || m->version > CKPT_FORMAT_VERSION)
        return err_set(STRATA_ECORRUPT, "%s: format version %d; this strata reads versions 1 to %d", origin,
                       m->version, CKPT_FORMAT_VERSION);
    m->world = 1;
    if (m->version >= 2) {
        ERR_CHECK(get_int(root, "world_size", origin, &m->world));
        if (m->world < 1 || m->world > CKPT_MAX_WORLD)
            return err_set(STRATA_ECORRUPT, "%s: \"world_size\" = %d is outside [1, %d]", origin, m->world,
                           CKPT_MAX_WORLD);
    }
    ERR_CHECK(get_i64(root, "step", origin, &m->step));
    ERR_CHECK(get_i64(root, "iterations", origin, &m->iterations));
    ERR_CHECK(get_i64(root, "steps", origin, &m->steps));
    ERR_CHECK(get_i64(root, "skipped_steps", origin, &m->skipped_steps));
    ERR_CHECK(get_int(root, "good_steps", origin, &m->good_steps));
    ERR_CHECK(get_int(root, "hysteresis_left", origin, &m->hysteresis_left));
    if (!parse_double(json_object_get(root, "loss_scale"), &m->loss_scale) || !(m->loss_scale > 0) ||
        !isfinite(m->loss_scale))
        return err_set(STRATA_ECORRUPT, "%s: \"loss_scale\" is missing or not a positive finite number", origin);
    m->moments = moments_of(root);
    const json_t *dt = json_object_get(root, "param_dtype");
    if (!json_is_string(dt) || !dtype_parse(json_string_value(dt), &m->param_dtype))
        return err_set(STRATA_ECORRUPT, "%s: \"param_dtype\" is not one of F32, BF16, F16", origin);
    ERR_CHECK(parse_pending(json_object_get(root, "pending_update"), origin, m));
    const json_t *files = json_object_get(root, "files");
    if (!json_is_object(files))
        return err_set(STRATA_ECORRUPT, "%s: \"files\" is missing or not an object", origin);
    m->file_bytes = calloc((size_t)m->world * CKPT_FILE_COUNT, sizeof *m->file_bytes);
    if (!m->file_bytes)
        return err_set(STRATA_ENOMEM, "%s: out of memory for the files of %d ranks", origin, m->world);
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)files, key, val) {
        int r, f;
        uint64_t bytes = 0;
        if (!ckpt_file_name_parse(key, m->world, &r, &f) || !get_u64(val, &bytes) || bytes == 0)
            return err_set(STRATA_ECORRUPT, "%s: files: \"%s\" is not a file of a checkpoint of %d rank%s with a "
                           "positive size", origin, key, m->world, m->world == 1 ? "" : "s");
        m->file_bytes[(size_t)r * CKPT_FILE_COUNT + (size_t)f] = bytes;
    }
    ERR_CHECK(parse_tensors(json_object_get(root, "tensors"), origin, m));
    const json_t *groups = json_object_get(root, "param_groups");
    if (groups && !(m->groups_json = json_dumps(groups, JSON_COMPACT | JSON_REAL_PRECISION(17))))
        return err_set(STRATA_ENOMEM, "%s: out of memory for \"param_groups\"", origin);
    ERR_CHECK(ckpt_manifest_index(m, origin));
    /* Last: a field that is malformed is named by its own check above; one that parses but was edited, here. */
    return ckpt_seal_check(root, m->version, origin);
}

strata_status ckpt_manifest_parse(const char *text, size_t len, const char *origin, ckpt_manifest *out)
{
    memset(out, 0, sizeof *out);
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return err_set(STRATA_ECORRUPT, "%s: not valid JSON: %s (line %d, column %d)", origin, jerr.text, jerr.line,
                       jerr.column);
    strata_status st = json_is_object(root) ? manifest_fields(root, origin, out)
                                            : err_set(STRATA_ECORRUPT, "%s: not a JSON object", origin);
    json_decref(root);
    if (st != STRATA_OK)
        ckpt_manifest_free(out);
    return st;
}

void ckpt_manifest_free(ckpt_manifest *m)
{
    free(m->tensors);
    free(m->file_bytes);
    free(m->index);
    free(m->groups_json);
    memset(m, 0, sizeof *m);
}
