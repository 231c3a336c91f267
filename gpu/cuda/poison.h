/*
 * A CUDA kernel the C backend launches: fills device memory with a 32-bit word. The CUDA backend
 * uses it to poison freed arena blocks with NaN (cudaMemset only writes bytes, and no byte repeated
 * four times is a NaN the engine would notice as easily).
 */
#ifndef STRATA_GPU_CUDA_POISON_H
#define STRATA_GPU_CUDA_POISON_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Queues the fill of bytes / 4 words at ptr (4-byte aligned) on stream; returns the launch's error. */
cudaError_t cuda_fill_u32(void *ptr, size_t bytes, uint32_t word, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
