/*
 * The bf16-activation kernels (see gpt_kernels_bf16.h); the formulas are those of model/gpt_kernels.c, evaluated in
 * fp32 on the widened bf16 inputs and rounded once on output.
 *
 * Vector access: a kernel reads and writes VEC = 8 bf16 (16 bytes) at a time where the launcher found every pointer
 * 16-byte aligned and the shape a multiple of VEC, and one element at a time otherwise. The row kernels (LayerNorm, the
 * classifier) hand a thread the same elements either way (chunks of VEC starting at VEC * lane), so the order of every
 * sum, and so every bit of the result, depends on the shapes only, never on the alignment of the buffers.
 */
#include "model/cuda/gpt_kernels_bf16.h"
#include "model/cuda/kcuda_columns.cuh"
#include "model/cuda/kcuda_reduce.cuh"

typedef __nv_bfloat16 bf16;

/* The first cnt (<= VEC) elements of p into f, the others 0. With vec, one 16-byte load of all VEC, which the caller
 * guarantees to be in bounds and aligned (the elements past cnt are then read but not used). */
static inline __device__ void row_load(float f[VEC], const bf16 *p, int cnt, bool vec)
{
    if (vec) {
        load8(f, p);
        return;
    }
#pragma unroll
    for (int k = 0; k < VEC; k++)
        f[k] = k < cnt ? __bfloat162float(p[k]) : 0.0f;
}

/* f[0..cnt) into p; with vec, all VEC (the caller guarantees that they are the row's to write). */
static inline __device__ void row_store(bf16 *p, const float f[VEC], int cnt, bool vec)
{
    if (vec) {
        store8(p, f);
        return;
    }
#pragma unroll
    for (int k = 0; k < VEC; k++)
        if (k < cnt)
            p[k] = __float2bfloat16_rn(f[k]);
}

static inline __device__ int chunk_len(int c0, int C)
{
    return C - c0 < VEC ? C - c0 : VEC;
}

/* ---------------------------------------------------------------- embedding */

/* The first vecs * VEC elements go VEC at a time (C is a multiple of VEC there, so a chunk never crosses a row), the
 * rest one at a time. */
static __global__ void embed_forward_kernel(bf16 *__restrict__ out, const int32_t *__restrict__ tok,
                                            const bf16 *__restrict__ wte, const bf16 *__restrict__ wpe, int T, int C,
                                            size_t n, size_t vecs)
{
    FOR_EACH(j, vecs) {
        size_t i = j * VEC, row = i / C, c = i % C;
        float a[VEC], b[VEC];
        load8(a, wte + (size_t)tok[row] * C + c);
        load8(b, wpe + (row % T) * C + c);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            a[k] += b[k];
        store8(out + i, a);
    }
    FOR_EACH(r, n - vecs * VEC) {
        size_t i = vecs * VEC + r, row = i / C, c = i % C;
        float a = __bfloat162float(wte[(size_t)tok[row] * C + c]) + __bfloat162float(wpe[(row % T) * C + c]);
        out[i] = __float2bfloat16_rn(a);
    }
}

extern "C" cudaError_t kbf16_embed_forward(void *out, const int32_t *tok, const void *wte, const void *wpe, int N,
                                           int T, int C, cudaStream_t stream)
{
    size_t n = N > 0 && C > 0 ? (size_t)N * C : 0;
    if (n == 0)
        return cudaSuccess;
    if (T <= 0)
        return cudaErrorInvalidValue;
    bool vec = C % VEC == 0 && aligned16(out) && aligned16(wte) && aligned16(wpe);
    size_t vecs = vec ? n / VEC : 0;
    embed_forward_kernel<<<grid_for(vecs + (n - vecs * VEC)), THREADS, 0, stream>>>(
        (bf16 *)out, tok, (const bf16 *)wte, (const bf16 *)wpe, T, C, n, vecs);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- layernorm */

/* One warp per row; lane l holds the chunks of VEC channels that start at VEC * (l + 32 k). With vec, C is a multiple
 * of VEC and the buffers are aligned, so every chunk is whole and aligned. */
static __global__ void layernorm_forward_kernel(bf16 *__restrict__ out, float *__restrict__ mean,
                                                float *__restrict__ rstd, const bf16 *__restrict__ inp,
                                                const bf16 *__restrict__ w, const bf16 *__restrict__ b, int N, int C,
                                                bool vec)
{
    int lane = threadIdx.x & 31;
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (row >= N)
        return; /* the whole warp leaves: the shuffles below see all 32 lanes */
    const bf16 *x = inp + (size_t)row * C;
    bf16 *o = out + (size_t)row * C;
    float f[VEC], m = 0.0f, v = 0.0f;
    for (int c0 = lane * VEC; c0 < C; c0 += 32 * VEC) {
        int cnt = chunk_len(c0, C);
        row_load(f, x + c0, cnt, vec);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            if (k < cnt)
                m += f[k];
    }
    m = warp_sum(m) / C;
    for (int c0 = lane * VEC; c0 < C; c0 += 32 * VEC) {
        int cnt = chunk_len(c0, C);
        row_load(f, x + c0, cnt, vec);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            if (k < cnt)
                v += (f[k] - m) * (f[k] - m);
    }
    v = warp_sum(v) / C;
    float s = 1.0f / sqrtf(v + 1e-5f);
    for (int c0 = lane * VEC; c0 < C; c0 += 32 * VEC) {
        int cnt = chunk_len(c0, C);
        float fw[VEC], fb[VEC];
        row_load(f, x + c0, cnt, vec);
        row_load(fw, w + c0, cnt, vec);
        row_load(fb, b + c0, cnt, vec);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            f[k] = (f[k] - m) * s * fw[k] + fb[k];
        row_store(o + c0, f, cnt, vec);
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

static __global__ void layernorm_dinp_kernel(bf16 *__restrict__ dinp, const bf16 *__restrict__ dout,
                                             const bf16 *__restrict__ inp, const bf16 *__restrict__ w,
                                             const float *__restrict__ mean, const float *__restrict__ rstd, int N,
                                             int C, bool vec)
{
    int lane = threadIdx.x & 31;
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (row >= N)
        return;
    const bf16 *g = dout + (size_t)row * C, *x = inp + (size_t)row * C;
    bf16 *d = dinp + (size_t)row * C;
    float m = mean[row], s = rstd[row], dmean = 0.0f, dproj = 0.0f;
    float fg[VEC], fx[VEC], fw[VEC], fd[VEC];
    for (int c0 = lane * VEC; c0 < C; c0 += 32 * VEC) {
        int cnt = chunk_len(c0, C);
        row_load(fg, g + c0, cnt, vec);
        row_load(fx, x + c0, cnt, vec);
        row_load(fw, w + c0, cnt, vec);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            if (k < cnt) {
                float dnorm = fw[k] * fg[k];
                dmean += dnorm;
                dproj += dnorm * (fx[k] - m) * s;
            }
    }
    dmean = warp_sum(dmean) / C;
    dproj = warp_sum(dproj) / C;
    for (int c0 = lane * VEC; c0 < C; c0 += 32 * VEC) {
        int cnt = chunk_len(c0, C);
        row_load(fg, g + c0, cnt, vec);
        row_load(fx, x + c0, cnt, vec);
        row_load(fw, w + c0, cnt, vec);
        row_load(fd, d + c0, cnt, vec);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            float norm = (fx[k] - m) * s;
            fd[k] += (fw[k] * fg[k] - dmean - norm * dproj) * s;
        }
        row_store(d + c0, fd, cnt, vec);
    }
}


extern "C" cudaError_t kbf16_layernorm_forward(void *out, float *mean, float *rstd, const void *inp, const void *w,
                                               const void *b, int N, int C, cudaStream_t stream)
{
    if (N <= 0 || C <= 0)
        return cudaSuccess;
    bool vec = C % VEC == 0 && aligned16(out) && aligned16(inp) && aligned16(w) && aligned16(b);
    layernorm_forward_kernel<<<blocks_for_rows(N), THREADS, 0, stream>>>(
        (bf16 *)out, mean, rstd, (const bf16 *)inp, (const bf16 *)w, (const bf16 *)b, N, C, vec);
    return cudaGetLastError();
}

extern "C" cudaError_t kbf16_layernorm_backward(void *dinp, float *dw, float *db, const void *dout, const void *inp,
                                                const void *w, const float *mean, const float *rstd, int N, int C,
                                                cudaStream_t stream)
{
    if (N <= 0 || C <= 0)
        return cudaSuccess;
    bool vec = C % VEC == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(w);
    layernorm_dinp_kernel<<<blocks_for_rows(N), THREADS, 0, stream>>>(
        (bf16 *)dinp, (const bf16 *)dout, (const bf16 *)inp, (const bf16 *)w, mean, rstd, N, C, vec);
    LAUNCHED();
    layernorm_dwdb_kernel<<<blocks_for_cols(C), dim3(COL_TILE, COL_TILE), 0, stream>>>(
        dw, db, (const bf16 *)dout, (const bf16 *)inp, mean, rstd, N, C);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- linear: bias */

/* With vecs > 0, OC is a multiple of VEC, so a chunk never crosses a row and its bias chunk is aligned. */
static __global__ void add_bias_kernel(bf16 *__restrict__ out, const bf16 *__restrict__ bias, int OC, size_t n,
                                       size_t vecs)
{
    FOR_EACH(j, vecs) {
        size_t i = j * VEC;
        float a[VEC], b[VEC];
        load8(a, out + i);
        load8(b, bias + i % OC);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            a[k] += b[k];
        store8(out + i, a);
    }
    FOR_EACH(r, n - vecs * VEC) {
        size_t i = vecs * VEC + r;
        out[i] = __float2bfloat16_rn(__bfloat162float(out[i]) + __bfloat162float(bias[i % OC]));
    }
}


extern "C" cudaError_t kbf16_add_bias(void *out, const void *bias, int N, int OC, cudaStream_t stream)
{
    size_t n = N > 0 && OC > 0 ? (size_t)N * OC : 0;
    if (n == 0)
        return cudaSuccess;
    bool vec = OC % VEC == 0 && aligned16(out) && aligned16(bias);
    size_t vecs = vec ? n / VEC : 0;
    add_bias_kernel<<<grid_for(vecs + (n - vecs * VEC)), THREADS, 0, stream>>>((bf16 *)out, (const bf16 *)bias,
                                                                               OC, n, vecs);
    return cudaGetLastError();
}

extern "C" cudaError_t kbf16_colsum_add(float *dst, const void *src, int N, int C, cudaStream_t stream)
{
    if (N <= 0 || C <= 0)
        return cudaSuccess;
    colsum_add_kernel<<<blocks_for_cols(C), dim3(COL_TILE, COL_TILE), 0, stream>>>(dst, (const bf16 *)src, N, C);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- elementwise */

enum map_op {
    MAP_GELU,      /* out = gelu(x) */
    MAP_GELU_GRAD, /* out = x * gelu'(y): x the output's gradient, y the input */
    MAP_ADD,       /* out = x + y */
};

template <int OP>
static inline __device__ float map_apply(float x, float y)
{
    if (OP == MAP_GELU)
        return gelu(x);
    if (OP == MAP_GELU_GRAD)
        return x * gelu_grad(y);
    return x + y;
}

/* out[i] = OP(x[i], y[i]) (y unread by MAP_GELU): the first vecs * VEC elements VEC at a time, the rest one at a time.
 * Each element is read and then written by one thread, so out may be x or y (the pointers are not __restrict__). */
template <int OP>
static __global__ void map_kernel(bf16 *out, const bf16 *x, const bf16 *y, size_t n, size_t vecs)
{
    FOR_EACH(j, vecs) {
        float a[VEC], b[VEC] = {0};
        load8(a, x + j * VEC);
        if (OP != MAP_GELU)
            load8(b, y + j * VEC);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            a[k] = map_apply<OP>(a[k], b[k]);
        store8(out + j * VEC, a);
    }
    FOR_EACH(r, n - vecs * VEC) {
        size_t i = vecs * VEC + r;
        float b = OP != MAP_GELU ? __bfloat162float(y[i]) : 0.0f;
        out[i] = __float2bfloat16_rn(map_apply<OP>(__bfloat162float(x[i]), b));
    }
}

template <int OP>
static cudaError_t map_launch(void *out, const void *x, const void *y, size_t n, cudaStream_t stream)
{
    if (n == 0)
        return cudaSuccess;
    bool vec = aligned16(out) && aligned16(x) && (OP == MAP_GELU || aligned16(y));
    size_t vecs = vec ? n / VEC : 0;
    map_kernel<OP><<<grid_for(vecs + (n - vecs * VEC)), THREADS, 0, stream>>>((bf16 *)out, (const bf16 *)x,
                                                                               (const bf16 *)y, n, vecs);
    return cudaGetLastError();
}

extern "C" cudaError_t kbf16_gelu_forward(void *out, const void *inp, size_t n, cudaStream_t stream)
{
    return map_launch<MAP_GELU>(out, inp, NULL, n, stream);
}

extern "C" cudaError_t kbf16_gelu_backward(void *d, const void *inp, size_t n, cudaStream_t stream)
{
    return map_launch<MAP_GELU_GRAD>(d, d, inp, n, stream);
}

extern "C" cudaError_t kbf16_residual_forward(void *out, const void *a, const void *b, size_t n, cudaStream_t stream)
{
    return map_launch<MAP_ADD>(out, a, b, n, stream);
}

/* ---------------------------------------------------------------- classifier */

/* One block per row. Thread t holds the chunks of VEC columns that start at VEC * (t + THREADS k), in both paths; with
 * vec, ld is a multiple of VEC and the row aligned, so a chunk that straddles V lies inside the row (its padding
 * columns are read and ignored). Three passes over the row: the max, the sum of exponentials, the gradient. */
static __global__ void classifier_kernel(bf16 *__restrict__ logits, double *__restrict__ row_loss,
                                         const int32_t *__restrict__ targets, int V, int ld, float scale,
                                         int with_grad, bool vec)
{
    __shared__ float red[32];
    bf16 *l = logits + (size_t)blockIdx.x * ld;
    float f[VEC], mx = -INFINITY, sum = 0.0f;
    for (int c0 = threadIdx.x * VEC; c0 < V; c0 += THREADS * VEC) {
        int cnt = chunk_len(c0, V);
        row_load(f, l + c0, cnt, vec);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            if (k < cnt)
                mx = fmaxf(mx, f[k]);
    }
    mx = block_max(mx, red);
    for (int c0 = threadIdx.x * VEC; c0 < V; c0 += THREADS * VEC) {
        int cnt = chunk_len(c0, V);
        row_load(f, l + c0, cnt, vec);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            if (k < cnt)
                sum += expf(f[k] - mx);
    }
    sum = block_sum(sum, red);
    int t = targets[blockIdx.x];
    bool ok = t >= 0 && t < V;
    if (threadIdx.x == 0)
        row_loss[blockIdx.x] =
            ok ? log((double)sum) - ((double)__bfloat162float(l[t]) - (double)mx) : (double)NAN;
    if (!with_grad)
        return;
    __syncthreads(); /* thread 0 has read l[t] before the row is overwritten */
    float inv = 1.0f / sum;
    for (int c0 = threadIdx.x * VEC; c0 < ld; c0 += THREADS * VEC) {
        int cnt = chunk_len(c0, V); /* <= 0 in the padding */
        row_load(f, l + c0, cnt, vec);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            int v = c0 + k;
            float p = 0.0f;
            if (v < V) {
                p = expf(f[k] - mx) * inv * scale;
                if (ok && v == t)
                    p -= scale;
            }
            f[k] = p;
        }
        row_store(l + c0, f, chunk_len(c0, ld), vec);
    }
}

extern "C" cudaError_t kbf16_classifier(void *logits, double *row_loss, const int32_t *targets, int rows, int V,
                                        int ld, float scale, int with_grad, cudaStream_t stream)
{
    if (rows <= 0 || V <= 0)
        return cudaSuccess;
    if (ld < V)
        return cudaErrorInvalidValue;
    bool vec = ld % VEC == 0 && aligned16(logits);
    classifier_kernel<<<(unsigned)rows, THREADS, 0, stream>>>((bf16 *)logits, row_loss, targets, V, ld, scale,
                                                             with_grad, vec);
    return cudaGetLastError();
}
