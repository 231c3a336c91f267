/*
 * The layer-wise schedule (gpt_model_pass, `strata train --schedule layerwise`) against the ordinary one: k
 * micro-batches run through each module together must hand the engine the same gradient contributions in the same
 * order, so after a few optimizer steps the master weights are bit-identical and so are the losses -- with fp32 and
 * bf16 parameters on the device tier, and with parameters, optimizer state and the gradient store on NVMe under a
 * device budget that forces refetches, where the layer-wise schedule reads the drive less. It fetches every module
 * k times less often: once forward, once for the head and once backward per step. Without an engine, on flat host
 * arrays, one pass gives the gradients of k single micro-batch steps bit for bit. A pass of more micro-batches than
 * the model was prepared for is refused.
 */
#include <stdlib.h>
#include <string.h>

#include "model/gpt_engine.h"
#include "synth.h"
#include "testlib.h"

static const gpt_dims dims = {.layers = 2, .heads = 2, .hidden = 32, .vocab = 256, .seq = 16};
enum { B = 2, T = 16, N = B * T, STEPS = 3, MAX_K = 4 };

typedef struct placement {
    const char *name;
    strata_dtype dtype;
    bool nvme;
} placement;

static const placement placements[] = {
    {"device fp32", STRATA_DTYPE_FP32, false},
    {"device bf16", STRATA_DTYPE_BF16, false},
    {"nvme fp32", STRATA_DTYPE_FP32, true},
};

/* A schedule that holds `held` micro-batches at once reserves their activations; on NVMe the engine gets the same
 * room beside them under either schedule. */
static strata_config config(const placement *p, int held)
{
    strata_config c;
    strata_config_init(&c);
    c.backend = STRATA_BACKEND_HOST;
    c.param_dtype = p->dtype;
    c.device_budget_bytes = 64u << 20;
    c.host_budget_bytes = 256u << 20;
    c.cpu_threads = 2;
    c.activation_bytes = gpt_engine_activation_bytes(&dims, B, T, held, GPT_ACT_KEEP, GPT_ACTS_FP32, p->dtype);
    if (p->nvme) {
        /* Parameters, optimizer state and the gradient store on the drive, no host cache: every miss reads it. */
        synth_use_nvme(&c, t_scratch_dir("model_layerwise"), true, true);
        c.zero_stage = 3;
        /* Room for a few modules with their gradients, not for the whole model's: modules are dropped and fetched
         * again from NVMe. */
        c.prefetch_bytes = 1;
        c.device_budget_bytes = c.activation_bytes + 4 * gpt_module_numel(&dims, 0) * 4 + (64u << 10);
    }
    return c;
}

typedef struct outcome {
    float *weights;
    double losses[STEPS];
    uint64_t fetches, nvme_read_bytes;
} outcome;

/* STEPS optimizer steps of k micro-batches each: one at a time (ordinary) or all k in one pass (layer-wise). */
static outcome train(const placement *p, int k, bool layerwise, uint64_t seed, const int32_t *tok, const int32_t *tgt)
{
    strata_config c = config(p, layerwise ? k : 1);
    strata_engine *e = NULL;
    gpt_model *m = NULL;
    outcome o = {.weights = calloc(gpt_numel(&dims), sizeof(float))};
    strata_stats before, after;
    double l[MAX_K + 1];
    T_OK(strata_engine_create(&c, &e));
    T_OK(gpt_model_register(e, &dims, seed, &m));
    T_OK(strata_engine_finalize(e));
    T_OK(gpt_model_prepare(m, B, T, layerwise ? k : 1, GPT_ACT_KEEP, p->dtype));
    T_OK(strata_stats_get(e, &before));
    for (int s = 0; s < STEPS; s++) {
        const int32_t *tk = tok + (size_t)s * k * N, *tg = tgt + (size_t)s * k * N;
        if (layerwise)
            T_CHECK(gpt_model_pass(m, k, tk, tg, true, 1.0f / (float)k, l) == STRATA_OK, "%s: pass: %s", p->name,
                    strata_last_error(e));
        for (int j = 0; !layerwise && j < k; j++)
            T_CHECK(gpt_model_micro_step(m, tk + j * N, tg + j * N, true, 1.0f / (float)k, &l[j]) == STRATA_OK,
                    "%s: micro step: %s", p->name, strata_last_error(e));
        for (int j = 0; j < k; j++)
            o.losses[s] += l[j] / k;
        T_OK(strata_step(e, NULL, NULL));
    }
    T_OK(gpt_model_read_weights(m, o.weights));
    T_OK(strata_stats_get(e, &after));
    o.fetches = after.fetches - before.fetches;
    o.nvme_read_bytes = after.nvme_to_host_bytes - before.nvme_to_host_bytes;
    /* More micro-batches than the activations were prepared for. */
    T_STATUS(gpt_model_pass(m, layerwise ? k + 1 : 2, tok, tgt, true, 1.0f, l), STRATA_EINVAL);
    gpt_model_destroy(m);
    strata_engine_destroy(e);
    return o;
}

static void compare_engine(const placement *p, int k, uint64_t seed, const int32_t *tok, const int32_t *tgt)
{
    outcome ord = train(p, k, false, seed, tok, tgt), lw = train(p, k, true, seed, tok, tgt);
    size_t n = gpt_numel(&dims), first;
    size_t diff = synth_count_diff(ord.weights, lw.weights, n, &first);
    T_CHECK(diff == 0, "%s: %zu of %zu weights differ; first at %zu: ordinary %.9g, layerwise %.9g", p->name, diff, n,
            first, first < n ? ord.weights[first] : 0.0, first < n ? lw.weights[first] : 0.0);
    for (int s = 0; s < STEPS; s++)
        T_CHECK(memcmp(&ord.losses[s], &lw.losses[s], sizeof(double)) == 0,
                "%s: step %d loss: ordinary %.17g, layerwise %.17g", p->name, s, ord.losses[s], lw.losses[s]);
    /* Forward 0..L+1, the head (the embeddings again), backward L+1..0: 2 (L + 2) + 1 fetches a pass. */
    uint64_t per_pass = 2 * (uint64_t)(dims.layers + 2) + 1;
    T_CHECK(lw.fetches == STEPS * per_pass, "%s: layerwise fetched %llu times in %d steps, expected %llu", p->name,
            (unsigned long long)lw.fetches, STEPS, (unsigned long long)(STEPS * per_pass));
    T_CHECK(ord.fetches == (uint64_t)k * lw.fetches, "%s: ordinary fetched %llu times, expected k = %d times the "
            "layerwise %llu", p->name, (unsigned long long)ord.fetches, k, (unsigned long long)lw.fetches);
    if (p->nvme) {
        T_CHECK(lw.nvme_read_bytes > 0, "%s: the layerwise run read nothing from NVMe", p->name);
        T_CHECK(lw.nvme_read_bytes < ord.nvme_read_bytes, "%s: NVMe reads: layerwise %llu B, not fewer than the "
                "ordinary %llu B", p->name, (unsigned long long)lw.nvme_read_bytes,
                (unsigned long long)ord.nvme_read_bytes);
    }
    printf("%-12s k=%d: %zu of %zu weights differ; last loss %.6f vs %.6f; fetches %llu vs %llu; NVMe read %llu vs "
           "%llu B (ordinary vs layerwise)\n", p->name, k, diff, n, ord.losses[STEPS - 1], lw.losses[STEPS - 1],
           (unsigned long long)ord.fetches, (unsigned long long)lw.fetches, (unsigned long long)ord.nvme_read_bytes,
           (unsigned long long)lw.nvme_read_bytes);
    free(ord.weights);
    free(lw.weights);
}

/* The pass itself, without an engine: flat host arrays accumulate what one pass of k hands over and what k
 * gpt_net_step calls hand over. */
static void compare_flat(int k, uint64_t seed, const int32_t *tok, const int32_t *tgt)
{
    gpt_flat *ord = NULL, *lw = NULL;
    T_OK(gpt_flat_create(&dims, seed, &ord));
    T_OK(gpt_flat_create(&dims, seed, &lw));
    size_t one = gpt_activation_bytes(&dims, B, T, GPT_ACT_KEEP, GPT_ACTS_FP32);
    gpt_pass_size size = gpt_pass_bytes(&dims, B, T, k, GPT_ACT_KEEP, GPT_ACTS_FP32);
    void *mem_one = malloc(one), *mem_k = aligned_alloc(4096, size.total);
    gpt_net *net = NULL;
    gpt_pass *pass = NULL;
    T_OK(gpt_net_create(&dims, B, T, GPT_ACT_KEEP, NULL, gpt_ops_host(), mem_one, one, &net));
    T_OK(gpt_pass_create(&dims, B, T, k, GPT_ACT_KEEP, NULL, gpt_ops_host(), mem_k, size.total, &pass));
    T_STATUS(gpt_pass_create(&dims, B, T, k, GPT_ACT_KEEP, NULL, gpt_ops_host(), mem_k, size.total - 1, &(gpt_pass *){NULL}),
             STRATA_EINVAL);
    gpt_source src_ord = gpt_flat_source(ord), src_lw = gpt_flat_source(lw);
    double l_ord[MAX_K], l_lw[MAX_K];
    for (int j = 0; j < k; j++)
        T_OK(gpt_net_step(net, &src_ord, tok + j * N, tgt + j * N, true, 1.0f / (float)k, &l_ord[j]));
    T_OK(gpt_pass_step(pass, k, &src_lw, tok, tgt, true, 1.0f / (float)k, l_lw));
    size_t n = gpt_numel(&dims), first;
    size_t diff = synth_count_diff(ord->grads, lw->grads, n, &first);
    T_CHECK(diff == 0, "flat: %zu of %zu gradients differ; first at %zu: ordinary %.9g, layerwise %.9g", diff, n,
            first, first < n ? ord->grads[first] : 0.0, first < n ? lw->grads[first] : 0.0);
    for (int j = 0; j < k; j++)
        T_CHECK(l_ord[j] == l_lw[j], "flat: micro-batch %d loss: ordinary %.17g, layerwise %.17g", j, l_ord[j],
                l_lw[j]);
    printf("flat         k=%d: %zu of %zu gradients differ\n", k, diff, n);
    gpt_pass_destroy(pass);
    gpt_net_destroy(net);
    free(mem_one);
    free(mem_k);
    gpt_flat_destroy(ord);
    gpt_flat_destroy(lw);
}

int main(void)
{
    uint64_t seed = t_rand_u64();
    int k = 3 + (int)(t_rand_u64() % 2); /* 3 or 4 micro-batches per step */
    int32_t *tok = malloc(sizeof(int32_t) * STEPS * MAX_K * N), *tgt = malloc(sizeof(int32_t) * STEPS * MAX_K * N);
    synth_rand_tokens(tok, tgt, (size_t)STEPS * MAX_K * N);
    compare_flat(k, seed, tok, tgt);
    for (size_t i = 0; i < sizeof placements / sizeof placements[0]; i++)
        compare_engine(&placements[i], k, seed, tok, tgt);
    free(tok);
    free(tgt);
    t_scratch_cleanup();
    return t_done();
}
