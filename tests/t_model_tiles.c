/*
 * The GPT model with its token embedding in vocabulary tiles (gpt_dims.head_rows: each tile a module of its own,
 * fetched for the embeddings' forward, three times for the head's passes and once after the embeddings' backward)
 * computes what the whole embedding computes: the same loss and the same gradients bit for bit, on flat arrays and
 * through a strata engine (fp32 and bf16 parameters, parameters and optimizer on NVMe), with activations kept,
 * checkpointed and offloaded, for tiles that divide the vocabulary and a last tile of the rest. Its activations are
 * smaller (the logits are a tile wide). What cannot work is refused: a tile that is not whole pieces of the head, a
 * pass of several micro-batches, a table without the tiled kernels.
 */
#include <stdlib.h>
#include <string.h>

#include "gpt_runs.h"
#include "model/gpt_pass.h"
#include "synth.h"
#include "testlib.h"

enum { B = 2, T = 16, N = B * T, MICRO = 2 };

static gpt_dims dims_of(int vocab, int head_rows)
{
    return (gpt_dims){.layers = 2, .heads = 2, .hidden = 32, .vocab = vocab, .seq = T, .head_rows = head_rows};
}

static strata_config config(const gpt_dims *d, gpt_act_mode mode, strata_dtype dt, bool nvme)
{
    strata_config c;
    strata_config_init(&c);
    c.backend = STRATA_BACKEND_HOST;
    c.param_dtype = dt;
    c.host_budget_bytes = 256u << 20;
    c.cpu_threads = 2;
    if (nvme) {
        synth_offload(&c, STRATA_TIER_NVME, t_scratch_dir("model_tiles"), true, true);
        c.zero_stage = 3;
        c.prefetch_bytes = 1; /* modules dropped and fetched again */
    }
    if (mode == GPT_ACT_OFFLOAD)
        c.offload_activations = STRATA_TIER_HOST;
    gpt_engine_reserve(d, B, T, 1, mode, &c);
    c.device_budget_bytes = c.activation_bytes + (16u << 20);
    return c;
}

static void same(const char *what, double loss, double ref_loss, const float *g, const float *ref, size_t n)
{
    size_t first, diff = synth_count_diff(g, ref, n, &first);
    T_CHECK(loss == ref_loss && diff == 0,
            "%s: loss %.17g, whole %.17g; %zu of %zu gradients differ, first at %zu: %.9g, whole %.9g", what, loss,
            ref_loss, diff, n, first, first < n ? g[first] : 0.0, first < n ? ref[first] : 0.0);
    printf("%-46s loss %.6f, %zu of %zu gradients differ from the whole embedding's\n", what, loss, diff, n);
}

static void check_vocab(int vocab, int head_rows, uint64_t seed)
{
    gpt_dims whole = dims_of(vocab, 0), tiled = dims_of(vocab, head_rows);
    size_t n = gpt_numel(&whole);
    int32_t tok[MICRO * N], tgt[MICRO * N];
    synth_rand_tokens(tok, tgt, MICRO * N);
    for (int i = 0; i < MICRO * N; i++) /* tokens and targets across the whole vocabulary, its last row too */
        tok[i] = (int32_t)(t_rand_u64() % (uint64_t)vocab), tgt[i] = i % 5 ? (int32_t)(t_rand_u64() % (uint64_t)vocab)
                                                                           : vocab - 1;
    float *ref = malloc(n * sizeof(float)), *g = malloc(n * sizeof(float));
    const gpt_act_mode modes[] = {GPT_ACT_KEEP, GPT_ACT_CHECKPOINT};
    for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++) {
        char what[96];
        double ref_loss = gpt_ref_grads(&whole, B, T, modes[mi], seed, tok, tgt, MICRO, 0.5f, ref);
        double loss = gpt_ref_grads(&tiled, B, T, modes[mi], seed, tok, tgt, MICRO, 0.5f, g);
        snprintf(what, sizeof what, "V %d in %d tiles, flat, %s", vocab, gpt_head_tiles(&tiled),
                 mi ? "checkpointed" : "kept");
        same(what, loss, ref_loss, g, ref, n);
    }

    /* Through the engine: fp32 gives the flat network's bits; bf16 the whole embedding's through the engine. */
    double ref_loss = gpt_ref_grads(&whole, B, T, GPT_ACT_KEEP, seed, tok, tgt, MICRO, 0.5f, ref);
    for (int nvme = 0; nvme < 2; nvme++) {
        gpt_act_mode mode = nvme ? GPT_ACT_OFFLOAD : GPT_ACT_KEEP;
        strata_config c = config(&tiled, mode, STRATA_DTYPE_FP32, nvme);
        gpt_engine_run r;
        double loss = gpt_engine_grads("tiled", &c, &tiled, B, T, mode, STRATA_DTYPE_FP32, seed, tok, tgt, MICRO, 0.5f,
                                       g, &r);
        gpt_engine_run_end(&r);
        char what[96];
        snprintf(what, sizeof what, "V %d, engine fp32%s", vocab, nvme ? ", NVMe, offloaded acts" : "");
        same(what, loss, ref_loss, g, ref, n);
    }
    float *bf_ref = malloc(n * sizeof(float));
    gpt_engine_run r;
    strata_config c = config(&whole, GPT_ACT_KEEP, STRATA_DTYPE_BF16, false);
    double bf_loss = gpt_engine_grads("whole bf16", &c, &whole, B, T, GPT_ACT_KEEP, STRATA_DTYPE_BF16, seed, tok, tgt,
                                      MICRO, 0.5f, bf_ref, &r);
    gpt_engine_run_end(&r);
    c = config(&tiled, GPT_ACT_KEEP, STRATA_DTYPE_BF16, false);
    double loss = gpt_engine_grads("tiled bf16", &c, &tiled, B, T, GPT_ACT_KEEP, STRATA_DTYPE_BF16, seed, tok, tgt,
                                   MICRO, 0.5f, g, &r);
    /* The parameters are the whole embedding's, and its tiles' parts of one tensor. */
    const strata_param_id *parts;
    int nparts = gpt_model_param_parts(r.m, 0, GPT_WTE, &parts);
    T_CHECK(nparts == gpt_head_tiles(&tiled) && gpt_model_param(r.m, 0, GPT_WTE) == STRATA_INVALID_ID,
            "V %d: %d parts of wte for %d tiles", vocab, nparts, gpt_head_tiles(&tiled));
    float *w = malloc(n * sizeof(float)), *w0 = malloc(n * sizeof(float));
    T_OK(gpt_model_read_weights(r.m, w));
    gpt_engine_run_end(&r);
    for (int m = 0, pos = 0; m < gpt_modules(&whole); m++) {
        size_t sizes[GPT_MAX_MODULE_PARAMS];
        int np = gpt_module_param_sizes(&whole, m, sizes);
        for (int k = 0; k < np; pos += (int)sizes[k], k++)
            gpt_init_fill(&whole, seed, m, k, 0, sizes[k], w0 + pos);
    }
    size_t first, diff = synth_count_diff(w, w0, n, &first);
    T_CHECK(diff == 0, "V %d: %zu initial weights of the tiled model differ from the whole one's, first at %zu", vocab,
            diff, first);
    char what[96];
    snprintf(what, sizeof what, "V %d, engine bf16", vocab);
    same(what, loss, bf_loss, g, bf_ref, n);

    size_t keep_whole = gpt_activation_bytes(&whole, B, T, GPT_ACT_KEEP, GPT_ACTS_FP32);
    size_t keep_tiled = gpt_activation_bytes(&tiled, B, T, GPT_ACT_KEEP, GPT_ACTS_FP32);
    T_CHECK(keep_tiled < keep_whole, "V %d: tiled activations %zu B, whole %zu B", vocab, keep_tiled, keep_whole);
    free(ref), free(g), free(bf_ref), free(w), free(w0);
}

static void refusals(void)
{
    gpt_dims bad = dims_of(5000, 1000);
    T_CHECK(gpt_dims_check(&bad) != NULL, "head_rows 1000 (not whole pieces) accepted");
    bad.head_rows = 6144; /* not below the vocabulary */
    T_CHECK(gpt_dims_check(&bad) != NULL, "head_rows 6144 of vocab 5000 accepted");
    gpt_dims tiled = dims_of(5000, GPT_HEAD_PIECE);
    T_CHECK(gpt_dims_check(&tiled) == NULL, "head_rows %d refused: %s", GPT_HEAD_PIECE, gpt_dims_check(&tiled));

    /* A pass of two micro-batches would keep a head gradient of the whole wte. */
    gpt_pass_size size = gpt_pass_bytes(&tiled, B, T, 2, GPT_ACT_KEEP, GPT_ACTS_FP32);
    void *mem = malloc(size.total);
    gpt_pass *p = NULL;
    T_STATUS(gpt_pass_create(&tiled, B, T, 2, GPT_ACT_KEEP, NULL, gpt_ops_host(), mem, size.total, &p), STRATA_EINVAL);
    free(mem);
    strata_config c = config(&tiled, GPT_ACT_KEEP, STRATA_DTYPE_FP32, false);
    gpt_engine_reserve(&tiled, B, T, 2, GPT_ACT_KEEP, &c);
    c.device_budget_bytes = c.activation_bytes + (16u << 20);
    strata_engine *e;
    gpt_model *m;
    T_OK(strata_engine_create(&c, &e));
    T_OK(gpt_model_register(e, &tiled, 1, &m));
    T_OK(strata_engine_finalize(e));
    T_STATUS(gpt_model_prepare(m, B, T, 2, GPT_ACT_KEEP, STRATA_DTYPE_FP32), STRATA_EINVAL);
    T_CHECK(strstr(gpt_model_error(m), "one micro-batch") != NULL, "layerwise refusal says: %s", gpt_model_error(m));
    gpt_model_destroy(m);
    strata_engine_destroy(e);

    /* A table without the tiled kernels (the CUDA ones, for now) cannot make a tiled net. */
    gpt_ops whole_only = *gpt_ops_host();
    whole_only.head_tile = NULL;
    size_t bytes = gpt_activation_bytes(&tiled, B, T, GPT_ACT_KEEP, GPT_ACTS_FP32);
    mem = malloc(bytes);
    gpt_net *net = NULL;
    T_STATUS(gpt_net_create(&tiled, B, T, GPT_ACT_KEEP, NULL, &whole_only, mem, bytes, &net), STRATA_EINVAL);
    free(mem);
}

int main(void)
{
    uint64_t seed = t_rand_u64();
    check_vocab(5000, GPT_HEAD_PIECE, seed);         /* 2048, 2048 and the rest, 904 */
    check_vocab(3 * GPT_HEAD_PIECE, 2 * GPT_HEAD_PIECE, seed); /* two tiles, the second one piece */
    check_vocab(2 * GPT_HEAD_PIECE, GPT_HEAD_PIECE, seed);     /* tiles that divide the vocabulary */
    refusals();
    return t_done();
}
