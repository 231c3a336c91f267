/* The GPT model's CUDA kernels (see gpt_kernels_cuda.h); the formulas are those of model/gpt_kernels.c. */
#include <math.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "model/cuda/gpt_kernels_cuda.h"

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

#define LAUNCHED()                                    \
    do {                                              \
        cudaError_t launched_e_ = cudaGetLastError(); \
        if (launched_e_ != cudaSuccess)               \
            return launched_e_;                       \
    } while (0)

static unsigned grid_for(size_t n)
{
    size_t want = (n + THREADS - 1) / THREADS;
    return want < MAX_BLOCKS ? (unsigned)want : MAX_BLOCKS;
}

static unsigned blocks_for_rows(int rows)
{
    return (unsigned)(((size_t)rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
}

static unsigned blocks_for_cols(int cols)
{
    return (unsigned)(((size_t)cols + COL_TILE - 1) / COL_TILE);
}

/* ---------------------------------------------------------------- reductions */

/* The xor butterfly leaves the same bits in every lane: each step adds the same two values, commuted. */
static __device__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

static __device__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

/* Block-wide sum and max for a blockDim.x that is a multiple of 32; every thread gets the result.
 * red holds 32 floats of shared memory; the first barrier lets a previous reduction finish reading it. */
static __device__ float block_sum(float v, float *red)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    return warp_sum(lane < warps ? red[lane] : 0.0f);
}

static __device__ float block_max(float v, float *red)
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
static __device__ void column_tree(float (*s)[COL_TILE])
{
    for (int h = COL_TILE / 2; h > 0; h >>= 1) {
        __syncthreads();
        if ((int)threadIdx.y < h)
            s[threadIdx.y][threadIdx.x] += s[threadIdx.y + h][threadIdx.x];
    }
    __syncthreads();
}

/* ---------------------------------------------------------------- embedding */

static __global__ void embed_forward_kernel(float *__restrict__ out, const int32_t *__restrict__ tok,
                                            const float *__restrict__ wte, const float *__restrict__ wpe, int T,
                                            int C, size_t total)
{
    FOR_EACH(i, total) {
        size_t n = i / C, c = i % C;
        out[i] = wte[(size_t)tok[n] * C + c] + wpe[(n % T) * C + c];
    }
}

/* Rows with the same token add into the same wte row, so one thread owns one channel and walks the rows
 * in order: threads never share an address, and the sum's order is the host's. */
static __global__ void embed_dwte_kernel(float *__restrict__ dwte, const float *__restrict__ dout,
                                         const int32_t *__restrict__ tok, int N, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    for (int n = 0; n < N; n++)
        dwte[(size_t)tok[n] * C + c] += dout[(size_t)n * C + c];
}

/* One thread per (t, c) of wpe, adding rows t, t + T, ... in order, as the host does. */
static __global__ void embed_dwpe_kernel(float *__restrict__ dwpe, const float *__restrict__ dout, int N, int T,
                                         int C)
{
    FOR_EACH(i, (size_t)T * C) {
        size_t t = i / C, c = i % C;
        float acc = dwpe[i];
        for (size_t n = t; n < (size_t)N; n += T)
            acc += dout[n * C + c];
        dwpe[i] = acc;
    }
}

extern "C" cudaError_t kcuda_embed_forward(float *out, const int32_t *tok, const float *wte, const float *wpe, int N,
                                           int T, int C, cudaStream_t stream)
{
    size_t total = (size_t)N * C;
    if (total == 0)
        return cudaSuccess;
    embed_forward_kernel<<<grid_for(total), THREADS, 0, stream>>>(out, tok, wte, wpe, T, C, total);
    return cudaGetLastError();
}

extern "C" cudaError_t kcuda_embed_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tok, int N,
                                            int T, int C, cudaStream_t stream)
{
    if (N <= 0 || C <= 0)
        return cudaSuccess;
    /* Small blocks spread the few channel threads over more multiprocessors. */
    embed_dwte_kernel<<<(unsigned)(((size_t)C + 31) / 32), 32, 0, stream>>>(dwte, dout, tok, N, C);
    LAUNCHED();
    embed_dwpe_kernel<<<grid_for((size_t)T * C), THREADS, 0, stream>>>(dwpe, dout, N, T, C);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- layernorm */

static __global__ void layernorm_forward_kernel(float *__restrict__ out, float *__restrict__ mean,
                                                float *__restrict__ rstd, const float *__restrict__ inp,
                                                const float *__restrict__ w, const float *__restrict__ b, int N,
                                                int C)
{
    int lane = threadIdx.x & 31;
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (row >= N)
        return; /* the whole warp leaves: the shuffles below see all 32 lanes */
    const float *x = inp + (size_t)row * C;
    float m = 0.0f, v = 0.0f;
    for (int i = lane; i < C; i += 32)
        m += x[i];
    m = warp_sum(m) / C;
    for (int i = lane; i < C; i += 32)
        v += (x[i] - m) * (x[i] - m);
    v = warp_sum(v) / C;
    float s = 1.0f / sqrtf(v + 1e-5f);
    float *o = out + (size_t)row * C;
    for (int i = lane; i < C; i += 32)
        o[i] = (x[i] - m) * s * w[i] + b[i];
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

static __global__ void layernorm_dinp_kernel(float *__restrict__ dinp, const float *__restrict__ dout,
                                             const float *__restrict__ inp, const float *__restrict__ w,
                                             const float *__restrict__ mean, const float *__restrict__ rstd, int N,
                                             int C)
{
    int lane = threadIdx.x & 31;
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (row >= N)
        return;
    const float *g = dout + (size_t)row * C, *x = inp + (size_t)row * C;
    float m = mean[row], s = rstd[row], dmean = 0.0f, dproj = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float dnorm = w[i] * g[i];
        dmean += dnorm;
        dproj += dnorm * (x[i] - m) * s;
    }
    dmean = warp_sum(dmean) / C;
    dproj = warp_sum(dproj) / C;
    float *d = dinp + (size_t)row * C;
    for (int i = lane; i < C; i += 32) {
        float norm = (x[i] - m) * s;
        d[i] += (w[i] * g[i] - dmean - norm * dproj) * s;
    }
}

/* dw, db: a (32, 32) block owns 32 channels; thread (x, y) sums rows y, y + 32, ... of channel x, then the
 * 32 partial sums fold in a fixed tree. The order depends on N and C only. */
static __global__ void layernorm_dwdb_kernel(float *__restrict__ dw, float *__restrict__ db,
                                             const float *__restrict__ dout, const float *__restrict__ inp,
                                             const float *__restrict__ mean, const float *__restrict__ rstd, int N,
                                             int C)
{
    __shared__ float sw[COL_TILE][COL_TILE], sb[COL_TILE][COL_TILE];
    int c = blockIdx.x * COL_TILE + threadIdx.x;
    float pw = 0.0f, pb = 0.0f;
    if (c < C)
        for (int n = threadIdx.y; n < N; n += COL_TILE) {
            size_t at = (size_t)n * C + c;
            float g = dout[at];
            pw += g * (inp[at] - mean[n]) * rstd[n];
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

extern "C" cudaError_t kcuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                               const float *b, int N, int C, cudaStream_t stream)
{
    if (N <= 0 || C <= 0)
        return cudaSuccess;
    layernorm_forward_kernel<<<blocks_for_rows(N), THREADS, 0, stream>>>(out, mean, rstd, inp, w, b, N, C);
    return cudaGetLastError();
}

extern "C" cudaError_t kcuda_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                                const float *inp, const float *w, const float *mean,
                                                const float *rstd, int N, int C, cudaStream_t stream)
{
    if (N <= 0 || C <= 0)
        return cudaSuccess;
    layernorm_dinp_kernel<<<blocks_for_rows(N), THREADS, 0, stream>>>(dinp, dout, inp, w, mean, rstd, N, C);
    LAUNCHED();
    layernorm_dwdb_kernel<<<blocks_for_cols(C), dim3(COL_TILE, COL_TILE), 0, stream>>>(dw, db, dout, inp, mean,
                                                                                      rstd, N, C);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- linear: bias */

static __global__ void add_bias_kernel(float *__restrict__ out, const float *__restrict__ bias, int OC, size_t total)
{
    FOR_EACH(i, total)
        out[i] += bias[i % OC];
}

/* As layernorm_dwdb_kernel, for one sum. */
static __global__ void colsum_add_kernel(float *__restrict__ dst, const float *__restrict__ src, int N, int C)
{
    __shared__ float s[COL_TILE][COL_TILE];
    int c = blockIdx.x * COL_TILE + threadIdx.x;
    float p = 0.0f;
    if (c < C)
        for (int n = threadIdx.y; n < N; n += COL_TILE)
            p += src[(size_t)n * C + c];
    s[threadIdx.y][threadIdx.x] = p;
    column_tree(s);
    if (threadIdx.y == 0 && c < C)
        dst[c] += s[0][threadIdx.x];
}

extern "C" cudaError_t kcuda_add_bias(float *out, const float *bias, int N, int OC, cudaStream_t stream)
{
    size_t total = (size_t)N * OC;
    if (total == 0)
        return cudaSuccess;
    add_bias_kernel<<<grid_for(total), THREADS, 0, stream>>>(out, bias, OC, total);
    return cudaGetLastError();
}

extern "C" cudaError_t kcuda_colsum_add(float *dst, const float *src, int N, int C, cudaStream_t stream)
{
    if (N <= 0 || C <= 0)
        return cudaSuccess;
    colsum_add_kernel<<<blocks_for_cols(C), dim3(COL_TILE, COL_TILE), 0, stream>>>(dst, src, N, C);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- attention */

static __global__ void causal_softmax_kernel(float *__restrict__ att, int rows, int T)
{
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (r >= rows)
        return;
    int t = r % T;
    float *row = att + (size_t)r * T;
    float mx = -INFINITY, sum = 0.0f;
    for (int j = lane; j <= t; j += 32)
        mx = fmaxf(mx, row[j]);
    mx = warp_max(mx);
    for (int j = lane; j <= t; j += 32) {
        float e = expf(row[j] - mx);
        row[j] = e;
        sum += e;
    }
    sum = warp_sum(sum);
    /* Each lane reads back only the entries it wrote. */
    for (int j = lane; j <= t; j += 32)
        row[j] /= sum;
    for (int j = t + 1 + lane; j < T; j += 32)
        row[j] = 0.0f; /* the causal mask: future tokens get no weight */
}

static __global__ void causal_softmax_backward_kernel(float *__restrict__ da, const float *__restrict__ att, int rows,
                                                      int T)
{
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (r >= rows)
        return;
    int t = r % T;
    const float *a = att + (size_t)r * T;
    float *d = da + (size_t)r * T, dot = 0.0f;
    for (int j = lane; j <= t; j += 32)
        dot += a[j] * d[j];
    dot = warp_sum(dot);
    for (int j = lane; j <= t; j += 32)
        d[j] = a[j] * (d[j] - dot);
    for (int j = t + 1 + lane; j < T; j += 32)
        d[j] = 0.0f;
}

extern "C" cudaError_t kcuda_causal_softmax(float *att, int rows, int T, cudaStream_t stream)
{
    if (rows <= 0 || T <= 0)
        return cudaSuccess;
    causal_softmax_kernel<<<blocks_for_rows(rows), THREADS, 0, stream>>>(att, rows, T);
    return cudaGetLastError();
}

extern "C" cudaError_t kcuda_causal_softmax_backward(float *da, const float *att, int rows, int T,
                                                     cudaStream_t stream)
{
    if (rows <= 0 || T <= 0)
        return cudaSuccess;
    causal_softmax_backward_kernel<<<blocks_for_rows(rows), THREADS, 0, stream>>>(da, att, rows, T);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- elementwise */

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */

/* The elementwise kernels may run in place, so their pointers are not __restrict__. */
static __global__ void gelu_forward_kernel(float *out, const float *inp, size_t n)
{
    FOR_EACH(i, n) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + 0.044715f * x * x * x)));
    }
}

static __global__ void gelu_backward_kernel(float *d, const float *inp, size_t n)
{
    FOR_EACH(i, n) {
        float x = inp[i], u = GELU_SCALE * (x + 0.044715f * x * x * x), th = tanhf(u);
        float sech2 = 1.0f - th * th;
        float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        d[i] *= grad;
    }
}

static __global__ void residual_forward_kernel(float *out, const float *a, const float *b, size_t n)
{
    FOR_EACH(i, n)
        out[i] = a[i] + b[i];
}

extern "C" cudaError_t kcuda_gelu_forward(float *out, const float *inp, size_t n, cudaStream_t stream)
{
    if (n == 0)
        return cudaSuccess;
    gelu_forward_kernel<<<grid_for(n), THREADS, 0, stream>>>(out, inp, n);
    return cudaGetLastError();
}

extern "C" cudaError_t kcuda_gelu_backward(float *d, const float *inp, size_t n, cudaStream_t stream)
{
    if (n == 0)
        return cudaSuccess;
    gelu_backward_kernel<<<grid_for(n), THREADS, 0, stream>>>(d, inp, n);
    return cudaGetLastError();
}

extern "C" cudaError_t kcuda_residual_forward(float *out, const float *a, const float *b, size_t n,
                                              cudaStream_t stream)
{
    if (n == 0)
        return cudaSuccess;
    residual_forward_kernel<<<grid_for(n), THREADS, 0, stream>>>(out, a, b, n);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- cross-entropy */

static __global__ void cross_entropy_kernel(float *__restrict__ logits, double *__restrict__ row_loss,
                                            const int32_t *__restrict__ targets, int V, float scale, int with_grad)
{
    __shared__ float red[32];
    float *l = logits + (size_t)blockIdx.x * V;
    float mx = -INFINITY, sum = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        mx = fmaxf(mx, l[v]);
    mx = block_max(mx, red);
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        sum += expf(l[v] - mx);
    sum = block_sum(sum, red);
    int t = targets[blockIdx.x];
    bool ok = t >= 0 && t < V;
    if (threadIdx.x == 0)
        row_loss[blockIdx.x] = ok ? (double)(logf(sum) - (l[t] - mx)) : (double)NAN;
    if (!with_grad)
        return;
    __syncthreads(); /* thread 0 has read l[t] before the row is overwritten */
    float inv = 1.0f / sum;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float p = expf(l[v] - mx) * inv * scale;
        if (ok && v == t)
            p -= scale;
        l[v] = p;
    }
}

extern "C" cudaError_t kcuda_cross_entropy(float *logits, double *row_loss, const int32_t *targets, int rows, int V,
                                           float scale, int with_grad, cudaStream_t stream)
{
    if (rows <= 0 || V <= 0)
        return cudaSuccess;
    cross_entropy_kernel<<<(unsigned)rows, THREADS, 0, stream>>>(logits, row_loss, targets, V, scale, with_grad);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- conversions */

static __global__ void bf16_to_f32_kernel(float *__restrict__ dst, const __nv_bfloat16 *__restrict__ src, size_t n)
{
    FOR_EACH(i, n)
        dst[i] = __bfloat162float(src[i]);
}

static __global__ void f16_to_f32_kernel(float *__restrict__ dst, const __half *__restrict__ src, size_t n)
{
    FOR_EACH(i, n)
        dst[i] = __half2float(src[i]);
}

static __global__ void f32_to_bf16_kernel(__nv_bfloat16 *__restrict__ dst, const float *__restrict__ src, size_t n)
{
    FOR_EACH(i, n)
        dst[i] = __float2bfloat16_rn(src[i]);
}

static __global__ void f32_to_f16_kernel(__half *__restrict__ dst, const float *__restrict__ src, size_t n)
{
    FOR_EACH(i, n)
        dst[i] = __float2half_rn(src[i]);
}

extern "C" cudaError_t kcuda_bf16_to_f32(float *dst, const void *src, size_t n, cudaStream_t stream)
{
    if (n == 0)
        return cudaSuccess;
    bf16_to_f32_kernel<<<grid_for(n), THREADS, 0, stream>>>(dst, (const __nv_bfloat16 *)src, n);
    return cudaGetLastError();
}

extern "C" cudaError_t kcuda_f16_to_f32(float *dst, const void *src, size_t n, cudaStream_t stream)
{
    if (n == 0)
        return cudaSuccess;
    f16_to_f32_kernel<<<grid_for(n), THREADS, 0, stream>>>(dst, (const __half *)src, n);
    return cudaGetLastError();
}

extern "C" cudaError_t kcuda_f32_to_bf16(void *dst, const float *src, size_t n, cudaStream_t stream)
{
    if (n == 0)
        return cudaSuccess;
    f32_to_bf16_kernel<<<grid_for(n), THREADS, 0, stream>>>((__nv_bfloat16 *)dst, src, n);
    return cudaGetLastError();
}

extern "C" cudaError_t kcuda_f32_to_f16(void *dst, const float *src, size_t n, cudaStream_t stream)
{
    if (n == 0)
        return cudaSuccess;
    f32_to_f16_kernel<<<grid_for(n), THREADS, 0, stream>>>((__half *)dst, src, n);
    return cudaGetLastError();
}
