/*
 * Gradient clipping and fp16 dynamic loss scaling through the engine, against the standalone Adam
 * with the scale computed here: the clipped step equals Adam with grad_scale = clip / (norm + 1e-6)
 * (the unscaled global norm over every parameter); an fp16 overflow skips the step (master weights
 * untouched) and halves the loss scale after `hysteresis` overflows.
 */
#include <math.h>

#include "testlib.h"

#define N1 3000
#define N2 5000

static float init_vals[N1 + N2];

static strata_status init(void *ctx, strata_param_id p, size_t off, size_t n, float *out)
{
    const float *base = ctx;
    (void)p;
    memcpy(out, base + off, n * sizeof *out);
    return STRATA_OK;
}

typedef struct model {
    strata_engine *e;
    strata_module_id m[2];
    strata_param_id p[2];
} model;

static void build(model *md, strata_config *c)
{
    T_OK(strata_engine_create(c, &md->e));
    T_OK(strata_module_add(md->e, "a", &md->m[0]));
    T_OK(strata_module_add(md->e, "b", &md->m[1]));
    T_OK(strata_param_add(md->e, md->m[0], "w", N1, init, init_vals, &md->p[0]));
    T_OK(strata_param_add(md->e, md->m[1], "w", N2, init, init_vals + N1, &md->p[1]));
    T_OK(strata_engine_finalize(md->e));
}

/* One backward pass that hands grads g (already times the loss scale) in the param dtype. */
static void backward(model *md, const float *g, strata_dtype dt)
{
    size_t n[2] = {N1, N2};
    const float *src[2] = {g, g + N1};
    for (int i = 1; i >= 0; i--) {
        T_OK(strata_fetch(md->e, md->m[i]));
        void *buf = strata_grad_data(md->e, md->p[i]);
        T_CHECK(buf != NULL, "grad_data: %s", strata_last_error(md->e));
        if (!buf)
            return;
        for (size_t j = 0; j < n[i]; j++) {
            if (dt == STRATA_DTYPE_FP32) {
                ((float *)buf)[j] = src[i][j];
            } else {
                _Float16 h = (_Float16)src[i][j];
                memcpy((uint16_t *)buf + j, &h, 2);
            }
        }
        T_OK(strata_grads_ready(md->e, md->m[i]));
        T_OK(strata_release(md->e, md->m[i]));
    }
}

static void read_all(model *md, float *out)
{
    T_OK(strata_param_read_master(md->e, md->p[0], 0, N1, out));
    T_OK(strata_param_read_master(md->e, md->p[1], 0, N2, out + N1));
}

static void test_clipping(void)
{
    strata_config c;
    strata_config_init(&c);
    c.backend = STRATA_BACKEND_HOST;
    c.device_budget_bytes = 16u << 20;
    c.offload_optimizer.device = STRATA_TIER_HOST;
    c.gradient_clipping = 0.5;
    c.sub_group_size = 4096;
    model md;
    build(&md, &c);
    static float g[N1 + N2], w[N1 + N2], m[N1 + N2], v[N1 + N2], got[N1 + N2];
    double sumsq = 0;
    for (int i = 0; i < N1 + N2; i++) {
        g[i] = t_rand_normal() * 0.1f;
        sumsq += (double)g[i] * g[i];
    }
    double norm = sqrt(sumsq);
    T_CHECK(norm > c.gradient_clipping, "test setup: norm %g does not exceed the clip", norm);
    backward(&md, g, STRATA_DTYPE_FP32);
    strata_step_result r;
    T_OK(strata_step(md.e, NULL, &r));
    T_CHECK(fabs(r.grad_norm - norm) <= 1e-6 * norm, "reported norm %.9g, expected %.9g", r.grad_norm, norm);
    read_all(&md, got);

    memcpy(w, init_vals, sizeof w);
    memset(m, 0, sizeof m);
    memset(v, 0, sizeof v);
    strata_adam_hparams hp;
    T_OK(strata_config_adam_hparams(&c, &hp)); /* what the engine runs with */
    strata_adam_tensors t = {w, m, v, g, STRATA_DTYPE_FP32, NULL, STRATA_DTYPE_NONE, N1 + N2};
    strata_adam_step_args a = {.step = 1, .grad_scale = c.gradient_clipping / (r.grad_norm + 1e-6), .threads = 1};
    T_OK(strata_adam_step(&hp, &t, &a, NULL));
    size_t bad = 0;
    for (int i = 0; i < N1 + N2; i++)
        bad += memcmp(&w[i], &got[i], 4) != 0;
    T_CHECK(bad == 0, "clipped step: %zu of %d weights differ from Adam with grad_scale %.9g (first: %.9g vs %.9g)", bad,
            N1 + N2, a.grad_scale, (double)got[0], (double)w[0]);
    strata_engine_destroy(md.e);
}

static void test_fp16_overflow(void)
{
    strata_config c;
    strata_config_init(&c);
    c.backend = STRATA_BACKEND_HOST;
    c.device_budget_bytes = 16u << 20;
    c.offload_optimizer.device = STRATA_TIER_HOST;
    c.param_dtype = STRATA_DTYPE_FP16;
    c.initial_scale_power = 10;
    c.hysteresis = 2;
    c.loss_scale_window = 3;
    model md;
    build(&md, &c);
    T_CHECK(strata_loss_scale(md.e) == 1024.0, "initial loss scale %g", strata_loss_scale(md.e));
    static float g[N1 + N2], before[N1 + N2], after[N1 + N2];
    for (int i = 0; i < N1 + N2; i++)
        g[i] = t_rand_normal() * 0.01f * 1024;
    g[t_rand_range(0, N1 + N2 - 1)] = INFINITY; /* one overflow anywhere */
    read_all(&md, before);
    strata_step_result r;
    for (int k = 0; k < 2; k++) { /* two overflows: hysteresis 2 halves the scale on the second */
        backward(&md, g, STRATA_DTYPE_FP16);
        T_OK(strata_step(md.e, NULL, &r));
        T_CHECK(r.skipped, "overflow %d: step not skipped", k + 1);
    }
    T_CHECK(r.loss_scale == 512.0, "after two overflows the scale is %g, expected 512", r.loss_scale);
    T_EQ_INT(r.step, 0);
    read_all(&md, after);
    T_CHECK(memcmp(before, after, sizeof before) == 0, "an overflowed step changed the master weights");
    /* Good steps: they update, and after loss_scale_window of them the scale doubles. */
    for (int i = 0; i < N1 + N2; i++)
        if (isinf(g[i]))
            g[i] = 0.5f;
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < N1 + N2; i++)
            g[i] = g[i] / (float)(k == 0 ? 1024.0 / 512.0 : 1.0); /* keep grads times the current scale */
        backward(&md, g, STRATA_DTYPE_FP16);
        T_OK(strata_step(md.e, NULL, &r));
        T_CHECK(!r.skipped, "good step %d skipped", k + 1);
    }
    T_EQ_INT(r.step, 3);
    T_CHECK(r.loss_scale == 1024.0, "after 3 good steps (window 3) the scale is %g, expected 1024", r.loss_scale);
    read_all(&md, after);
    T_CHECK(memcmp(before, after, sizeof before) != 0, "good steps did not change the weights");
    strata_engine_destroy(md.e);
}

int main(void)
{
    t_rng_seed();
    for (int i = 0; i < N1 + N2; i++)
        init_vals[i] = t_rand_normal() * 0.2f;
    test_clipping();
    test_fp16_overflow();
    return t_done();
}
