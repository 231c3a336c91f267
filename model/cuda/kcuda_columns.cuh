/*
 * The column sums of the CUDA model, shared by the fp32 and bf16 kernels (gpt_kernels.cu, gpt_kernels_bf16.cu):
 * LayerNorm's weight and bias gradients and a linear layer's bias gradient. A (32, 32) block owns 32 channels; thread
 * (x, y) sums rows y, y + 32, ... of channel x in fp32, then the 32 partial sums fold in a fixed tree, so the order
 * depends on N and C only. The inputs are fp32 or bf16 (E); the sums add into fp32.
 */
#ifndef STRATA_MODEL_CUDA_KCUDA_COLUMNS_CUH
#define STRATA_MODEL_CUDA_KCUDA_COLUMNS_CUH

#include "model/cuda/kcuda_reduce.cuh"

/* dw[c] += sum_n dout[n, c] * (inp[n, c] - mean[n]) * rstd[n]; db[c] += sum_n dout[n, c]. */
template <typename E>
static __global__ void layernorm_dwdb_kernel(float *__restrict__ dw, float *__restrict__ db, const E *__restrict__ dout,
                                             const E *__restrict__ inp, const float *__restrict__ mean,
                                             const float *__restrict__ rstd, int N, int C)
{
    __shared__ float sw[COL_TILE][COL_TILE], sb[COL_TILE][COL_TILE];
    int c = blockIdx.x * COL_TILE + threadIdx.x;
    float pw = 0.0f, pb = 0.0f;
    if (c < C)
        for (int n = threadIdx.y; n < N; n += COL_TILE) {
            size_t at = (size_t)n * C + c;
            float g = elem_load(dout, at);
            pw += g * (elem_load(inp, at) - mean[n]) * rstd[n];
            pb += g;
        }
    sw[threadIdx.y][threadIdx.x] = pw;
    sb[threadIdx.y][threadIdx.x] = pb;
    column_tree(sw);
    column_tree(sb);
    if (threadIdx.y == 0 && c < C) {
        dw[c] += sw[0][threadIdx.x];
        db[c] += sb[0][threadIdx.x];
    }
}

/* dst[c] += sum_n src[n, c]. */
template <typename E>
static __global__ void colsum_add_kernel(float *__restrict__ dst, const E *__restrict__ src, int N, int C)
{
    __shared__ float s[COL_TILE][COL_TILE];
    int c = blockIdx.x * COL_TILE + threadIdx.x;
    float p = 0.0f;
    if (c < C)
        for (int n = threadIdx.y; n < N; n += COL_TILE)
            p += elem_load(src, (size_t)n * C + c);
    s[threadIdx.y][threadIdx.x] = p;
    column_tree(s);
    if (threadIdx.y == 0 && c < C)
        dst[c] += s[0][threadIdx.x];
}

#endif
