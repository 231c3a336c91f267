/*
 * The kernels of the bf16-activation CUDA gpt_ops table that are not matrix products or attention (those are cuBLAS /
 * cuBLASLt in gpt_ops_cuda_bf16.c and attention_flash.h). Activations and weights are bf16 (nearest-even rounding,
 * NaN stays NaN); every sum accumulates in fp32, LayerNorm statistics and parameter gradients are fp32, row losses
 * double. The formulas are those of the host kernels in model/gpt_kernels.c, evaluated in fp32 on the bf16 inputs and
 * rounded once on output. Buffers need no alignment (bf16's 2 bytes): a kernel moves 16 bytes at a time where the
 * pointers and the row length allow it, and the order of its sums does not depend on which way it went. Each launcher
 * queues on stream and returns the first launch failure (cudaSuccess when nothing needed launching). No atomics: every
 * sum runs in an order fixed by the shapes, so results are reproducible bit for bit.
 */
#ifndef STRATA_MODEL_CUDA_GPT_KERNELS_BF16_H
#define STRATA_MODEL_CUDA_GPT_KERNELS_BF16_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out[n] (N x C) = wte[tok[n]] + wpe[n % T]; cudaErrorInvalidValue (nothing queued) for T < 1. */
cudaError_t kbf16_embed_forward(void *out, const int32_t *tok, const void *wte, const void *wpe, int N, int T, int C,
                                cudaStream_t stream);

/* One warp per row; the mean, then the biased variance about it (two passes), eps 1e-5; mean and rstd (N floats)
 * overwritten. out must not overlap inp. */
cudaError_t kbf16_layernorm_forward(void *out, float *mean, float *rstd, const void *inp, const void *w, const void *b,
                                    int N, int C, cudaStream_t stream);
/* dinp += the input gradient (read as bf16, added in fp32, rounded once; one warp per row); dw, db (fp32, C) += their
 * column sums in a fixed order (a block per 32 channels). dinp must not overlap dout or inp. */
cudaError_t kbf16_layernorm_backward(void *dinp, float *dw, float *db, const void *dout, const void *inp,
                                     const void *w, const float *mean, const float *rstd, int N, int C,
                                     cudaStream_t stream);

/* out[n, o] += bias[o] for an N x OC out (the fallback when the product's bias epilogue is not used). */
cudaError_t kbf16_add_bias(void *out, const void *bias, int N, int OC, cudaStream_t stream);
/* dst[c] (fp32) += sum over rows n of src[n, c] (bf16, N x C), in a fixed order. */
cudaError_t kbf16_colsum_add(float *dst, const void *src, int N, int C, cudaStream_t stream);

/* GELU, tanh approximation (GPT-2's). out and inp may be the same buffer. */
cudaError_t kbf16_gelu_forward(void *out, const void *inp, size_t n, cudaStream_t stream);
/* d *= gelu'(inp), in place. */
cudaError_t kbf16_gelu_backward(void *d, const void *inp, size_t n, cudaStream_t stream);
/* out = a + b; out may be a or b. */
cudaError_t kbf16_residual_forward(void *out, const void *a, const void *b, size_t n, cudaStream_t stream);

/* The fused classifier over rows rows of bf16 logits with row stride ld >= V (the head's vocabulary padded for the
 * products): one block per row computes the softmax statistics in fp32 (it reads the row three times: the max, the
 * sum of exponentials, the gradient), row_loss[r] = log(sum exp(l - max)) -
 * (l[target] - max) (double) and, with with_grad, overwrites the row's first V entries with
 * bf16(scale * (softmax - onehot(target))) and the padding columns V..ld-1 with 0, so the products that read the
 * gradient may span ld columns. Never an fp32 copy of the logits. A target outside [0, V) gives a NaN loss and no
 * subtraction. The padding columns are never read into the statistics; without with_grad the logits are left
 * untouched. cudaErrorInvalidValue (nothing queued) for ld < V. */
cudaError_t kbf16_classifier(void *logits, double *row_loss, const int32_t *targets, int rows, int V, int ld,
                             float scale, int with_grad, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
