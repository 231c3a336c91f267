/*
 * Exact resume: training 2N steps must give bit-identical master weights to training N steps, saving,
 * loading into a new engine and training N more — on every placement (device, host, NVMe, NVMe with a
 * budget that forces demand fetches), with and without the delayed update (saved with an update still
 * pending), in fp32, bf16 and fp16 with dynamic loss scaling. A save in the middle of a run must not
 * change that run either. A resumed run that skips the load must differ (or the test proves nothing).
 */
#include "synth.h"
#include "testlib.h"

static const char *scratch;

static strata_config base_config(strata_dtype dtype)
{
    strata_config c = synth_config(dtype);
    if (dtype == STRATA_DTYPE_FP16) {
        c.initial_scale_power = 8;
        c.loss_scale_window = 2; /* the scale grows during the run: good_steps must survive the save */
    }
    return c;
}

static void expect_same(const char *what, const float *a, const float *b, size_t n)
{
    size_t first, d = synth_count_diff(a, b, n, &first);
    T_CHECK(d == 0, "%s: %zu of %zu weights differ; first at %zu: %.9g (uninterrupted) vs %.9g", what, d, n, first,
            first < n ? (double)a[first] : 0.0, first < n ? (double)b[first] : 0.0);
}

static void run(const char *family, strata_dtype dtype, bool delayed, int p)
{
    char label[160], dir[512];
    snprintf(label, sizeof label, "%s / %s", family, synth_placements[p].name);
    snprintf(dir, sizeof dir, "%s/ckpt", scratch);
    strata_config c = base_config(dtype);
    synth_placements[p].apply(&c, scratch);
    c.delayed_update = delayed;
    c.delayed_warmup_steps = 1;
    const int N = 3; /* > warmup: the save finds a delayed update in flight */

    synth_opts o;
    synth_defaults(&o, t_rand_u64());
    o.steps = 2 * N;
    o.lr_decay = 0.9;
    float *full = NULL, *half = NULL, *resumed = NULL, *mid = NULL, *fresh = NULL;
    size_t n_full = 0, n = 0;
    T_OK(synth_train(&o, &c, &full, &n_full, NULL, NULL));

    /* The same run with a save after N steps: the save must not disturb it. */
    o.save_dir = dir;
    o.save_after = N;
    T_OK(synth_train(&o, &c, &mid, &n, NULL, NULL));
    if (full && mid)
        expect_same(label, full, mid, n_full);
    free(mid);

    /* N steps and a save; then a new engine loads and trains steps N..2N-1. */
    o.steps = N;
    T_OK(synth_train(&o, &c, &half, &n, NULL, NULL));
    o.save_dir = NULL;
    o.first_step = N;
    o.load_dir = dir;
    T_OK(synth_train(&o, &c, &resumed, &n, NULL, NULL));
    if (full && resumed) {
        char what[200];
        snprintf(what, sizeof what, "%s: resumed after a save at step %d", label, N);
        expect_same(what, full, resumed, n_full);
    }
    /* Without the load the second half starts from the initial weights: it must differ. */
    o.load_dir = NULL;
    T_OK(synth_train(&o, &c, &fresh, &n, NULL, NULL));
    if (full && fresh) {
        size_t first, d = synth_count_diff(full, fresh, n_full, &first);
        T_CHECK(d > n_full / 2, "%s: a run that skipped the load matches in %zu of %zu weights", label, n_full - d,
                n_full);
    }
    free(full);
    free(half);
    free(resumed);
    free(fresh);
}

int main(void)
{
    t_rng_seed();
    scratch = t_scratch_dir("t_ckpt_resume");
    for (size_t p = 0; p < synth_placement_count; p++) {
        run("fp32", STRATA_DTYPE_FP32, false, (int)p);
        run("fp32 delayed", STRATA_DTYPE_FP32, true, (int)p);
        run("bf16 delayed", STRATA_DTYPE_BF16, true, (int)p);
    }
    run("bf16", STRATA_DTYPE_BF16, false, 1);
    run("fp16 dynamic scale", STRATA_DTYPE_FP16, false, 1);
    run("fp16 dynamic scale delayed", STRATA_DTYPE_FP16, true, 3);
    return t_done();
}
