/*
 * The embeddings' backward on CUDA, deterministic and parallel: the rows of the micro-batch are grouped by token on
 * the device, and each distinct token's wte row is owned by one block that adds that token's rows of dout in
 * increasing row order, channel by channel. No atomics, no host round trip, and the order of every sum is the host
 * kernel's (k_embed_backward), so with fp32 dout the result is the host's bit for bit.
 */
#ifndef STRATA_MODEL_CUDA_EMBED_BACKWARD_H
#define STRATA_MODEL_CUDA_EMBED_BACKWARD_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "model/cuda/kcuda_elem.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dwte[v] (fp32, V x C) += the sum of dout's rows n with tok[n] == v, in increasing n; dwpe[t] (fp32, T x C) += the
 * sum of rows n with n % T == t, in increasing n. dout is N x C of elem; every tok[n] must lie in [0, V) (not checked:
 * V is not passed). Queues two kernels on stream and returns the first launch failure; cudaSuccess with nothing queued
 * when N or C < 1; cudaErrorInvalidValue, nothing queued, for T < 1 or an elem it does not know. */
cudaError_t kcuda_embed_backward_grouped(float *dwte, float *dwpe, const void *dout, kcuda_elem elem,
                                         const int32_t *tok, int N, int T, int C, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
