/* The 32-bit fill kernel (see poison.h). */
#include "gpu/cuda/poison.h"

/* A grid-stride loop: a fixed grid covers any size, so huge blocks need no launch arithmetic. */
static __global__ void fill_u32_kernel(uint32_t *p, size_t n, uint32_t word)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        p[i] = word;
}

extern "C" cudaError_t cuda_fill_u32(void *ptr, size_t bytes, uint32_t word, cudaStream_t stream)
{
    size_t n = bytes / sizeof(uint32_t);
    if (n == 0)
        return cudaSuccess;
    const unsigned threads = 256;
    size_t want = (n + threads - 1) / threads;
    unsigned blocks = want < 4096 ? (unsigned)want : 4096u;
    fill_u32_kernel<<<blocks, threads, 0, stream>>>((uint32_t *)ptr, n, word);
    return cudaGetLastError();
}
