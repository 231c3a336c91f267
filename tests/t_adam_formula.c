/*
 * Proves that strata's Adam follows the torch it is told to (strata.adam_first_moment): with MUL_ADD the update of
 * torch < 2.0 (exp_avg.mul_(beta1).add_(grad, alpha=1-beta1)), with LERP the update of torch >= 2.0
 * (exp_avg.lerp_(grad, 1-beta1)), each bit for bit, through the public strata_adam_step on every ISA this CPU runs
 * and a thread count that splits the work, for a small lerp weight (beta1 = 0.9: lerp from m) and a large one
 * (beta1 = 0.3: lerp from the gradient, ATen's other branch), over six steps. The oracle is each torch's update
 * transcribed from its source here, element by element in fp32, not strata's code. The two formulas must also
 * differ on the same data (so a switch that does nothing fails), and the config key must reach the hyperparameters
 * and refuse a value it does not know, naming the allowed ones.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "strata.h"
#include "testlib.h"

/* ATen's lerp (aten/src/ATen/native/Lerp.h, lerp_vec in cpu/LerpKernel.cpp): from self with the weight while it
 * is small, else from end with weight - 1, as one fused multiply-add. */
static float aten_lerp(float self, float end, float weight)
{
    return fabsf(weight) < 0.5f ? fmaf(weight, end - self, self) : fmaf(weight - 1.0f, end - self, end);
}

/* One element of torch's AdamW (weight decay decoupled), from Python doubles rounded to fp32 where they meet a
 * tensor. torch 1.13: exp_avg.mul_(beta1).add_(grad, alpha=1-beta1), its add with alpha a fused multiply-add; torch
 * 2.x: exp_avg.lerp_(grad, 1-beta1). The rest is the same in both: exp_avg_sq.mul_(beta2).addcmul_(grad, grad,
 * value=1-beta2), denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps), param.mul_(1 - lr * wd), then
 * param.addcdiv_(exp_avg, denom, value=-step_size). */
static void torch_adamw(bool lerp, double lr, double b1, double b2, double eps, double wd, int64_t step, float g,
                        float *p, float *m, float *v)
{
    double bc1 = 1.0 - pow(b1, (double)step), bc2 = 1.0 - pow(b2, (double)step);
    if (lerp)
        *m = aten_lerp(*m, g, (float)(1.0 - b1));
    else
        *m = fmaf(g, (float)(1.0 - b1), *m * (float)b1);
    *v = fmaf(g * (float)(1.0 - b2), g, *v * (float)b2);
    float denom = sqrtf(*v) / (float)sqrt(bc2) + (float)eps;
    volatile float decayed = *p * (float)(1.0 - lr * wd); /* a separate mul_: never fused into the add */
    *p = decayed + ((float)-(lr / bc1) * *m) / denom;
}

typedef struct run {
    float *p, *m, *v;
} run;

static void run_alloc(run *r, size_t n, const float *p0)
{
    r->p = malloc(n * 4);
    r->m = calloc(n, 4);
    r->v = calloc(n, 4);
    memcpy(r->p, p0, n * 4);
}

static void run_free(run *r)
{
    free(r->p);
    free(r->m);
    free(r->v);
}

/* Elements whose bits differ between a and b; prints the first few. */
static size_t differing(const char *what, const float *got, const float *want, size_t n, bool report)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&got[i], &want[i], 4) == 0)
            continue;
        if (report && bad < 3)
            t_fail(__FILE__, __LINE__, "%s[%zu]: strata %.9g (0x%08x), torch %.9g", what, i, got[i],
                   *(const uint32_t *)&got[i], want[i]);
        bad++;
    }
    return bad;
}

static void formula_case(strata_adam_formula formula, double b1, int threads)
{
    const size_t n = 10007; /* an odd length: every kernel's tail too */
    const double lr = 1e-3, b2 = 0.999, eps = 1e-8, wd = 0.1;
    bool lerp = formula == STRATA_ADAM_LERP;
    float *p0 = malloc(n * 4), *g = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        p0[i] = t_rand_normal();
    run s, o, other;
    run_alloc(&s, n, p0);
    run_alloc(&o, n, p0);
    run_alloc(&other, n, p0);
    strata_adam_hparams hp = {STRATA_OPTIMIZER_ADAMW, lr, b1, b2, eps, wd, true, formula};
    size_t m_bad = 0, p_bad = 0, apart = 0;
    for (int64_t step = 1; step <= 6; step++) {
        for (size_t i = 0; i < n; i++) /* gradients of every scale, some near zero where Adam amplifies */
            g[i] = t_rand_normal() * (i % 7 == 0 ? 1e-6f : 0.1f);
        strata_adam_tensors t = {s.p, s.m, s.v, g, STRATA_DTYPE_FP32, NULL, STRATA_DTYPE_NONE, n};
        strata_adam_step_args args = {.step = step, .threads = threads};
        T_OK(strata_adam_step(&hp, &t, &args, NULL));
        for (size_t i = 0; i < n; i++) {
            torch_adamw(lerp, lr, b1, b2, eps, wd, step, g[i], &o.p[i], &o.m[i], &o.v[i]);
            torch_adamw(!lerp, lr, b1, b2, eps, wd, step, g[i], &other.p[i], &other.m[i], &other.v[i]);
        }
        char what[96];
        snprintf(what, sizeof what, "%s beta1=%g threads=%d step %lld exp_avg", lerp ? "lerp" : "mul_add", b1,
                 threads, (long long)step);
        m_bad += differing(what, s.m, o.m, n, m_bad == 0);
        snprintf(what, sizeof what, "%s beta1=%g threads=%d step %lld param", lerp ? "lerp" : "mul_add", b1,
                 threads, (long long)step);
        p_bad += differing(what, s.p, o.p, n, p_bad == 0);
        differing("", s.v, o.v, n, false);
        apart += differing("", o.m, other.m, n, false);
    }
    T_CHECK(m_bad == 0 && p_bad == 0, "%s beta1=%g: %zu moments and %zu weights differ from torch's formula",
            lerp ? "lerp" : "mul_add", b1, m_bad, p_bad);
    /* On this data the two torches disagree in many elements: a kernel that ignored the formula fails above. */
    T_CHECK(apart > n / 10, "beta1=%g: the two formulas differ in only %zu moments over 6 steps of %zu", b1, apart,
            n);
    run_free(&s);
    run_free(&o);
    run_free(&other);
    free(p0);
    free(g);
}

static void config_key(void)
{
    strata_config cfg;
    strata_adam_hparams hp;
    char err[512];
    T_OK(strata_config_init(&cfg));
    T_OK(strata_config_adam_hparams(&cfg, &hp));
    T_EQ_INT(hp.formula, STRATA_ADAM_MUL_ADD);
    T_OK(strata_config_load_json_string(&cfg, "{\"strata\": {\"adam_first_moment\": \"lerp\"}}", "t", err,
                                        sizeof err));
    T_OK(strata_config_adam_hparams(&cfg, &hp));
    T_EQ_INT(hp.formula, STRATA_ADAM_LERP);
    T_STATUS(strata_config_load_json_string(&cfg, "{\"strata\": {\"adam_first_moment\": \"torch2\"}}", "t", err,
                                            sizeof err),
             STRATA_ECONFIG);
    T_CONTAINS(err, "strata.adam_first_moment");
    T_CONTAINS(err, "lerp");
    T_CONTAINS(err, "mul_add");
    /* A formula outside the enum is refused by the standalone API too. */
    float x = 0;
    strata_adam_hparams bad = {STRATA_OPTIMIZER_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0, true, (strata_adam_formula)7};
    strata_adam_tensors t = {&x, &x + 0, &x + 0, &x, STRATA_DTYPE_FP32, NULL, STRATA_DTYPE_NONE, 0};
    strata_adam_step_args args = {.step = 1};
    T_STATUS(strata_adam_step(&bad, &t, &args, NULL), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "hp->formula = 7");
}

int main(void)
{
    t_rng_seed();
    config_key();
    const double betas[] = {0.9, 0.3};
    for (size_t b = 0; b < 2; b++)
        for (int threads = 1; threads <= 2; threads++) {
            formula_case(STRATA_ADAM_MUL_ADD, betas[b], threads);
            formula_case(STRATA_ADAM_LERP, betas[b], threads);
        }
    printf("Adam kernel: %s\n", strata_adam_isa());
    return t_done();
}
