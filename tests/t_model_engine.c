/*
 * The GPT model driven through a strata engine (fetch / grads_ready / release, activations from
 * strata_device_alloc) must compute exactly what the same network computes on flat host arrays: the same
 * loss and bit-identical gradients in fp32 (both read the same fp32 weights; the engine only moves them),
 * with parameters on the device tier and on NVMe under a device budget that forces refetches. With bf16
 * parameters the gradients match within bf16 rounding. Misuse on the engine path reports the engine's error.
 */
#include <math.h>
#include <stdlib.h>

#include "gpt_runs.h"
#include "synth.h"
#include "testlib.h"

static const gpt_dims dims = {.layers = 2, .heads = 2, .hidden = 32, .vocab = 256, .seq = 16};
enum { B = 2, T = 16, N = B * T };

static strata_config config(strata_dtype dt, bool nvme)
{
    strata_config c;
    strata_config_init(&c);
    c.backend = STRATA_BACKEND_HOST;
    c.param_dtype = dt;
    c.device_budget_bytes = 64u << 20;
    c.host_budget_bytes = 256u << 20;
    c.cpu_threads = 2;
    if (nvme) {
        const char *dir = t_scratch_dir("model_engine");
        synth_offload(&c, STRATA_TIER_NVME, dir, true, true);
        c.zero_stage = 3;
        /* Room for the activations, one block and its gradients: modules are dropped and fetched again. */
        c.activation_bytes = gpt_engine_activation_bytes(&dims, B, T, 1, GPT_ACT_KEEP, GPT_ACTS_FP32, dt);
        c.prefetch_bytes = 1;
        c.device_budget_bytes = c.activation_bytes + 3 * gpt_module_numel(&dims, 0) * 4 + (1u << 20);
    }
    c.activation_bytes = gpt_engine_activation_bytes(&dims, B, T, 1, GPT_ACT_KEEP, GPT_ACTS_FP32, dt);
    return c;
}

/* Loss and gradients (two micro-batches accumulated, scaled by 0.5 each) through the engine. */
static double engine_grads(strata_dtype dt, bool nvme, uint64_t seed, const int32_t *tok, const int32_t *tgt,
                           float *grads)
{
    strata_config c = config(dt, nvme);
    gpt_engine_run r;
    double loss = gpt_engine_grads(nvme ? "nvme" : "device", &c, &dims, B, T, GPT_ACT_KEEP, dt, seed, tok, tgt, 2, 0.5f,
                                   grads, &r);
    /* Misuse: a step while a module is held fails with the engine's message, and the model state stays sane. */
    T_OK(strata_fetch(r.e, 0));
    T_STATUS(strata_step(r.e, NULL, NULL), STRATA_ESTATE);
    T_OK(strata_release(r.e, 0));
    T_OK(strata_step(r.e, NULL, NULL));
    gpt_engine_run_end(&r);
    return loss;
}

int main(void)
{
    uint64_t seed = t_rand_u64();
    size_t n = gpt_numel(&dims);
    int32_t tok[2 * N], tgt[2 * N];
    synth_rand_tokens(tok, tgt, 2 * N);
    /* The oracle: the same network on flat arrays. */
    float *ref = malloc(n * sizeof(float)), *g = malloc(n * sizeof(float));
    double ref_loss = gpt_ref_grads(&dims, B, T, GPT_ACT_KEEP, seed, tok, tgt, 2, 0.5f, ref);

    for (int nvme = 0; nvme < 2; nvme++) {
        double loss = engine_grads(STRATA_DTYPE_FP32, nvme, seed, tok, tgt, g);
        T_CHECK(loss == ref_loss, "%s: engine loss %.9f != flat loss %.9f", nvme ? "nvme" : "device", loss, ref_loss);
        size_t first, diff = synth_count_diff(g, ref, n, &first);
        T_CHECK(diff == 0, "%s: %zu of %zu gradients differ; first at %zu: %.9g vs %.9g", nvme ? "nvme" : "device",
                diff, n, first, first < n ? g[first] : 0.0, first < n ? ref[first] : 0.0);
        printf("fp32 %-6s loss %.6f; %zu of %zu gradients differ from the flat network\n", nvme ? "nvme" : "device",
               loss, diff, n);
    }

    /* bf16 parameters: the weights are rounded to bf16 and the gradients to bf16 on the way to strata. */
    double loss = engine_grads(STRATA_DTYPE_BF16, false, seed, tok, tgt, g);
    double dot = 0, na = 0, nb = 0;
    for (size_t i = 0; i < n; i++) {
        dot += (double)g[i] * ref[i];
        na += (double)g[i] * g[i];
        nb += (double)ref[i] * ref[i];
    }
    double cosine = dot / sqrt(na * nb);
    printf("bf16 loss %.6f vs fp32 %.6f; gradient cosine similarity %.6f\n", loss, ref_loss, cosine);
    T_CHECK(fabs(loss - ref_loss) < 1e-2, "bf16 loss %.6f too far from fp32 %.6f", loss, ref_loss);
    T_CHECK(cosine > 0.99, "bf16 gradient cosine similarity %.6f <= 0.99", cosine);

    free(g);
    free(ref);
    t_scratch_cleanup();
    return t_done();
}
