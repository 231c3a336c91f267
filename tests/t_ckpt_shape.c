/*
 * Parameter shapes (strata_param_set_shape) in checkpoints: every misuse is refused with a message that names the
 * parameter and the numbers; a declared shape lands in the manifest ("model_shape", on every entry of that tensor)
 * and nowhere else; a checkpoint loads bit-identically into an engine of the same shapes, of no shapes, and a
 * checkpoint without shapes into an engine that declares them; an engine of another shape for the same sizes (a
 * transposed weight) refuses it naming both shapes; a manifest whose model_shape does not multiply to the tensor's
 * size is refused as corrupt.
 */
#include <stdio.h>

#include "synth.h"
#include "testlib.h"

#define ROWS 6
#define COLS 4

static float values[ROWS * COLS + ROWS];

static strata_status init(void *ctx, strata_param_id param, size_t offset, size_t count, float *out)
{
    const float *v = values + (param == 0 ? 0 : ROWS * COLS);
    memcpy(out, v + offset, count * sizeof *out);
    return STRATA_OK;
}

/* A one-module engine, not finalized: "layer0.weight" (param 0, ROWS x COLS elements) and "layer0.bias" (1),
 * holding values when fill (else zeros). */
static strata_engine *unfinalized(bool fill)
{
    strata_config c = synth_config(STRATA_DTYPE_FP32);
    strata_engine *e = NULL;
    strata_module_id m;
    strata_param_id w, b;
    T_OK(strata_engine_create(&c, &e));
    T_OK(strata_module_add(e, "layer0", &m));
    T_OK(strata_param_add(e, m, "weight", ROWS * COLS, fill ? init : NULL, NULL, &w));
    T_OK(strata_param_add(e, m, "bias", ROWS, fill ? init : NULL, NULL, &b));
    return e;
}

/* The same, finalized, its weight of shape dims (none when ndim is 0). */
static strata_engine *build(int ndim, const int64_t *dims, bool fill)
{
    strata_engine *e = unfinalized(fill);
    if (ndim)
        T_OK(strata_param_set_shape(e, 0, ndim, dims));
    T_OK(strata_engine_finalize(e));
    return e;
}

static void expect_weights(strata_engine *e, const char *what)
{
    float got[ROWS * COLS + ROWS];
    T_OK(strata_param_read_master(e, 0, 0, ROWS * COLS, got));
    T_OK(strata_param_read_master(e, 1, 0, ROWS, got + ROWS * COLS));
    size_t first, d = synth_count_diff(values, got, ROWS * COLS + ROWS, &first);
    T_CHECK(d == 0, "%s: %zu weights differ from the saved ones; first at %zu: %.9g (loaded) vs %.9g", what, d, first,
            first < ROWS * COLS + ROWS ? (double)got[first] : 0.0,
            first < ROWS * COLS + ROWS ? (double)values[first] : 0.0);
}

static void expect_error(strata_engine *e, strata_param_id p, int ndim, const int64_t *dims, strata_status want,
                         const char *text)
{
    strata_status st = strata_param_set_shape(e, p, ndim, dims);
    T_CHECK(st == want, "strata_param_set_shape(ndim %d): %s, expected %s", ndim, strata_status_name(st),
            strata_status_name(want));
    T_CONTAINS(strata_last_error(e), text);
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p++)
        n++;
    return n;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    static char buf[1 << 20];
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    return buf;
}

int main(void)
{
    t_rng_seed();
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++)
        values[i] = t_rand_normal();
    const char *scratch = t_scratch_dir("t_ckpt_shape");
    char shaped[400], flat[400], manifest[440];
    snprintf(shaped, sizeof shaped, "%s/shaped", scratch);
    snprintf(flat, sizeof flat, "%s/flat", scratch);
    const int64_t good[] = {ROWS, COLS}, transposed[] = {COLS, ROWS}, wrong[] = {5, COLS}, zero[] = {ROWS, 0};
    const int64_t nine[] = {1, 1, 1, 1, 1, 1, 1, 1, ROWS * COLS};

    /* Misuse, each named. */
    strata_engine *e = unfinalized(false);
    strata_param_id w = 0;
    expect_error(e, w, 2, wrong, STRATA_EINVAL,
                 "strata_param_set_shape(\"layer0.weight\"): dims [5, 4] hold 20 elements, the parameter has numel 24");
    expect_error(e, w, 0, good, STRATA_EINVAL, "strata_param_set_shape(\"layer0.weight\"): ndim = 0 is outside [1, 8]");
    expect_error(e, w, 9, nine, STRATA_EINVAL, "ndim = 9 is outside [1, 8]");
    expect_error(e, w, 2, zero, STRATA_EINVAL, "dims[1] = 0; every dimension must be at least 1");
    expect_error(e, w, 2, NULL, STRATA_EINVAL, "or dims is NULL");
    expect_error(e, 7, 2, good, STRATA_ESTATE, "strata_param_set_shape");
    T_OK(strata_param_set_shape(e, w, 2, transposed)); /* declared again: the last one counts (checked below) */
    T_OK(strata_param_set_shape(e, w, 2, good));
    T_OK(strata_engine_finalize(e));
    expect_error(e, w, 2, good, STRATA_ESTATE, "the engine is already finalized");
    strata_engine_destroy(e);

    /* A shaped save: model_shape on the weight's three entries (model, exp_avg, exp_avg_sq), not on the bias. */
    e = build(2, good, true);
    T_OK(strata_save(e, shaped));
    strata_engine_destroy(e);
    snprintf(manifest, sizeof manifest, "%s/manifest.json", shaped);
    const char *text = slurp(manifest);
    T_CHECK(count(text, "\"model_shape\"") == 3, "%s holds %d model_shape entries, expected 3 (the weight's)",
            manifest, count(text, "\"model_shape\""));

    e = build(2, good, false);
    T_OK(strata_load(e, shaped));
    expect_weights(e, "same shapes");
    strata_engine_destroy(e);
    e = build(0, NULL, false);
    T_OK(strata_load(e, shaped));
    expect_weights(e, "an engine without shapes");
    strata_engine_destroy(e);
    e = build(2, transposed, false);
    T_STATUS(strata_load(e, shaped), STRATA_ECORRUPT);
    T_CONTAINS(strata_last_error(e), "tensor \"layer0.weight\" has the model shape [6, 4], the engine's parameter "
                                     "[4, 6] (strata_param_set_shape); it was saved from a differently shaped model");
    strata_engine_destroy(e);

    /* A checkpoint without shapes (an older strata, or a trainer that declares none) into a shaped engine. */
    e = build(0, NULL, true);
    T_OK(strata_save(e, flat));
    strata_engine_destroy(e);
    snprintf(manifest, sizeof manifest, "%s/manifest.json", flat);
    T_CHECK(count(slurp(manifest), "model_shape") == 0, "%s names a model_shape though none was declared", manifest);
    e = build(2, transposed, false);
    T_OK(strata_load(e, flat));
    expect_weights(e, "a checkpoint without shapes");
    strata_engine_destroy(e);

    /* A model_shape that does not multiply to the tensor's size: 6 x 4 edited to 7 x 4. */
    snprintf(manifest, sizeof manifest, "%s/manifest.json", shaped);
    char *edit = slurp(manifest), *at = strstr(edit, "\"model_shape\"");
    at = at ? strchr(at, '6') : NULL;
    T_CHECK(at != NULL, "%s: no model_shape with a 6 to edit", manifest);
    if (at) {
        *at = '7';
        FILE *f = fopen(manifest, "wb");
        fputs(edit, f);
        fclose(f);
        strata_checkpoint_info info;
        T_STATUS(strata_checkpoint_inspect(shaped, &info), STRATA_ECORRUPT);
        T_CONTAINS(strata_last_error(NULL), "tensor \"layer0.weight\": model_shape must be 1 to 8 dimensions of at "
                                            "least 1 whose product is its 24 elements");
    }
    t_scratch_cleanup();
    return t_done();
}
