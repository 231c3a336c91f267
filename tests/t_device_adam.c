/*
 * Proves that the device Adam of every backend here (dev_adam_step, the optimizer's device share of
 * offload_optimizer.ratio) gives the bits of the scalar reference adam_step_ref: every parameter dtype, AdamW and
 * Adam (with and without decay), bias correction on and off, an odd length, six steps with the state carried over
 * and a fresh gradient (edge values, inf and NaN mixed in) each step. Zero tolerance; only NaN payloads may differ.
 * Runs on the host backend always (its dispatched CPU kernel; STRATA_ISA=ref makes it the reference itself) and on
 * CUDA where a device answers; the arguments' errors are checked once.
 */
#include <stdio.h>

#include "base/util.h"
#include "gpu/device.h"
#include "t_adam_util.h"

static const strata_dtype param_types[] = {STRATA_DTYPE_FP32, STRATA_DTYPE_BF16, STRATA_DTYPE_FP16,
                                           STRATA_DTYPE_NONE};

typedef struct dev_state {
    float *master, *m, *v, *grad;
    void *param;
} dev_state;

static void up(dev_stream *s, dev_state *d, const ta_state *h)
{
    T_OK(dev_memcpy_async(s, d->master, h->master, h->n * 4));
    T_OK(dev_memcpy_async(s, d->m, h->m, h->n * 4));
    T_OK(dev_memcpy_async(s, d->v, h->v, h->n * 4));
    T_OK(dev_memcpy_async(s, d->grad, h->grad, h->n * 4));
}

static void down(dev_stream *s, ta_state *h, const dev_state *d)
{
    T_OK(dev_memcpy_async(s, h->master, d->master, h->n * 4));
    T_OK(dev_memcpy_async(s, h->m, d->m, h->n * 4));
    T_OK(dev_memcpy_async(s, h->v, d->v, h->n * 4));
    if (h->param)
        T_OK(dev_memcpy_async(s, h->param, d->param, h->n * strata_dtype_bytes(h->pd)));
    T_OK(dev_stream_sync(s));
}

static void run_case(device *dev, dev_stream *s, strata_dtype pd, const strata_adam_hparams *hp, size_t n)
{
    ta_state ref, got;
    ta_alloc(&ref, n, STRATA_DTYPE_FP32, pd);
    ta_alloc(&got, n, STRATA_DTYPE_FP32, pd);
    ta_fill_master(&ref);
    dev_state d = {0};
    T_OK(dev_alloc(dev, n * 4, (void **)&d.master));
    T_OK(dev_alloc(dev, n * 4, (void **)&d.m));
    T_OK(dev_alloc(dev, n * 4, (void **)&d.v));
    T_OK(dev_alloc(dev, n * 4, (void **)&d.grad));
    if (pd != STRATA_DTYPE_NONE)
        T_OK(dev_alloc(dev, n * 4, &d.param));
    char what[160];
    snprintf(what, sizeof what, "%s param=%s %s%s wd=%g bias=%d n=%zu", dev_name(dev), strata_dtype_name(pd),
             hp->kind == STRATA_OPTIMIZER_ADAMW ? "adamw" : "adam", hp->formula == STRATA_ADAM_LERP ? " lerp" : "",
             hp->weight_decay, hp->bias_correction, n);
    ta_copy(&got, &ref);
    up(s, &d, &got);
    for (int step = 1; step <= 6; step++) {
        ta_fill_grad(&ref, 500, true);
        T_OK(dev_memcpy_async(s, d.grad, ref.grad, n * 4));
        adam_consts c;
        adam_consts_init(&c, hp, step, step == 3 ? 1.0 / 1024.0 : 0.75);
        adam_arrays ar = {ref.master, ref.m, ref.v, ref.grad, ref.param, STRATA_DTYPE_FP32, pd, false};
        adam_step_ref(&c, &ar, 0, n);
        dev_adam_arrays da = {d.master, d.m, d.v, d.grad, d.param, pd};
        T_OK(dev_adam_step(s, &c, &da, n));
        down(s, &got, &d);
        char label[200];
        snprintf(label, sizeof label, "%s step=%d", what, step);
        if (ta_compare(&got, &ref, label))
            break;
    }
    dev_free(dev, d.master);
    dev_free(dev, d.m);
    dev_free(dev, d.v);
    dev_free(dev, d.grad);
    dev_free(dev, d.param);
    ta_free(&ref);
    ta_free(&got);
}

static void run_backend(strata_backend_kind kind)
{
    device *dev = NULL;
    dev_options o = DEV_OPTIONS_INIT;
    o.budget_bytes = 64u << 20;
    T_OK(dev_create(kind, &o, &dev));
    if (!dev)
        return;
    dev_stream *s = NULL;
    T_OK(dev_stream_create(dev, "adam", &s));
    const strata_adam_hparams hps[] = {
        {STRATA_OPTIMIZER_ADAMW, 1e-2, 0.9, 0.999, 1e-8, 0.05, true, STRATA_ADAM_MUL_ADD},
        {STRATA_OPTIMIZER_ADAM, 3e-3, 0.9, 0.95, 1e-6, 0.01, true, STRATA_ADAM_MUL_ADD},
        {STRATA_OPTIMIZER_ADAM, 1e-3, 0.8, 0.999, 1e-8, 0.0, true, STRATA_ADAM_MUL_ADD},
        {STRATA_OPTIMIZER_ADAMW, 2e-2, 0.9, 0.99, 1e-8, 0.1, false, STRATA_ADAM_MUL_ADD},
        /* torch >= 2.0's first moment, from m and from the gradient (the CUDA kernel's own branch). */
        {STRATA_OPTIMIZER_ADAMW, 1e-2, 0.9, 0.999, 1e-8, 0.05, true, STRATA_ADAM_LERP},
        {STRATA_OPTIMIZER_ADAM, 3e-3, 0.3, 0.95, 1e-6, 0.01, true, STRATA_ADAM_LERP},
    };
    int before = t_failures;
    for (size_t p = 0; p < ARRAY_LEN(param_types); p++)
        for (size_t h = 0; h < ARRAY_LEN(hps); h++)
            run_case(dev, s, param_types[p], &hps[h], 10007);

    /* The arguments' errors name the call, the stream and the value. */
    float *x = NULL;
    T_OK(dev_alloc(dev, 4096, (void **)&x));
    adam_consts c;
    adam_consts_init(&c, &hps[0], 1, 1.0);
    dev_adam_arrays bad = {x, x, x, NULL, NULL, STRATA_DTYPE_NONE};
    T_STATUS(dev_adam_step(s, &c, &bad, 16), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "dev_adam_step on stream \"adam\": NULL constants or array");
    bad = (dev_adam_arrays){x, x, x, x, NULL, (strata_dtype)42};
    T_STATUS(dev_adam_step(s, &c, &bad, 16), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "param_dtype 42 is not one of fp32, bf16, fp16 or none");
    bad.param_dtype = STRATA_DTYPE_BF16;
    T_STATUS(dev_adam_step(s, &c, &bad, 16), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "NULL param with a param_dtype");
    T_OK(dev_adam_step(s, &c, &bad, 0)); /* nothing to do */
    dev_free(dev, x);
    dev_stream_destroy(s);
    dev_destroy(dev);
    printf("backend %s: %s\n", kind == STRATA_BACKEND_HOST ? "host" : "cuda",
           t_failures == before ? "passed" : "FAILED");
}

int main(void)
{
    printf("seed %llu\n", (unsigned long long)t_rng_seed());
    run_backend(STRATA_BACKEND_HOST);
    char why[256];
    if (dev_probe(STRATA_BACKEND_CUDA, why, sizeof why) == STRATA_OK)
        run_backend(STRATA_BACKEND_CUDA);
    else
        printf("backend cuda: skipped: %s\n", why);
    return t_done();
}
