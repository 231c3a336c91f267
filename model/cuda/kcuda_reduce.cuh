/*
 * What the model's CUDA kernel files share: the launch shapes, the reductions whose order is fixed by the shapes
 * (warp, block and column sums), the bf16 <-> fp32 element access and the GELU formula. Each .cu file that includes it
 * gets its own static copy, so nothing here is a symbol of the library; everything is `static inline` so that a file
 * which uses only part of it compiles without "declared but never referenced" warnings.
 *
 * The reductions never use atomics: a sum's order depends on the launch shape and the data's shape only, so two runs
 * give the same bits (the rule of gpt_kernels_cuda.h and gpt_kernels_bf16.h).
 */
#ifndef STRATA_MODEL_CUDA_KCUDA_REDUCE_CUH
#define STRATA_MODEL_CUDA_KCUDA_REDUCE_CUH

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#define FULL_MASK 0xffffffffu
/* Elementwise kernels use a grid-stride loop over a capped grid, so any n needs no launch arithmetic. */
#define THREADS 256
#define MAX_BLOCKS 8192u
/* Row kernels give each row one warp: a block of THREADS holds ROWS_PER_BLOCK rows. */
#define ROWS_PER_BLOCK (THREADS / 32)
/* Column sums: a block of 32 channels x 32 row phases, folded by a fixed tree. */
#define COL_TILE 32

#define FOR_EACH(i, n)                                                      \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (size_t)gridDim.x * blockDim.x)

/* Returns from the launcher with the launch's error, if it failed. */
#define LAUNCHED()                                    \
    do {                                              \
        cudaError_t launched_e_ = cudaGetLastError(); \
        if (launched_e_ != cudaSuccess)               \
            return launched_e_;                       \
    } while (0)

static inline unsigned grid_for(size_t n)
{
    size_t want = (n + THREADS - 1) / THREADS;
    return want < MAX_BLOCKS ? (unsigned)want : MAX_BLOCKS;
}

static inline unsigned blocks_for_rows(int rows)
{
    return (unsigned)(((size_t)rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
}

static inline unsigned blocks_for_cols(int cols)
{
    return (unsigned)(((size_t)cols + COL_TILE - 1) / COL_TILE);
}

/* ---------------------------------------------------------------- reductions */

/* The xor butterfly leaves the same bits in every lane: each step adds the same two values, commuted. */
static inline __device__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

static inline __device__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

/* Block-wide sum and max for a blockDim.x that is a multiple of 32; every thread gets the result.
 * red holds 32 floats of shared memory; the first barrier lets a previous reduction finish reading it. */
static inline __device__ float block_sum(float v, float *red)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    return warp_sum(lane < warps ? red[lane] : 0.0f);
}

static inline __device__ float block_max(float v, float *red)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    return warp_max(lane < warps ? red[lane] : -INFINITY);
}

/* Folds s[0..31][x] into s[0][x] in a fixed tree; the whole (32, 32) block calls it. */
static inline __device__ void column_tree(float (*s)[COL_TILE])
{
    for (int h = COL_TILE / 2; h > 0; h >>= 1) {
        __syncthreads();
        if ((int)threadIdx.y < h)
            s[threadIdx.y][threadIdx.x] += s[threadIdx.y + h][threadIdx.x];
    }
    __syncthreads();
}

/* ---------------------------------------------------------------- elements */

/* An element of an fp32 or bf16 buffer as fp32 (widening bf16 is exact), and an fp32 value stored as one (bf16:
 * rounded to nearest even, NaN stays NaN). Kernels templated on the element type read and write through these. */
static inline __device__ float elem_load(const float *p, size_t i)
{
    return p[i];
}

static inline __device__ float elem_load(const __nv_bfloat16 *p, size_t i)
{
    return __bfloat162float(p[i]);
}

static inline __device__ void elem_store(float *p, size_t i, float v)
{
    p[i] = v;
}

static inline __device__ void elem_store(__nv_bfloat16 *p, size_t i, float v)
{
    p[i] = __float2bfloat16_rn(v);
}

/* Eight consecutive bf16 (16 bytes) as fp32 and back: the vector loads of the bf16 kernels. p must be 16-byte
 * aligned; element k lives in the low half of word k / 2 when k is even, the high half when odd (little endian). */
#define VEC 8

static inline __device__ void load8(float f[VEC], const __nv_bfloat16 *p)
{
    uint4 u = *(const uint4 *)p;
    unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        f[2 * k] = __uint_as_float(w[k] << 16);
        f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
}

static inline __device__ void store8(__nv_bfloat16 *p, const float f[VEC])
{
    unsigned w[4];
#pragma unroll
    for (int k = 0; k < 4; k++)
        w[k] = (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(f[2 * k])) |
               (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(f[2 * k + 1])) << 16;
    *(uint4 *)p = make_uint4(w[0], w[1], w[2], w[3]);
}

/* Whether p may be read or written VEC bf16 at a time. */
static inline bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

/* ---------------------------------------------------------------- GELU */

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */

/* GELU, tanh approximation (GPT-2's), and its derivative: the formulas of model/gpt_math.h. */
static inline __device__ float gelu(float x)
{
    return 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + 0.044715f * x * x * x)));
}

static inline __device__ float gelu_grad(float x)
{
    float u = GELU_SCALE * (x + 0.044715f * x * x * x), th = tanhf(u);
    float sech2 = 1.0f - th * th;
    return 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
}

#endif
