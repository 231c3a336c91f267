/*
 * strata_weights_open / strata_param_load: initial weights streamed from safetensors files written here with fresh
 * random data. Every dtype strata reads (F32, F16, BF16, F64), a transposed 2-D load, one file and a sharded index,
 * each compared element for element with the fp32 values the file holds; then every bad input refused, with the
 * tensor and the file named, and the engine left unfinalized (a fixed load then finalizes: nothing was left behind).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/half.h"
#include "strata.h"
#include "testlib.h"

/* A tensor to write: its name, dtype, shape, and values (fp32, as strata should read them back). */
typedef struct tensor {
    const char *name, *dtype;
    int ndim;
    int64_t dims[2];
    float *values; /* after rounding to the dtype */
    uint8_t *bytes;
    size_t numel, nbytes;
} tensor;

static size_t dtype_bytes(const char *dt)
{
    return !strcmp(dt, "F64") || !strcmp(dt, "I64") ? 8 : !strcmp(dt, "F32") ? 4 : 2;
}

/* Random values, stored in dt, and the fp32 each reads back as. */
static void fill(tensor *t)
{
    t->numel = (size_t)t->dims[0] * (size_t)(t->ndim == 2 ? t->dims[1] : 1);
    size_t eb = dtype_bytes(t->dtype);
    t->nbytes = t->numel * eb;
    t->values = malloc(t->numel * sizeof(float));
    t->bytes = malloc(t->nbytes);
    for (size_t i = 0; i < t->numel; i++) {
        float v = t_rand_normal();
        if (!strcmp(t->dtype, "F32")) {
            memcpy(t->bytes + 4 * i, &v, 4);
        } else if (!strcmp(t->dtype, "F16") || !strcmp(t->dtype, "BF16")) {
            uint16_t h = !strcmp(t->dtype, "F16") ? cvt_f32_to_fp16(v) : cvt_f32_to_bf16(v);
            memcpy(t->bytes + 2 * i, &h, 2);
            v = !strcmp(t->dtype, "F16") ? cvt_fp16_to_f32(h) : cvt_bf16_to_f32(h);
        } else if (!strcmp(t->dtype, "F64")) {
            double d = (double)v + 1e-9; /* not an fp32 value: reading narrows it */
            memcpy(t->bytes + 8 * i, &d, 8);
            v = (float)d;
        } else { /* I64 */
            int64_t k = (int64_t)i;
            memcpy(t->bytes + 8 * i, &k, 8);
        }
        t->values[i] = v;
    }
}

/* Writes tensors [0, n) to path as safetensors; truncate_by cuts that many bytes off the end. */
static void write_st(const char *path, tensor *ts, int n, size_t truncate_by)
{
    char head[4096];
    size_t len = 0, pos = 0;
    len += (size_t)snprintf(head + len, sizeof head - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        tensor *t = &ts[i];
        if (t->ndim == 2)
            len += (size_t)snprintf(head + len, sizeof head - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],"
                                    "\"data_offsets\":[%zu,%zu]}", t->name, t->dtype, (long long)t->dims[0],
                                    (long long)t->dims[1], pos, pos + t->nbytes);
        else
            len += (size_t)snprintf(head + len, sizeof head - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld],"
                                    "\"data_offsets\":[%zu,%zu]}", t->name, t->dtype, (long long)t->dims[0], pos,
                                    pos + t->nbytes);
        pos += t->nbytes;
    }
    len += (size_t)snprintf(head + len, sizeof head - len, "}");
    FILE *f = fopen(path, "wb");
    T_CHECK(f != NULL, "cannot write %s", path);
    uint64_t hl = len;
    uint8_t l8[8];
    for (int i = 0; i < 8; i++)
        l8[i] = (uint8_t)(hl >> (8 * i));
    fwrite(l8, 1, 8, f);
    fwrite(head, 1, len, f);
    for (int i = 0; i < n; i++)
        fwrite(ts[i].bytes, 1, ts[i].nbytes, f);
    fclose(f);
    if (truncate_by)
        T_CHECK(truncate(path, (off_t)(8 + len + pos - truncate_by)) == 0, "truncate %s", path);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    T_CHECK(f && fputs(text, f) >= 0, "cannot write %s", path);
    if (f)
        fclose(f);
}

enum { A, B, C, D, NT };
/* The model: one module, a [3, 5] F32, a [7] F16, a [2, 3] loaded transposed from BF16 [3, 2], a [4, 2] F64. */
static tensor model[NT] = {
    [A] = {"m.a", "F32", 2, {3, 5}}, [B] = {"m.b", "F16", 1, {7}},
    [C] = {"m.c", "BF16", 2, {3, 2}}, [D] = {"m.d", "F64", 2, {4, 2}},
};
static const int64_t param_dims[NT][2] = {[A] = {3, 5}, [B] = {7}, [C] = {2, 3}, [D] = {4, 2}};

typedef struct built {
    strata_engine *e;
    strata_param_id p[NT];
    strata_weights_id w;
} built;

static strata_engine *engine_new(void)
{
    strata_config c;
    strata_config_init(&c);
    c.backend = STRATA_BACKEND_HOST;
    c.device_budget_bytes = 64u << 20;
    strata_engine *e = NULL;
    T_OK(strata_engine_create(&c, &e));
    return e;
}

/* The engine with the model's parameters (their own init: zeros), shapes declared, and weights at path opened. */
static strata_status build(built *b, const char *path)
{
    b->e = engine_new();
    strata_module_id m;
    T_OK(strata_module_add(b->e, "m", &m));
    const char *names[NT] = {"a", "b", "c", "d"};
    for (int i = 0; i < NT; i++) {
        size_t n = (size_t)param_dims[i][0] * (size_t)(param_dims[i][1] ? param_dims[i][1] : 1);
        T_OK(strata_param_add(b->e, m, names[i], n, NULL, NULL, &b->p[i]));
        T_OK(strata_param_set_shape(b->e, b->p[i], param_dims[i][1] ? 2 : 1, param_dims[i]));
    }
    return strata_weights_open(b->e, path, &b->w);
}

static void load_all(built *b)
{
    for (int i = 0; i < NT; i++)
        T_OK(strata_param_load(b->e, b->p[i], b->w, model[i].name, i == C ? STRATA_LOAD_TRANSPOSE : 0));
}

/* Every parameter equals its tensor (C: transposed). */
static void check_values(built *b, const char *what)
{
    for (int i = 0; i < NT; i++) {
        float got[64];
        T_OK(strata_param_read_master(b->e, b->p[i], 0, model[i].numel, got));
        size_t bad = 0;
        float g0 = 0, w0 = 0;
        for (size_t k = 0; k < model[i].numel; k++) {
            size_t src = k;
            if (i == C) /* param (r, c) of [2, 3] is the file's (c, r) of [3, 2] */
                src = (k % 3) * 2 + k / 3;
            if (got[k] != model[i].values[src] && bad++ == 0)
                g0 = got[k], w0 = model[i].values[src];
        }
        T_CHECK(bad == 0, "%s: tensor %s (%s): %zu of %zu elements differ, e.g. %.9g (expected %.9g)", what,
                model[i].name, model[i].dtype, bad, model[i].numel, g0, w0);
    }
}

static char last[4096]; /* the refused finalize's message */

/* A finalize that must fail with st, naming each of needles; then the engine is not finalized. */
static void refused_finalize(built *b, strata_status st, const char *n1, const char *n2)
{
    T_STATUS(strata_engine_finalize(b->e), st);
    T_CONTAINS(strata_last_error(b->e), n1);
    T_CONTAINS(strata_last_error(b->e), n2);
    printf("  refused: %s\n", strata_last_error(b->e));
    snprintf(last, sizeof last, "%s", strata_last_error(b->e));
    T_STATUS(strata_engine_placement(b->e, NULL, NULL, NULL, NULL, 0), STRATA_ESTATE);
}

int main(void)
{
    t_rng_seed();
    for (int i = 0; i < NT; i++)
        fill(&model[i]);
    const char *dir = t_scratch_dir("t_weights_load");
    char one[600], shard1[700], shard2[700], index[700], path[700];
    snprintf(one, sizeof one, "%s/model.safetensors", dir);
    write_st(one, model, NT, 0);

    /* One file, named directly and as its directory. */
    for (int as_dir = 0; as_dir < 2; as_dir++) {
        built b;
        T_OK(build(&b, as_dir ? dir : one));
        load_all(&b);
        T_OK(strata_engine_finalize(b.e));
        check_values(&b, as_dir ? "the directory" : "one file");
        strata_weights_tensor info;
        T_OK(strata_weights_find(b.e, b.w, "m.c", &info)); /* still queryable after finalize closed the files */
        T_EQ_STR(info.dtype, "BF16");
        T_EQ_INT(info.ndim, 2);
        T_EQ_INT(info.dims[0], 3);
        T_EQ_INT(info.dims[1], 2);
        strata_engine_destroy(b.e);
    }

    /* A sharded index: A and C in one shard, B and D in the other (HF's layout: a directory holding only the index). */
    char sdir[600];
    snprintf(sdir, sizeof sdir, "%s/sharded", dir);
    T_CHECK(mkdir(sdir, 0700) == 0 || access(sdir, F_OK) == 0, "mkdir %s", sdir);
    snprintf(shard1, sizeof shard1, "%s/model-00001-of-00002.safetensors", sdir);
    snprintf(shard2, sizeof shard2, "%s/model-00002-of-00002.safetensors", sdir);
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", sdir);
    tensor first[2] = {model[A], model[C]}, second[2] = {model[B], model[D]};
    write_st(shard1, first, 2, 0);
    write_st(shard2, second, 2, 0);
    const char *map = "{\"metadata\":{\"total_size\":0},\"weight_map\":{\"m.a\":\"model-00001-of-00002.safetensors\","
                      "\"m.c\":\"model-00001-of-00002.safetensors\",\"m.b\":\"model-00002-of-00002.safetensors\","
                      "\"m.d\":\"model-00002-of-00002.safetensors\"}}";
    write_text(index, map);
    {
        built b;
        T_OK(build(&b, sdir));
        size_t count = 0;
        T_OK(strata_weights_count(b.e, b.w, &count));
        T_EQ_INT(count, NT);
        load_all(&b);
        T_OK(strata_engine_finalize(b.e));
        check_values(&b, "sharded");
        strata_engine_destroy(b.e);
    }

    /* Refused at strata_param_load: a missing tensor (its nearest name suggested), another numel, an integer dtype. */
    {
        tensor extra[NT + 1];
        memcpy(extra, model, sizeof model);
        extra[NT] = (tensor){.name = "m.ids", .dtype = "I64", .ndim = 1, .dims = {15}};
        fill(&extra[NT]);
        snprintf(path, sizeof path, "%s/with_ids.safetensors", dir);
        write_st(path, extra, NT + 1, 0);
        built b;
        T_OK(build(&b, path));
        T_STATUS(strata_param_load(b.e, b.p[A], b.w, "m.aa", 0), STRATA_ENOTFOUND);
        T_CONTAINS(strata_last_error(b.e), "\"m.aa\"");
        T_CONTAINS(strata_last_error(b.e), "did you mean \"m.a\"");
        T_STATUS(strata_param_load(b.e, b.p[A], b.w, "m.b", 0), STRATA_EINVAL);
        T_CONTAINS(strata_last_error(b.e), "\"m.b\" of \"");
        T_CONTAINS(strata_last_error(b.e), path);
        T_STATUS(strata_param_load(b.e, b.p[A], b.w, "m.ids", 0), STRATA_EINVAL);
        T_CONTAINS(strata_last_error(b.e), "dtype I64");
        T_STATUS(strata_param_load(b.e, b.p[A], b.w, "m.a", 4), STRATA_EINVAL);
        T_STATUS(strata_param_load(b.e, b.p[A], 7, "m.a", 0), STRATA_EINVAL);
        /* Refused at finalize, before anything is written: the same numel in another shape, a transpose of a tensor
         * that is not, then fixed: the retried finalize succeeds. */
        load_all(&b);
        T_OK(strata_param_load(b.e, b.p[D], b.w, "m.d", STRATA_LOAD_TRANSPOSE)); /* [4, 2] is not [2, 4]^T... */
        T_OK(strata_param_load(b.e, b.p[B], b.w, "m.b", 0));
        refused_finalize(&b, STRATA_EINVAL, "tensor \"m.d\"", path);
        T_CONTAINS(last, "not its transpose");
        T_OK(strata_param_load(b.e, b.p[D], b.w, "m.d", 0));
        T_OK(strata_engine_finalize(b.e));
        check_values(&b, "after a refused finalize");
        T_STATUS(strata_param_load(b.e, b.p[A], b.w, "m.a", 0), STRATA_ESTATE);
        T_STATUS(strata_weights_open(b.e, path, &b.w), STRATA_ESTATE);
        strata_engine_destroy(b.e);
        free(extra[NT].values), free(extra[NT].bytes);
    }
    /* The declared shape differs (the same numel): named with both shapes. */
    {
        tensor wrong[NT];
        memcpy(wrong, model, sizeof model);
        wrong[A].dims[0] = 5, wrong[A].dims[1] = 3;
        snprintf(path, sizeof path, "%s/wrong_shape.safetensors", dir);
        write_st(path, wrong, NT, 0);
        built b;
        T_OK(build(&b, path));
        load_all(&b);
        refused_finalize(&b, STRATA_EINVAL, "tensor \"m.a\"", "[3, 5], tensor");
        T_CONTAINS(last, "[5, 3]");
        strata_engine_destroy(b.e);
    }
    /* A file truncated after it was opened: finalize finds it before reading. */
    {
        snprintf(path, sizeof path, "%s/shrinks.safetensors", dir);
        write_st(path, model, NT, 0);
        built b;
        T_OK(build(&b, path));
        load_all(&b);
        write_st(path, model, NT, 8);
        refused_finalize(&b, STRATA_ECORRUPT, "truncated or replaced", path);
        strata_engine_destroy(b.e);
    }
    /* Refused at open: a truncated file, a truncated shard, an index naming a missing file or a file that lacks the
     * tensor, a malformed header, a path with nothing there. */
    {
        strata_engine *e = engine_new();
        strata_weights_id w;
        snprintf(path, sizeof path, "%s/truncated.safetensors", dir);
        write_st(path, model, NT, 3);
        T_STATUS(strata_weights_open(e, path, &w), STRATA_ECORRUPT);
        T_CONTAINS(strata_last_error(e), path);
        T_CONTAINS(strata_last_error(e), "tensor \"m.");
        T_CONTAINS(strata_last_error(e), "truncated");
        printf("  refused: %s\n", strata_last_error(e));

        write_st(shard2, second, 2, 5);
        T_STATUS(strata_weights_open(e, sdir, &w), STRATA_ECORRUPT);
        T_CONTAINS(strata_last_error(e), shard2);
        T_CONTAINS(strata_last_error(e), "truncated");
        printf("  refused: %s\n", strata_last_error(e));
        write_st(shard2, second, 2, 0);

        write_text(index, "{\"weight_map\":{\"m.a\":\"model-00001-of-00002.safetensors\",\"m.b\":\"gone.safetensors\"}}");
        T_STATUS(strata_weights_open(e, index, &w), STRATA_ECORRUPT);
        T_CONTAINS(strata_last_error(e), "gone.safetensors");
        T_CONTAINS(strata_last_error(e), "tensor \"m.b\"");
        printf("  refused: %s\n", strata_last_error(e));

        write_text(index, "{\"weight_map\":{\"m.b\":\"model-00001-of-00002.safetensors\"}}");
        T_STATUS(strata_weights_open(e, index, &w), STRATA_ECORRUPT);
        T_CONTAINS(strata_last_error(e), "tensor \"m.b\"");
        T_CONTAINS(strata_last_error(e), shard1);
        printf("  refused: %s\n", strata_last_error(e));

        write_text(index, "{\"weight_map\":{\"m.b\":\"../model.safetensors\"}}");
        T_STATUS(strata_weights_open(e, index, &w), STRATA_ECORRUPT);
        write_text(index, "[1, 2");
        T_STATUS(strata_weights_open(e, index, &w), STRATA_ECORRUPT);
        T_CONTAINS(strata_last_error(e), index);

        snprintf(path, sizeof path, "%s/bad_header.safetensors", dir);
        FILE *f = fopen(path, "wb");
        T_CHECK(f && fwrite("\x10\0\0\0\0\0\0\0{\"m.a\": [1, 2] }", 1, 24, f) == 24, "cannot write %s", path);
        if (f)
            fclose(f);
        T_STATUS(strata_weights_open(e, path, &w), STRATA_ECORRUPT);
        T_CONTAINS(strata_last_error(e), path);
        T_CONTAINS(strata_last_error(e), "\"m.a\"");
        printf("  refused: %s\n", strata_last_error(e));

        snprintf(path, sizeof path, "%s/nothing-here", dir);
        T_STATUS(strata_weights_open(e, path, &w), STRATA_ENOTFOUND);
        T_CONTAINS(strata_last_error(e), path);
        T_CHECK(mkdir(path, 0700) == 0, "mkdir %s", path);
        T_STATUS(strata_weights_open(e, path, &w), STRATA_ENOTFOUND);
        T_CONTAINS(strata_last_error(e), "neither model.safetensors nor model.safetensors.index.json");
        strata_engine_destroy(e);
    }
    for (int i = 0; i < NT; i++)
        free(model[i].values), free(model[i].bytes);
    t_scratch_cleanup();
    return t_done();
}
