/*
 * The kernels the GPT network runs, as a table: one implementation per device backend. The network (gpt_net.c) is
 * written once against this table; gpt_ops_host.c runs it on the host (OpenBLAS + OpenMP, fp32), model/cuda/ runs it on
 * a CUDA stream (cuBLAS with bf16 tensor-core math and fp32 accumulation, fp32 activations, parameters and gradients
 * stored in the engine's param_dtype).
 *
 * Every pointer except the host_* ones is device memory of the table's backend. Row-major throughout: N rows of C
 * channels. The semantics of each entry are those of the host kernel of the same name in gpt_kernels.h; backward
 * entries add into their outputs unless the comment says "overwritten". The entries queue work and return at once; a
 * failure inside one (a launch, cuBLAS) is kept and returned by the next to_host.
 */
#ifndef STRATA_MODEL_GPT_OPS_H
#define STRATA_MODEL_GPT_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "strata.h"

typedef struct gpt_ops {
    const char *name; /* "host" or "cuda", for messages */
    void *ctx;

    void (*embed_forward)(void *ctx, float *out, const int32_t *tok, const float *wte, const float *wpe, int N, int T,
                          int C);
    void (*embed_backward)(void *ctx, float *dwte, float *dwpe, const float *dout, const int32_t *tok, int N, int T,
                           int C);
    void (*layernorm_forward)(void *ctx, float *out, float *mean, float *rstd, const float *inp, const float *w,
                              const float *b, int N, int C);
    void (*layernorm_backward)(void *ctx, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                               const float *w, const float *mean, const float *rstd, int N, int C);
    void (*linear_forward)(void *ctx, float *out, const float *inp, const float *W, const float *bias, int N, int C,
                           int OC);
    void (*linear_backward)(void *ctx, float *dinp, float *dW, float *dbias, const float *dout, const float *inp,
                            const float *W, int N, int C, int OC);
    /* att is (B, NH, T, T): the probabilities, zero above the diagonal. */
    void (*attention_forward)(void *ctx, float *out, float *att, const float *qkv, int B, int T, int C, int NH);
    /* dqkv is overwritten; scratch holds B * NH * T * T floats. */
    void (*attention_backward)(void *ctx, float *dqkv, float *scratch, const float *dout, const float *qkv,
                               const float *att, int B, int T, int C, int NH);
    void (*gelu_forward)(void *ctx, float *out, const float *inp, size_t n);
    void (*gelu_backward)(void *ctx, float *d, const float *inp, size_t n);
    void (*residual_forward)(void *ctx, float *out, const float *a, const float *b, size_t n);
    /* The tied head and cross-entropy, chunk rows at a time (logits: chunk x V scratch): row_loss[n] (overwritten) is
     * row n's loss; with dx != NULL, dx is overwritten and dwte gets the gradient of scale * sum(row_loss). */
    void (*head_loss)(void *ctx, float *dx, float *dwte, float *logits, double *row_loss, const float *x,
                      const float *wte, const int32_t *targets, int N, int C, int V, int chunk, float scale);

    void (*zero)(void *ctx, float *p, size_t n);
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
/* A CUDA table that queues on stream (a cudaStream_t, e.g. strata_compute_stream()). math picks the matrix products'
 * tensor-core format: BF16 or FP16 (inputs rounded to it, fp32 accumulation), FP32 (full fp32). STRATA_EIO with the
 * reason in *why (a static string) when cuBLAS cannot start. */
strata_status gpt_ops_cuda_create(void *stream, strata_dtype math, gpt_ops **out, const char **why);
void gpt_ops_cuda_destroy(gpt_ops *ops);
#endif

#endif
