/*
 * Proves the public CPU Adam on caller arrays: strata_adam_step with 1..3 threads and several tile sizes
 * gives the bits of the scalar reference; the per-tile callback covers every element exactly once in
 * cache-line-aligned tiles; the gradient pre-pass finds a single inf/NaN anywhere and sums squares to
 * within its stated bound; a step with skip_nonfinite and an overflowed gradient writes nothing; every
 * argument error names the field, the value and what is allowed; an unknown STRATA_ISA warns and names
 * the allowed values.
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "t_adam_util.h"

static const strata_dtype grad_types[] = {STRATA_DTYPE_FP32, STRATA_DTYPE_BF16, STRATA_DTYPE_FP16};
static const strata_dtype param_types[] = {STRATA_DTYPE_FP32, STRATA_DTYPE_BF16, STRATA_DTYPE_FP16,
                                           STRATA_DTYPE_NONE};

typedef struct coverage {
    size_t n;
    _Atomic unsigned char *hits;
    atomic_int misaligned;
} coverage;

static void on_tile(size_t offset, size_t numel, void *user)
{
    coverage *c = user;
    if (offset % 1024 != 0 || (offset + numel != c->n && numel % 1024 != 0))
        atomic_fetch_add(&c->misaligned, 1);
    for (size_t i = offset; i < offset + numel && i < c->n; i++)
        atomic_fetch_add(&c->hits[i], 1);
}

static void step_matches_reference(void)
{
    strata_adam_hparams hp = {STRATA_OPTIMIZER_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.01, true, STRATA_ADAM_MUL_ADD};
    for (int round = 0; round < 12; round++) {
        strata_dtype gd = grad_types[round % 3], pd = param_types[round % 4];
        size_t n = t_rand_range(1, 300000);
        int threads = 1 + round % 3;
        size_t tile = round % 2 ? t_rand_range(1, 70000) : 0;
        ta_state ref, got;
        ta_alloc(&ref, n, gd, pd);
        ta_alloc(&got, n, gd, pd);
        ta_fill_master(&ref);
        coverage cov = {n, calloc(n, 1), 0};
        for (int step = 1; step <= 3; step++) {
            ta_fill_grad(&ref, 0, true);
            ta_copy(&got, &ref);
            adam_consts c;
            adam_consts_init(&c, &hp, step, 0.5);
            adam_step_ref(&c, &(adam_arrays){ref.master, ref.m, ref.v, ref.grad, ref.param, gd, pd, false}, 0, n);
            strata_adam_tensors t = {got.master, got.m, got.v, got.grad, gd, got.param, pd, n};
            strata_adam_step_args args = {.step = step, .grad_scale = 0.5, .threads = threads,
                                          .on_tile = step == 1 ? on_tile : NULL, .on_tile_user = &cov,
                                          .tile_numel = tile};
            T_OK(strata_adam_step(&hp, &t, &args, NULL));
            char what[128];
            snprintf(what, sizeof what, "strata_adam_step grad=%s param=%s n=%zu threads=%d tile=%zu step=%d",
                     strata_dtype_name(gd), strata_dtype_name(pd), n, threads, tile, step);
            ta_compare(&got, &ref, what);
        }
        size_t wrong = 0, first = 0;
        for (size_t i = 0; i < n; i++)
            if (cov.hits[i] != 1 && wrong++ == 0)
                first = i;
        T_CHECK(wrong == 0, "tiles (n=%zu threads=%d tile=%zu) covered %zu elements not exactly once; first %zu "
                "covered %d times", n, threads, tile, wrong, first, wrong ? cov.hits[first] : 1);
        T_EQ_INT(atomic_load(&cov.misaligned), 0);
        free((void *)cov.hits);
        ta_free(&ref);
        ta_free(&got);
    }
}

static void grad_stats(void)
{
    for (size_t k = 0; k < 3; k++) {
        for (int round = 0; round < 8; round++) {
            size_t n = t_rand_range(1, 200000);
            ta_state s;
            ta_alloc(&s, n, grad_types[k], STRATA_DTYPE_NONE);
            ta_fill_grad(&s, 0, false);
            double want = 0.0;
            for (size_t i = 0; i < n; i++) {
                adam_gradstats one = {0};
                adam_gradstats_ref(s.grad, s.gd, i, i + 1, &one);
                want += one.sumsq;
            }
            double sumsq;
            bool bad;
            T_OK(strata_adam_grad_stats(s.grad, s.gd, n, 1 + round % 2, &sumsq, &bad));
            /* fp32 partial sums over blocks of 4096 squares: relative error below 4096 * 2^-24 = 2.4e-4. */
            T_CHECK(!bad && fabs(sumsq - want) <= 2.5e-4 * want, "%s n=%zu: sumsq %.9g, reference %.9g, nonfinite %d",
                    strata_dtype_name(s.gd), n, sumsq, want, bad);
            /* One inf or NaN anywhere, the first and last elements included. */
            size_t at = round == 0 ? 0 : round == 1 ? n - 1 : t_rand_range(0, n - 1);
            float v = round % 2 ? INFINITY : NAN;
            if (s.gd == STRATA_DTYPE_FP32)
                ((float *)s.grad)[at] = v;
            else
                ((uint16_t *)s.grad)[at] = s.gd == STRATA_DTYPE_BF16 ? cvt_f32_to_bf16(v) : cvt_f32_to_fp16(v);
            T_OK(strata_adam_grad_stats(s.grad, s.gd, n, 2, &sumsq, &bad));
            T_CHECK(bad, "%s n=%zu: %g at %zu not found", strata_dtype_name(s.gd), n, v, at);
            ta_free(&s);
        }
    }
}

static void overflow_writes_nothing(void)
{
    strata_adam_hparams hp = {STRATA_OPTIMIZER_ADAM, 1e-3, 0.9, 0.999, 1e-8, 0.0, true, STRATA_ADAM_MUL_ADD};
    size_t n = 77777;
    ta_state s, before;
    ta_alloc(&s, n, STRATA_DTYPE_FP16, STRATA_DTYPE_FP16);
    ta_alloc(&before, n, STRATA_DTYPE_FP16, STRATA_DTYPE_FP16);
    ta_fill_master(&s);
    ta_fill_grad(&s, 0, false);
    for (size_t i = 0; i < n; i++)
        s.m[i] = t_rand_normal(), s.v[i] = (float)t_rand_unit(), ((uint16_t *)s.param)[i] = (uint16_t)i;
    ((uint16_t *)s.grad)[t_rand_range(0, n - 1)] = 0x7c00; /* +inf: an fp16 overflow */
    ta_copy(&before, &s);
    strata_adam_tensors t = {s.master, s.m, s.v, s.grad, s.gd, s.param, s.pd, n};
    strata_adam_step_args args = {.step = 1, .grad_scale = 1.0 / 65536, .skip_nonfinite = true};
    strata_adam_step_result res;
    T_OK(strata_adam_step(&hp, &t, &args, &res));
    T_CHECK(res.skipped, "an inf gradient did not skip the step");
    T_CHECK(memcmp(s.master, before.master, n * 4) == 0 && memcmp(s.m, before.m, n * 4) == 0 &&
                memcmp(s.v, before.v, n * 4) == 0 && memcmp(s.param, before.param, n * 2) == 0,
            "a skipped step changed master, m, v or the parameter copy");
    /* Without the inf the same call runs and writes. */
    for (size_t i = 0; i < n; i++)
        if (((uint16_t *)s.grad)[i] == 0x7c00)
            ((uint16_t *)s.grad)[i] = 0x3c00;
    T_OK(strata_adam_step(&hp, &t, &args, &res));
    T_CHECK(!res.skipped && res.grad_sumsq > 0 && memcmp(s.m, before.m, n * 4) != 0,
            "a finite gradient was skipped (%d) or wrote nothing (sumsq %g)", res.skipped, res.grad_sumsq);
    ta_free(&s);
    ta_free(&before);
}

static void argument_errors(void)
{
    float x[4] = {0};
    uint16_t h[4] = {0};
    strata_adam_hparams ok = {STRATA_OPTIMIZER_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.0, true, STRATA_ADAM_MUL_ADD};
    strata_adam_tensors t = {x, x + 1, x + 2, h, STRATA_DTYPE_BF16, h + 1, STRATA_DTYPE_BF16, 1};
    strata_adam_step_args args = {.step = 1};

    strata_adam_hparams hp = ok;
    hp.beta1 = 1.0;
    T_STATUS(strata_adam_step(&hp, &t, &args, NULL), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "strata_adam_step: hp->beta1 = 1 is out of range [0, 1)");
    hp = ok;
    hp.lr = NAN;
    T_STATUS(strata_adam_step(&hp, &t, &args, NULL), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "hp->lr = nan is out of range [0, inf]");

    strata_adam_tensors bad = t;
    bad.param = NULL;
    T_STATUS(strata_adam_step(&ok, &bad, &args, NULL), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "t->param is NULL but t->param_dtype = bf16; pass an array or STRATA_DTYPE_NONE");
    bad = t;
    bad.grad_dtype = STRATA_DTYPE_NONE;
    T_STATUS(strata_adam_step(&ok, &bad, &args, NULL), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "t->grad_dtype = none (3) is not a gradient type; use FP32, BF16 or FP16");
    bad = t;
    bad.exp_avg = NULL;
    T_STATUS(strata_adam_step(&ok, &bad, &args, NULL), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "t->exp_avg is NULL with numel = 1");

    strata_adam_step_args a = args;
    a.step = 0;
    T_STATUS(strata_adam_step(&ok, &t, &a, NULL), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "args->step = 0 with bias correction; steps count from 1");
    a = args;
    a.threads = -2;
    T_STATUS(strata_adam_step(&ok, &t, &a, NULL), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "threads = -2 is out of range [0, 4096]");
    a = args;
    a.grad_scale = -1.0;
    T_STATUS(strata_adam_step(&ok, &t, &a, NULL), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "args->grad_scale = -1 must be finite and > 0 (0 means 1)");

    double sumsq;
    bool nonfinite;
    T_STATUS(strata_adam_grad_stats(NULL, STRATA_DTYPE_FP32, 5, 0, &sumsq, &nonfinite), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "strata_adam_grad_stats: grad is NULL with numel = 5");
    /* A failed call leaves nothing behind; a good one clears the message. */
    T_OK(strata_adam_step(&ok, &t, &args, NULL));
    T_EQ_STR(strata_last_error(NULL), "");
}

static char warned[512];

static void capture(strata_log_level level, const char *subsystem, const char *message, void *user)
{
    (void)user;
    if (level == STRATA_LOG_WARN && strcmp(subsystem, "adam") == 0)
        snprintf(warned, sizeof warned, "%s", message);
}

int main(void)
{
    t_rng_seed();
    /* Before the first use: the kernel is chosen once per process. */
    setenv("STRATA_ISA", "sse9", 1);
    strata_log_set_callback(capture, NULL);
    const char *isa = strata_adam_isa();
    T_CHECK(isa != NULL, "strata_adam_isa() failed: %s", strata_last_error(NULL));
    T_CONTAINS(warned, "STRATA_ISA=\"sse9\" is not a known kernel; allowed: ref, avx2, avx512");
    strata_log_set_callback(NULL, NULL);
    printf("kernel: %s\n", isa ? isa : "(none)");

    step_matches_reference();
    grad_stats();
    overflow_writes_nothing();
    argument_errors();
    return t_done();
}
