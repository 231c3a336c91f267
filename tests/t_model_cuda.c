/*
 * The GPT model on the CUDA backend against the host network on flat fp32 arrays (the oracle), on shapes that
 * are not multiples of a warp (hidden 72, head size 24, 37 tokens, a vocabulary of 301 that the bf16 head pads to
 * 384), in both activation formats (STRATA_MODEL_ACTS):
 *  - fp32 activations, fp32 parameters with fp32 math: loss and gradients within fp32 reordering noise;
 *  - fp32 activations, bf16 and fp16 parameters (tensor-core math, fp32 accumulation): within their rounding;
 *  - bf16 activations end to end (bf16 parameters; flash attention, the fused classifier, the grouped embedding
 *    backward): loss and gradients within bf16 rounding of the host's;
 *  - the CUDA kernels are deterministic (no atomics): the same micro-batch twice gives bit-identical gradients;
 *  - optimizer steps trained on CUDA in bf16 follow the host fp32 run's losses within bf16 tolerance: 5 steps with
 *    fp32 activations, 20 with bf16 activations.
 * Skips (77) without a CUDA device or without the CUDA kernels in this build.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_runs.h"
#include "synth.h"
#include "testlib.h"

static const gpt_dims dims = {.layers = 2, .heads = 3, .hidden = 72, .vocab = 301, .seq = 40};
enum { B = 3, T = 37, N = B * T, STEPS = 5, BF16_STEPS = 20 };

typedef struct run {
    strata_engine *e;
    gpt_model *m;
} run;

/* An engine on backend with dt parameters and the model prepared in activation format acts (which the model takes
 * from STRATA_MODEL_ACTS), or a skip when CUDA cannot run here. */
static run start(strata_backend_kind backend, strata_dtype dt, gpt_act_format acts, uint64_t seed)
{
    setenv("STRATA_MODEL_ACTS", gpt_act_format_name(acts), 1);
    strata_config c;
    strata_config_init(&c);
    c.backend = backend;
    c.param_dtype = dt;
    c.device_budget_bytes = 256u << 20;
    c.host_budget_bytes = 256u << 20;
    c.cpu_threads = 2;
    c.lr = 1e-3f;
    c.activation_bytes = gpt_engine_activation_bytes(&dims, B, T, 1, GPT_ACT_KEEP, acts, dt);
    c.offload_optimizer.device = STRATA_TIER_HOST; /* strata's optimizer runs on the CPU */
    run r = {0};
    strata_status st = strata_engine_create(&c, &r.e);
    if (st != STRATA_OK && backend == STRATA_BACKEND_CUDA)
        t_skip("no CUDA backend here: %s", strata_last_error(NULL));
    T_OK(st);
    T_OK(gpt_model_register(r.e, &dims, seed, &r.m));
    T_OK(strata_engine_finalize(r.e));
    st = gpt_model_prepare(r.m, B, T, 1, GPT_ACT_KEEP, dt);
    if (st == STRATA_EUNSUPPORTED)
        t_skip("this build has no CUDA kernels for the model");
    T_CHECK(st == STRATA_OK, "gpt_model_prepare: %s (%s)", strata_last_error(r.e), gpt_model_error(r.m));
    return r;
}

static void stop(run *r)
{
    gpt_model_destroy(r->m);
    strata_engine_destroy(r->e);
}

/* Loss and gradients of one micro-batch on CUDA with dt parameters in activation format acts. */
static double cuda_grads(strata_dtype dt, gpt_act_format acts, uint64_t seed, const int32_t *tok, const int32_t *tgt,
                         float *grads)
{
    run r = start(STRATA_BACKEND_CUDA, dt, acts, seed);
    double loss = 0;
    memset(grads, 0, gpt_numel(&dims) * sizeof(float));
    T_OK(gpt_model_capture_grads(r.m, grads));
    strata_status st = gpt_model_micro_step(r.m, tok, tgt, true, 1.0f, &loss);
    T_CHECK(st == STRATA_OK, "micro step: %s / %s", strata_last_error(r.e), gpt_model_error(r.m));
    stop(&r);
    return loss;
}

typedef struct agreement {
    double cosine, max_err, max_ref;
} agreement;

static agreement compare(const float *g, const float *ref, size_t n)
{
    agreement a = {0};
    double dot = 0, na = 0, nb = 0;
    for (size_t i = 0; i < n; i++) {
        dot += (double)g[i] * ref[i];
        na += (double)g[i] * g[i];
        nb += (double)ref[i] * ref[i];
        a.max_err = fmax(a.max_err, fabs((double)g[i] - ref[i]));
        a.max_ref = fmax(a.max_ref, fabs((double)ref[i]));
    }
    a.cosine = dot / sqrt(na * nb);
    return a;
}

/* Losses of steps optimizer steps (one micro-batch each) on backend with dt parameters in format acts. */
static void train(strata_backend_kind backend, strata_dtype dt, gpt_act_format acts, uint64_t seed, int steps,
                  const int32_t *tok, const int32_t *tgt, double *losses)
{
    run r = start(backend, dt, acts, seed);
    for (int s = 0; s < steps; s++) {
        const int32_t *tk = tok + (size_t)(s % 2) * N, *tg = tgt + (size_t)(s % 2) * N;
        strata_status st = gpt_model_micro_step(r.m, tk, tg, true, 1.0f, &losses[s]);
        T_CHECK(st == STRATA_OK, "step %d: %s / %s", s, strata_last_error(r.e), gpt_model_error(r.m));
        T_OK(strata_step(r.e, NULL, NULL));
    }
    stop(&r);
}

int main(void)
{
    uint64_t seed = t_rand_u64();
    size_t n = gpt_numel(&dims);
    int32_t tok[2 * N], tgt[2 * N];
    synth_rand_tokens(tok, tgt, 2 * N);
    float *g = malloc(n * sizeof(float)), *g2 = malloc(n * sizeof(float));
    T_CHECK(g && g2, "out of memory");
    /* First, so that a machine without CUDA skips before the oracle's work. */
    double loss32 = cuda_grads(STRATA_DTYPE_FP32, GPT_ACTS_FP32, seed, tok, tgt, g);

    float *ref = malloc(n * sizeof(float));
    T_CHECK(ref != NULL, "out of memory");
    double ref_loss = gpt_ref_grads(&dims, B, T, GPT_ACT_KEEP, seed, tok, tgt, 1, 1.0f, ref);

    agreement a = compare(g, ref, n);
    printf("fp32 cuda loss %.7f vs host %.7f; gradients: cosine %.7f, max |diff| %.3g of max |g| %.3g\n", loss32,
           ref_loss, a.cosine, a.max_err, a.max_ref);
    T_CHECK(fabs(loss32 - ref_loss) < 1e-4, "fp32: cuda loss %.7f vs host %.7f", loss32, ref_loss);
    T_CHECK(a.cosine > 0.99999 && a.max_err < 1e-3 * a.max_ref,
            "fp32: gradients disagree with the host: cosine %.7f, max |diff| %.3g of max |g| %.3g", a.cosine,
            a.max_err, a.max_ref);

    /* bf16 and fp16 parameters with fp32 activations, then bf16 end to end. */
    const strata_dtype halves[] = {STRATA_DTYPE_BF16, STRATA_DTYPE_FP16, STRATA_DTYPE_BF16};
    const gpt_act_format formats[] = {GPT_ACTS_FP32, GPT_ACTS_FP32, GPT_ACTS_BF16};
    const char *names[] = {"bf16 params", "fp16 params", "bf16 activations"};
    for (int k = 0; k < 3; k++) {
        const char *name = names[k];
        double loss = cuda_grads(halves[k], formats[k], seed, tok, tgt, g);
        a = compare(g, ref, n);
        printf("%s cuda loss %.6f vs host fp32 %.6f; gradients: cosine %.6f, max |diff| %.3g of max |g| %.3g\n", name,
               loss, ref_loss, a.cosine, a.max_err, a.max_ref);
        T_CHECK(fabs(loss - ref_loss) < 2e-2, "%s: cuda loss %.6f vs host %.6f", name, loss, ref_loss);
        T_CHECK(a.cosine > 0.995, "%s: gradient cosine similarity %.6f <= 0.995", name, a.cosine);
        /* The same micro-batch again: bit-identical. */
        cuda_grads(halves[k], formats[k], seed, tok, tgt, g2);
        size_t first = 0, diff = synth_count_diff(g, g2, n, &first);
        T_CHECK(diff == 0, "%s: %zu of %zu gradients differ between two identical runs; first at %zu: %.9g vs %.9g",
                name, diff, n, first, diff ? g[first] : 0.0, diff ? g2[first] : 0.0);
    }

    double host[BF16_STEPS], cuda[BF16_STEPS], acts16[BF16_STEPS];
    train(STRATA_BACKEND_HOST, STRATA_DTYPE_FP32, GPT_ACTS_FP32, seed, BF16_STEPS, tok, tgt, host);
    train(STRATA_BACKEND_CUDA, STRATA_DTYPE_BF16, GPT_ACTS_FP32, seed, STEPS, tok, tgt, cuda);
    train(STRATA_BACKEND_CUDA, STRATA_DTYPE_BF16, GPT_ACTS_BF16, seed, BF16_STEPS, tok, tgt, acts16);
    for (int s = 0; s < BF16_STEPS; s++) {
        if (s < STEPS) {
            printf("step %2d: loss host fp32 %.5f, cuda bf16 params %.5f, cuda bf16 activations %.5f\n", s, host[s],
                   cuda[s], acts16[s]);
            T_CHECK(fabs(host[s] - cuda[s]) < 3e-2, "step %d: cuda bf16 loss %.5f vs host fp32 %.5f", s, cuda[s],
                    host[s]);
        } else {
            printf("step %2d: loss host fp32 %.5f, cuda bf16 activations %.5f\n", s, host[s], acts16[s]);
        }
        /* bf16 activations round every activation to 8 bits of mantissa; over 20 steps the losses may part by a
         * few hundredths, as torch.autocast's do from fp32 training. */
        T_CHECK(fabs(host[s] - acts16[s]) < 5e-2, "step %d: cuda bf16-activation loss %.5f vs host fp32 %.5f", s,
                acts16[s], host[s]);
    }
    T_CHECK(cuda[STEPS - 1] < cuda[0], "cuda: the loss did not fall (%.5f -> %.5f)", cuda[0], cuda[STEPS - 1]);
    T_CHECK(acts16[BF16_STEPS - 1] < acts16[0] - 0.1, "cuda bf16 activations: the loss did not fall (%.5f -> %.5f)",
            acts16[0], acts16[BF16_STEPS - 1]);

    free(g);
    free(g2);
    free(ref);
    return t_done();
}
