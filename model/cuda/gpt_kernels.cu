/* The GPT model's CUDA kernels (see gpt_kernels_cuda.h); the formulas are those of model/gpt_kernels.c. */
#include <math.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "model/cuda/embed_backward.h"
#include "model/cuda/gpt_kernels_cuda.h"
#include "model/cuda/kcuda_columns.cuh"
#include "model/cuda/kcuda_reduce.cuh"

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

extern "C" cudaError_t kcuda_embed_forward(float *out, const int32_t *tok, const float *wte, const float *wpe, int N,
                                           int T, int C, cudaStream_t stream)
{
    size_t total = (size_t)N * C;
    if (total == 0)
        return cudaSuccess;
    embed_forward_kernel<<<grid_for(total), THREADS, 0, stream>>>(out, tok, wte, wpe, T, C, total);
    return cudaGetLastError();
}

/* The grouped kernels of embed_backward.cu: the host's order of every sum, so the host's bits, in parallel. */
extern "C" cudaError_t kcuda_embed_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tok, int N,
                                            int T, int C, cudaStream_t stream)
{
    return kcuda_embed_backward_grouped(dwte, dwpe, dout, KCUDA_F32, tok, N, T, C, stream);
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

/* The elementwise kernels may run in place, so their pointers are not __restrict__. */
static __global__ void gelu_forward_kernel(float *out, const float *inp, size_t n)
{
    FOR_EACH(i, n)
        out[i] = gelu(inp[i]);
}

static __global__ void gelu_backward_kernel(float *d, const float *inp, size_t n)
{
    FOR_EACH(i, n)
        d[i] *= gelu_grad(inp[i]);
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
