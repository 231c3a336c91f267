/*
 * The kernels the GPT network runs, as a table: one implementation per device backend. The network (gpt_net.c) is
 * written once against this table; gpt_ops_host.c runs it on the host (OpenBLAS + OpenMP, fp32), model/cuda/ runs it on
 * a CUDA stream in one of two activation formats (gpt_act_format): fp32 activations with cuBLAS products in the
 * engine's tensor-core math, or bf16 activations end to end (bf16 products with fp32 accumulation, flash attention,
 * the fused classifier).
 *
 * Every pointer except the host_* ones is device memory of the table's backend. Row-major throughout: N rows of C
 * channels. The element type of a pointer follows its role:
 *   - activations and their gradients (void *): the table's act format, fp32 or bf16;
 *   - weights (const void *): fp32 with GPT_ACTS_FP32, bf16 with GPT_ACTS_BF16 (the table's weight dtype);
 *   - parameter gradients, LayerNorm statistics, attention state and scratch (float *): always fp32;
 *   - row losses: double.
 * The semantics of each entry are those of the host kernel of the same name in gpt_kernels.h; backward entries add
 * into their outputs unless the comment says "overwritten". The entries queue work and return at once; a failure
 * inside one (a launch, cuBLAS) is kept and returned by the next to_host.
 */
#ifndef STRATA_MODEL_GPT_OPS_H
#define STRATA_MODEL_GPT_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "strata.h"

/* What a table's activations are, which fixes the network's memory layout (gpt_activation_bytes). */
typedef enum gpt_act_format {
    GPT_ACTS_FP32 = 0, /* fp32 activations and weights; attention keeps its (B, NH, T, T) probabilities */
    GPT_ACTS_BF16, /* bf16 activations and weights; attention keeps each row's log-sum-exp, (B, NH, T) */
} gpt_act_format;

static inline const char *gpt_act_format_name(gpt_act_format f)
{
    return f == GPT_ACTS_BF16 ? "bf16" : "fp32";
}

/* Bytes of one activation element. */
static inline size_t gpt_act_bytes(gpt_act_format f)
{
    return f == GPT_ACTS_BF16 ? 2 : 4;
}

/* The weights' dtype a table of format f reads. */
static inline strata_dtype gpt_act_weight_dtype(gpt_act_format f)
{
    return f == GPT_ACTS_BF16 ? STRATA_DTYPE_BF16 : STRATA_DTYPE_FP32;
}

/* Floats of attention state per (batch row, head, query): the T probabilities, or the one log-sum-exp. */
static inline size_t gpt_attention_state_floats(gpt_act_format f, size_t T)
{
    return f == GPT_ACTS_BF16 ? 1 : T;
}

/* The row stride of the head's logits for a vocabulary of V: bf16 products want every row 16-byte aligned and the
 * vocabulary a multiple of the tensor cores' tiles, so it is padded to a multiple of 128 (the loss is unchanged). */
static inline int gpt_logits_ld(gpt_act_format f, int V)
{
    return f == GPT_ACTS_BF16 ? (V + 127) / 128 * 128 : V;
}

/* Device memory a table of format f works in besides the network's activations, which its creator provides (so that
 * it lies inside the engine's device budget): cuBLASLt's workspace for the bf16 products (32 MiB, NVIDIA's advice for
 * Hopper). */
static inline size_t gpt_ops_workspace_bytes(gpt_act_format f)
{
    return f == GPT_ACTS_BF16 ? (size_t)32 << 20 : 0;
}

/* The head's products are made GPT_HEAD_PIECE vocabulary rows at a time, tiled or not: OpenBLAS gives a column of a
 * product other bits when the product's other columns change (its kernels for a block's last columns add in
 * another order), so a tile of whole pieces keeps the untiled head's bits only if the untiled head makes the same
 * calls. A multiple of GEMM_ROWS, so the pieces of dwte's product fall on its row pieces too. Vocabulary tiles
 * (gpt_dims.head_rows) are whole pieces. */
#define GPT_HEAD_PIECE 2048

/* The tied head over vocabulary tiles makes three passes over all of them in order (head_tile below): the rows'
 * largest logit, their sum of exponentials and target logit, then the gradient. What a row carries from tile to
 * tile (device memory of the table's backend, fp32 / double whatever the activation format): */
typedef enum gpt_head_pass { GPT_HEAD_MAX, GPT_HEAD_SUM, GPT_HEAD_GRAD } gpt_head_pass;
typedef struct gpt_head_rows {
    float *max;    /* N: the row's largest logit so far */
    double *sum;   /* N: its sum of exp(logit - max) so far, in vocabulary order */
    float *target; /* N: its target's logit - max */
} gpt_head_rows;

typedef struct gpt_ops {
    const char *name; /* "host", "cuda" or "cuda-bf16", for messages */
    gpt_act_format acts;
    void *ctx;

    void (*embed_forward)(void *ctx, void *out, const int32_t *tok, const void *wte, const void *wpe, int N, int T,
                          int C);
    void (*embed_backward)(void *ctx, float *dwte, float *dwpe, const void *dout, const int32_t *tok, int N, int T,
                           int C);
    void (*layernorm_forward)(void *ctx, void *out, float *mean, float *rstd, const void *inp, const void *w,
                              const void *b, int N, int C);
    void (*layernorm_backward)(void *ctx, void *dinp, float *dw, float *db, const void *dout, const void *inp,
                               const void *w, const float *mean, const float *rstd, int N, int C);
    void (*linear_forward)(void *ctx, void *out, const void *inp, const void *W, const void *bias, int N, int C,
                           int OC);
    void (*linear_backward)(void *ctx, void *dinp, float *dW, float *dbias, const void *dout, const void *inp,
                            const void *W, int N, int C, int OC);
    /* state is B * NH * T * gpt_attention_state_floats(acts, T) floats (overwritten): GPT_ACTS_FP32 keeps the
     * probabilities (B, NH, T, T), zero above the diagonal; GPT_ACTS_BF16 each query row's log-sum-exp. */
    void (*attention_forward)(void *ctx, void *out, float *state, const void *qkv, int B, int T, int C, int NH);
    /* dqkv is overwritten; out and state are forward's; scratch holds as many floats as state. */
    void (*attention_backward)(void *ctx, void *dqkv, float *scratch, const void *dout, const void *qkv,
                               const void *out, const float *state, int B, int T, int C, int NH);
    void (*gelu_forward)(void *ctx, void *out, const void *inp, size_t n);
    void (*gelu_backward)(void *ctx, void *d, const void *inp, size_t n);
    void (*residual_forward)(void *ctx, void *out, const void *a, const void *b, size_t n);
    /* The tied head and cross-entropy, chunk rows at a time (logits: chunk x gpt_logits_ld(acts, V) scratch):
     * row_loss[n] (overwritten) is row n's loss; with dx != NULL, dx is overwritten and dwte gets the gradient of
     * scale * sum(row_loss). */
    void (*head_loss)(void *ctx, void *dx, float *dwte, void *logits, double *row_loss, const void *x, const void *wte,
                      const int32_t *targets, int N, int C, int V, int chunk, float scale);

    /* The embeddings and the head with wte in vocabulary tiles (wte, dwte: rows [v0, v1) of the token embedding; v0
     * a multiple of GPT_HEAD_PIECE, v1 one too or V). NULL in a table that computes them only whole (the CUDA ones,
     * for now): gpt_model_prepare refuses a tiled model there. embed_tile_forward writes the rows of out whose token
     * lies in the tile; embed_tile_backward adds those tokens' gradient rows, in row order (embed_backward with dwte
     * NULL gives dwpe); over all the tiles they are embed_forward's and embed_backward's bit for bit. head_tile is
     * one tile's pass (logits: chunk x (v1 - v0) scratch; the first tile's passes start the rows' state; the
     * gradient pass writes dx at v0 = 0 and adds after, and adds into dwte); head_rows_loss then writes row_loss.
     * Over the three passes they give head_loss's losses, dx and dwte bit for bit. */
    void (*embed_tile_forward)(void *ctx, void *out, const int32_t *tok, const void *wte, const void *wpe, int N,
                               int T, int C, int v0, int v1);
    void (*embed_tile_backward)(void *ctx, float *dwte, const void *dout, const int32_t *tok, int N, int C, int v0,
                                int v1);
    void (*head_tile)(void *ctx, gpt_head_pass pass, gpt_head_rows *rows, void *dx, float *dwte, void *logits,
                      const void *x, const void *wte, const int32_t *targets, int N, int C, int v0, int v1, int chunk,
                      float scale);
    void (*head_rows_loss)(void *ctx, const gpt_head_rows *rows, double *row_loss, int N);

    /* out = a + b on fp32 parameter gradients (whatever the activation format). */
    void (*add_f32)(void *ctx, float *out, const float *a, const float *b, size_t n);
    void (*zero)(void *ctx, void *p, size_t bytes);
    /* fp32 <-> param_dtype (FP32, BF16 or FP16); to param_dtype rounds to nearest even, NaN stays NaN. */
    void (*to_f32)(void *ctx, float *dst, const void *src, size_t n, strata_dtype dtype);
    void (*from_f32)(void *ctx, void *dst, const float *src, size_t n, strata_dtype dtype);
    /* Host <-> device copies: upload queues (host_src may be reused when it returns); to_host waits for everything
     * queued so far and returns the first failure since the last to_host (STRATA_EIO; error() says what failed). */
    void (*upload)(void *ctx, void *dst, const void *host_src, size_t bytes);
    strata_status (*to_host)(void *ctx, void *host_dst, const void *src, size_t bytes);
    /* What the failure to_host last reported was ("cublasGemmEx (linear_forward): CUBLAS_STATUS_..."), or "". */
    const char *(*error)(void *ctx);
} gpt_ops;

/* The host table (stateless; always available). */
const gpt_ops *gpt_ops_host(void);

#ifdef STRATA_MODEL_CUDA
/* A CUDA table that queues on stream (a cudaStream_t, e.g. strata_compute_stream()) in activation format acts.
 * GPT_ACTS_FP32: math picks the matrix products' tensor-core format: BF16 or FP16 (inputs rounded to it, fp32
 * accumulation), FP32 (full fp32). GPT_ACTS_BF16: math must be BF16. workspace is gpt_ops_workspace_bytes(acts) of
 * device memory (NULL for 0) that the table uses until it is destroyed; the caller frees it after. STRATA_EINVAL /
 * STRATA_EIO with the reason in *why (a static string) when the combination is refused or cuBLAS cannot start. */
strata_status gpt_ops_cuda_create(void *stream, gpt_act_format acts, strata_dtype math, void *workspace, gpt_ops **out,
                                  const char **why);
void gpt_ops_cuda_destroy(gpt_ops *ops);
#endif

#endif
