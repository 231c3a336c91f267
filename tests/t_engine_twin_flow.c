/*
 * Partial optimizer offload (zero_optimization.offload_optimizer.ratio, DeepSpeed's Twin-Flow): the device Adam
 * updates the last sub-groups while the CPU updates the first, and that must not change a bit. On the host
 * backend, for ratios 0, 0.3 (an odd split of 7 sub-groups: 3 on the CPU, 4 on the device), 0.5 and 1, every
 * placement the equivalence tests sweep (but the one with the gradient store on NVMe, which the ratio refuses),
 * fp32 and bf16 parameters, with and without gradient clipping, with the delayed update: the master weights, the
 * moments and the parameter copies (the saved checkpoint's files, byte for byte) equal the all-CPU run's. A run
 * saved at one ratio and resumed at another equals the run that never stopped. The refusals name the key.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"
#include "synth.h"
#include "testlib.h"

static const char *scratch;
static int run_id;

static void seven_sub_groups(synth_opts *o, uint64_t seed)
{
    synth_defaults(o, seed);
    /* 7 modules of one 4096-element block each, one sub-group per block. */
    o->layers = 7;
    int w[] = {24, 80, 48, 64, 16, 40, 56, 8};
    memcpy(o->width, w, sizeof w);
    o->steps = 4;
}

static strata_config config(strata_dtype dtype, double clip, double ratio)
{
    strata_config c = synth_config(dtype);
    c.sub_group_size = 4096;
    c.gradient_clipping = clip;
    c.offload_optimizer_ratio = ratio;
    return c;
}

/* The bytes of file name in dir (malloc'd), or NULL with a failure reported. */
static unsigned char *slurp(const char *dir, const char *name, size_t *len)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    T_CHECK(f != NULL, "cannot open %s", path);
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*len + 1);
    T_CHECK(b && fread(b, 1, *len, f) == *len, "cannot read %s", path);
    fclose(f);
    return b;
}

/* A trained run's result: its master weights and the checkpoint it saved at its end. */
typedef struct outcome {
    float *w;
    size_t n;
    char dir[512];
} outcome;

static bool train(const synth_opts *o, const strata_config *c, outcome *out)
{
    synth_opts s = *o;
    snprintf(out->dir, sizeof out->dir, "%s/run%d", scratch, run_id++);
    s.save_dir = out->dir;
    s.save_after = o->first_step + o->steps;
    out->w = NULL;
    strata_status st = synth_train(&s, c, &out->w, &out->n, NULL, NULL);
    T_CHECK(st == STRATA_OK, "training failed: %s: %s", strata_status_name(st), strata_last_error(NULL));
    return st == STRATA_OK;
}

/* Weights bit for bit, and the optimizer state and parameter copies file for file. */
static void compare(const char *label, const outcome *ref, const outcome *got)
{
    T_EQ_INT(got->n, ref->n);
    size_t n = got->n < ref->n ? got->n : ref->n, first;
    size_t diffs = synth_count_diff(ref->w, got->w, n, &first);
    T_CHECK(diffs == 0, "%s: %zu of %zu master weights differ from the all-CPU run's; first at %zu: all-CPU %.9g "
            "(0x%08x), this %.9g (0x%08x)", label, diffs, n, first, first < n ? (double)ref->w[first] : 0.0,
            first < n ? *(const unsigned *)&ref->w[first] : 0u, first < n ? (double)got->w[first] : 0.0,
            first < n ? *(const unsigned *)&got->w[first] : 0u);
    const char *files[] = {"optimizer.safetensors", "params.safetensors"};
    for (size_t f = 0; f < 2; f++) {
        /* fp32 parameters with nothing pending are the master weights: no file of their own. */
        char pa[1024], pb[1024];
        snprintf(pa, sizeof pa, "%s/%s", ref->dir, files[f]);
        snprintf(pb, sizeof pb, "%s/%s", got->dir, files[f]);
        bool ha = access(pa, F_OK) == 0, hb = access(pb, F_OK) == 0;
        T_CHECK(ha == hb, "%s: %s: the all-CPU run %s it, this one %s", label, files[f], ha ? "saved" : "did not save",
                hb ? "did" : "did not");
        if (!ha || !hb)
            continue;
        size_t la = 0, lb = 0;
        unsigned char *a = slurp(ref->dir, files[f], &la), *b = slurp(got->dir, files[f], &lb);
        if (a && b) {
            size_t at = 0;
            while (at < la && at < lb && a[at] == b[at])
                at++;
            T_CHECK(la == lb && at == la, "%s: %s differs from the all-CPU run's (%zu vs %zu bytes), first at byte "
                    "%zu: all-CPU 0x%02x, this 0x%02x", label, files[f], la, lb, at, at < la ? a[at] : 0,
                    at < lb ? b[at] : 0);
        }
        free(a);
        free(b);
    }
}

static const double ratios[] = {0.0, 0.3, 0.5, 1.0};

static void run_family(const char *label, strata_dtype dtype, double clip, bool delayed)
{
    synth_opts o;
    seven_sub_groups(&o, t_rand_u64());
    for (size_t p = 0; p < synth_placement_count; p++) {
        if (strcmp(synth_placements[p].name, "NVMe with a device budget of two modules") == 0)
            continue; /* its gradient store is on NVMe: refused (test_refusals) */
        strata_config c = config(dtype, clip, 1.0);
        c.delayed_update = delayed;
        synth_placements[p].apply(&c, scratch);
        outcome ref;
        if (!train(&o, &c, &ref))
            continue;
        for (size_t r = 0; r < ARRAY_LEN(ratios); r++) {
            c.offload_optimizer_ratio = ratios[r];
            outcome got;
            char what[256];
            snprintf(what, sizeof what, "%s / %s / ratio %g", label, synth_placements[p].name, ratios[r]);
            if (train(&o, &c, &got))
                compare(what, &ref, &got);
            free(got.w);
        }
        printf("%s / %s: ratios 0, 0.3, 0.5, 1 checked\n", label, synth_placements[p].name);
        free(ref.w);
    }
}

/* Saved at one ratio after 3 steps, resumed at another for 3 more: the 6-step all-CPU run's bits. */
static void test_resume(strata_dtype dtype)
{
    synth_opts o;
    seven_sub_groups(&o, t_rand_u64());
    o.steps = 6;
    strata_config c = config(dtype, 0.05, 1.0);
    c.offload_optimizer.device = STRATA_TIER_HOST;
    outcome ref;
    if (!train(&o, &c, &ref))
        return;
    const double pairs[][2] = {{0.5, 0.5}, {0.5, 1.0}, {1.0, 0.3}, {0.3, 0.0}};
    for (size_t i = 0; i < ARRAY_LEN(pairs); i++) {
        synth_opts first = o, second = o;
        first.steps = 3;
        c.offload_optimizer_ratio = pairs[i][0];
        outcome a;
        if (!train(&first, &c, &a))
            continue;
        free(a.w);
        second.first_step = 3;
        second.steps = 3;
        second.load_dir = a.dir;
        c.offload_optimizer_ratio = pairs[i][1];
        outcome b;
        char what[160];
        snprintf(what, sizeof what, "%s: saved at ratio %g, resumed at ratio %g", strata_dtype_name(dtype),
                 pairs[i][0], pairs[i][1]);
        if (train(&second, &c, &b))
            compare(what, &ref, &b);
        free(b.w);
        printf("%s: checked\n", what);
    }
    free(ref.w);
}

static void test_refusals(void)
{
    synth_opts o;
    seven_sub_groups(&o, 1);
    strata_config c = config(STRATA_DTYPE_FP32, 0, 0.5);
    synth_use_nvme(&c, scratch, true, true); /* the gradient store on NVMe too */
    strata_engine *e = NULL;
    T_STATUS(synth_engine(&o, &c, &e), STRATA_EUNSUPPORTED);
    T_CONTAINS(strata_last_error(NULL), "zero_optimization.offload_optimizer.ratio = 0.5 needs the gradient store in "
               "host memory, but it is on nvme; set strata.gradients_on_nvme = false (or ratio 1)");
    strata_engine_destroy(e);
    /* The same with the store in host memory runs. */
    c.gradients_on_nvme = STRATA_SWITCH_OFF;
    T_OK(synth_engine(&o, &c, &e));
    strata_engine_destroy(e);
}

/* The device share's update is on the trace, on a track of its own, once per step. */
static void test_trace(void)
{
    synth_opts o;
    seven_sub_groups(&o, 2);
    strata_config c = config(STRATA_DTYPE_BF16, 0, 0.5);
    c.offload_optimizer.device = STRATA_TIER_HOST;
    snprintf(c.trace_path, sizeof c.trace_path, "%s/trace.json", scratch);
    float *w = NULL;
    size_t n = 0;
    T_OK(synth_train(&o, &c, &w, &n, NULL, NULL));
    free(w);
    size_t len = 0;
    char *json = (char *)slurp(scratch, "trace.json", &len);
    if (!json)
        return;
    json[len] = 0;
    T_CONTAINS(json, "device Adam (offload_optimizer.ratio)");
    int events = 0;
    for (const char *at = json; (at = strstr(at, "\"device adam elements [16384, 28672)\"")) != NULL; at++)
        events++;
    T_CHECK(events == o.steps, "the trace holds %d device Adam events over elements [16384, 28672), expected %d (one "
            "per step)", events, o.steps);
    free(json);
}

int main(void)
{
    printf("seed %llu\n", (unsigned long long)t_rng_seed());
    scratch = t_scratch_dir("t_engine_twin_flow");
    test_refusals();
    test_trace();
    run_family("fp32", STRATA_DTYPE_FP32, 0, false);
    run_family("bf16 clipped", STRATA_DTYPE_BF16, 0.05, false);
    run_family("fp32 delayed", STRATA_DTYPE_FP32, 0, true);
    test_resume(STRATA_DTYPE_BF16);
    t_scratch_cleanup();
    return t_done();
}
