/*
 * The CUDA kernels of the GPT model that are not matrix products (those go to cuBLAS in gpt_ops_cuda.c).
 * Each launcher queues its kernels on stream and returns cudaGetLastError() of the first launch that
 * failed (cudaSuccess when nothing needed launching). Pointers are device memory, row-major, fp32 unless
 * the name says otherwise; the semantics are those of the host kernels in model/gpt_kernels.c.
 *
 * No kernel uses atomics: every sum runs in an order fixed by the shapes alone, so two runs of the same
 * step give the same bits.
 */
#ifndef STRATA_MODEL_CUDA_GPT_KERNELS_CUDA_H
#define STRATA_MODEL_CUDA_GPT_KERNELS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out[n] = wte[tok[n]] + wpe[n % T]. */
cudaError_t kcuda_embed_forward(float *out, const int32_t *tok, const float *wte, const float *wpe, int N, int T,
                                int C, cudaStream_t stream);
/* dwte[tok[n]] += dout[n] and dwpe[n % T] += dout[n], each row of wte and wpe summed in increasing n: the host's
 * order, so the host's bits. The rows are grouped by token on the device (kcuda_embed_backward_grouped in
 * embed_backward.h, which this calls with KCUDA_F32): one block per distinct token and 256 channels, no atomics,
 * no host sync. */
cudaError_t kcuda_embed_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tok, int N, int T, int C,
                                 cudaStream_t stream);

/* One warp per row; eps 1e-5, biased variance, two passes. */
cudaError_t kcuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                    const float *b, int N, int C, cudaStream_t stream);
/* dinp += (one warp per row); dw, db += column sums (fixed-shape tree per channel). */
cudaError_t kcuda_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                     const float *w, const float *mean, const float *rstd, int N, int C,
                                     cudaStream_t stream);

/* out[n, o] += bias[o] for an N x OC out. */
cudaError_t kcuda_add_bias(float *out, const float *bias, int N, int OC, cudaStream_t stream);
/* dst[c] += sum over rows n of src[n, c] for an N x C src. */
cudaError_t kcuda_colsum_add(float *dst, const float *src, int N, int C, cudaStream_t stream);

/* rows rows of T (row r is query position r % T): softmax of entries 0..t, zero after. In place. */
cudaError_t kcuda_causal_softmax(float *att, int rows, int T, cudaStream_t stream);
/* da = a * (da - sum_{j<=t} a[j] da[j]) for entries 0..t, zero after. In place on da. */
cudaError_t kcuda_causal_softmax_backward(float *da, const float *att, int rows, int T, cudaStream_t stream);

cudaError_t kcuda_gelu_forward(float *out, const float *inp, size_t n, cudaStream_t stream);
/* d *= gelu'(inp), in place. */
cudaError_t kcuda_gelu_backward(float *d, const float *inp, size_t n, cudaStream_t stream);
cudaError_t kcuda_residual_forward(float *out, const float *a, const float *b, size_t n, cudaStream_t stream);

/* One block per row of logits (rows x V): row_loss[r] = log(sum exp(l - max)) - (l[target] - max); with
 * with_grad, the row becomes scale * softmax with scale subtracted at the target. A target outside
 * [0, V) gives a NaN loss (and no subtraction) instead of a read out of bounds. */
cudaError_t kcuda_cross_entropy(float *logits, double *row_loss, const int32_t *targets, int rows, int V, float scale,
                                int with_grad, cudaStream_t stream);

/* Conversions; to bf16 / fp16 round to nearest even and keep NaN a NaN. */
cudaError_t kcuda_bf16_to_f32(float *dst, const void *src, size_t n, cudaStream_t stream);
cudaError_t kcuda_f16_to_f32(float *dst, const void *src, size_t n, cudaStream_t stream);
cudaError_t kcuda_f32_to_bf16(void *dst, const float *src, size_t n, cudaStream_t stream);
cudaError_t kcuda_f32_to_f16(void *dst, const float *src, size_t n, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
