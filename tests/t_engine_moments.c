/*
 * Compressed Adam moments in the engine (strata.optimizer_moments = "bf16" / "8bit"):
 *   - every placement (device tier, host, NVMe with and without the host cache, a tiny device budget) gives the
 *     weights of the host placement bit for bit, with and without the delayed update: where m and v live changes
 *     where bytes go, never what is computed;
 *   - the forms do change the result (the moments really are stored narrow), but stay close to fp32 training;
 *   - a run saved after N steps, loaded into a new engine and trained N more ends where the uninterrupted run ends,
 *     for both forms (the checkpoint holds the moments widened to fp32, narrowed back exactly on load; bf16's
 *     rounding bits follow the step count), on the host, NVMe and partly cached NVMe placements;
 *   - a checkpoint of fp32 moments loads into bf16 and 8-bit engines (a conversion) and trains on;
 *   - the device's share of Twin-Flow and the step in backward refuse non-fp32 moments at finalize, naming the key;
 *     an unknown value names the allowed ones;
 *   - the memory plan counts 12, 8 or 6 bytes of optimizer state an element (in its tier, the host cache's share
 *     and the optimizer slots), and the 8-bit scales in host memory.
 */
#include <math.h>
#include <string.h>

#include "engine/plan/plan.h"
#include "engine/step/step.h"
#include "synth.h"
#include "testlib.h"

static const char *scratch;

/* The weights of a run that must succeed (the failing call and its error are printed). */
static float *train(const synth_opts *o, const strata_config *c, size_t *n)
{
    float *w = NULL;
    T_OK(synth_train(o, c, &w, n, NULL, NULL));
    return w;
}

static void expect_same(const char *what, const float *a, const float *b, size_t n)
{
    size_t first, d = synth_count_diff(a, b, n, &first);
    T_CHECK(d == 0, "%s: %zu of %zu weights differ; first at %zu: %.9g vs %.9g", what, d, n, first,
            first < n ? (double)a[first] : 0.0, first < n ? (double)b[first] : 0.0);
}

static strata_config form_config(strata_moments form, bool delayed)
{
    strata_config c = synth_config(STRATA_DTYPE_BF16);
    c.optimizer_moments = form;
    c.optimizer_moments_seed = 5;
    c.delayed_update = delayed;
    c.delayed_warmup_steps = 1;
    return c;
}

/* The form changes the weights, a little. */
static void compare_to_fp32(strata_moments form, const float *w, const float *fp32, size_t n, int steps)
{
    size_t first, d = synth_count_diff(w, fp32, n, &first);
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)w[i] - fp32[i]) * ((double)w[i] - fp32[i]);
        den += (double)fp32[i] * fp32[i];
    }
    printf("%s moments after %d steps: %zu of %zu weights differ from fp32 moments, relative L2 %.3g\n",
           form == STRATA_MOMENTS_BF16 ? "bf16" : "8bit", steps, d, n, sqrt(num / den));
    T_CHECK(d > 0, "the moments' form changes nothing: is it applied?");
    T_CHECK(sqrt(num / den) < 1e-2, "the form moves the weights by %.3g (relative L2) from fp32 moments",
            sqrt(num / den));
}

/* Every placement against the first (everything on the device tier). */
static void placements(strata_moments form, bool delayed, const float *fp32)
{
    synth_opts o;
    synth_defaults(&o, 11);
    o.steps = 5;
    float *ref = NULL;
    size_t n_ref = 0;
    for (size_t p = 0; p < synth_placement_count; p++) {
        strata_config c = form_config(form, delayed);
        synth_placements[p].apply(&c, scratch);
        char what[160];
        snprintf(what, sizeof what, "%s%s / %s", form == STRATA_MOMENTS_BF16 ? "bf16" : "8bit",
                 delayed ? " delayed" : "", synth_placements[p].name);
        size_t n = 0;
        float *w = train(&o, &c, &n);
        if (p == 0) {
            ref = w;
            n_ref = n;
            continue;
        }
        if (ref && w && n == n_ref)
            expect_same(what, ref, w, n);
        free(w);
    }
    if (ref && fp32 && !delayed)
        compare_to_fp32(form, ref, fp32, n_ref, o.steps);
    free(ref);
}

static void resume(strata_moments form)
{
    const char *name = form == STRATA_MOMENTS_BF16 ? "bf16" : "8bit";
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ckpt", scratch);
    const int N = 3;
    for (size_t p = 1; p < synth_placement_count; p += 2) { /* host, both on NVMe, NVMe with part cached */
        strata_config c = form_config(form, false);
        synth_placements[p].apply(&c, scratch);
        synth_opts o;
        synth_defaults(&o, 12);
        o.steps = 2 * N;
        size_t n_full = 0, n = 0;
        float *full = train(&o, &c, &n_full);
        o.steps = N;
        o.save_dir = dir;
        o.save_after = N;
        free(train(&o, &c, &n));
        o.save_dir = NULL;
        o.first_step = N;
        o.load_dir = dir;
        float *resumed = train(&o, &c, &n);
        if (full && resumed && n == n_full) {
            char what[160];
            snprintf(what, sizeof what, "%s / %s: resumed after a save at step %d", name, synth_placements[p].name, N);
            expect_same(what, full, resumed, n);
        }
        free(full);
        free(resumed);
    }
}

/* fp32 moments saved, loaded into engines with bf16 and 8-bit moments. */
static void convert_on_load(void)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ckpt-fp32", scratch);
    synth_opts o;
    synth_defaults(&o, 13);
    o.steps = 2;
    o.save_dir = dir;
    o.save_after = 2;
    strata_config c = form_config(STRATA_MOMENTS_FP32, false);
    size_t n = 0;
    free(train(&o, &c, &n));
    o.save_dir = NULL;
    o.first_step = 2;
    o.load_dir = dir;
    strata_moments forms[] = {STRATA_MOMENTS_BF16, STRATA_MOMENTS_8BIT};
    for (size_t i = 0; i < 2; i++) {
        c = form_config(forms[i], false);
        free(train(&o, &c, &n));
    }
}

static void refusals(void)
{
    synth_opts o;
    synth_defaults(&o, 14);
    o.steps = 1;
    strata_config c = form_config(STRATA_MOMENTS_BF16, false);
    c.offload_optimizer_ratio = 0.5;
    c.sub_group_size = 4096;
    strata_engine *e = NULL;
    T_STATUS(synth_engine(&o, &c, &e), STRATA_ECONFIG);
    T_CONTAINS(strata_last_error(NULL), "strata.optimizer_moments = \"bf16\"");
    strata_engine_destroy(e);

    strata_config j;
    strata_config_init(&j);
    char err[512] = "";
    T_STATUS(strata_config_load_json_string(&j, "{\"strata\": {\"optimizer_moments\": \"fp8\"}}", "t", err,
                                            sizeof err),
             STRATA_ECONFIG);
    T_CONTAINS(err, "strata.optimizer_moments = \"fp8\" is not allowed; allowed: \"fp32\", \"bf16\", \"8bit\"");
    T_OK(strata_config_load_json_string(&j, "{\"strata\": {\"optimizer_moments\": \"8bit\"}}", "t", err, sizeof err));
    T_EQ_INT(j.optimizer_moments, STRATA_MOMENTS_8BIT);
}

static void plan_bytes(void)
{
    size_t n = (size_t)1 << 22, sg = (size_t)1 << 20;
    strata_moments forms[] = {STRATA_MOMENTS_FP32, STRATA_MOMENTS_BF16, STRATA_MOMENTS_8BIT};
    size_t per[] = {12, 8, 6};
    for (size_t i = 0; i < 3; i++) {
        plan_input in = {.total_numel = n, .largest_module_numel = 1 << 16, .param_bytes = 2,
                         .param_tier = STRATA_TIER_HOST, .opt_tier = STRATA_TIER_NVME, .grad_tier = STRATA_TIER_HOST,
                         .sub_group_numel = sg, .moments = forms[i]};
        plan p;
        plan_compute(&in, &p);
        size_t scales = forms[i] == STRATA_MOMENTS_8BIT ? 2 * 4 * (n / 2048) : 0;
        T_EQ_INT(p.tier_bytes[STRATA_TIER_NVME], per[i] * n);
        T_EQ_INT(p.pool_part_bytes[3], STEP_SLOTS * per[i] * sg);
        T_EQ_INT(p.tier_bytes[STRATA_TIER_HOST], n * 2 + n * 4 + scales + p.pinned_pool_bytes);
        plan_host_cache(&(strata_config){.host_cache = true, .param_max_in_cpu = 0}, &in, SIZE_MAX, &p);
        T_EQ_INT(p.cache_opt_bytes, per[i] * n);
    }
}

int main(void)
{
    t_rng_seed();
    scratch = t_scratch_dir("t_engine_moments");
    synth_opts o;
    synth_defaults(&o, 11);
    o.steps = 5;
    strata_config c = form_config(STRATA_MOMENTS_FP32, false);
    synth_placements[0].apply(&c, scratch);
    size_t n = 0;
    float *fp32 = train(&o, &c, &n);
    strata_moments forms[] = {STRATA_MOMENTS_BF16, STRATA_MOMENTS_8BIT};
    for (size_t i = 0; i < 2; i++) {
        placements(forms[i], false, fp32);
        placements(forms[i], true, NULL);
    }
    free(fp32);
    resume(STRATA_MOMENTS_BF16);
    resume(STRATA_MOMENTS_8BIT);
    convert_on_load();
    refusals();
    plan_bytes();
    return t_done();
}
