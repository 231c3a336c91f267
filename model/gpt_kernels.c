/* Host kernels of the GPT model (see gpt_kernels.h). The formulas are GPT-2's, as in llm.c's reference
 * train_gpt2.c, with the matrix products on OpenBLAS.
 *
 * Threads: one OpenMP team does all the work. OpenBLAS runs single-threaded inside it, on fixed pieces of each
 * product (GEMM_ROWS rows of the output) or on one attention head per task: OpenBLAS's own pthreads beside the
 * OpenMP team fought it for the cores (their spinning took the CPU the OpenMP loops between the products needed),
 * and its per-call team was too slow to start for one head's 128 x 128 products. The pieces do not depend on the
 * thread count, so neither do the results. */
#include "model/gpt_kernels.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

/* Rows of a product's output one task computes, and columns of a column sum one task adds. */
#define GEMM_ROWS 64
#define COL_BLOCK 64

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

static void blas_single_thread(void)
{
    openblas_set_num_threads(1);
}

/* C = alpha op(A) op(B) + beta C (row-major) in pieces of GEMM_ROWS rows of C, one OpenMP task each. */
static void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float beta, float *C, int ldc)
{
    pthread_once(&blas_once, blas_single_thread);
#pragma omp parallel for schedule(dynamic)
    for (int m0 = 0; m0 < M; m0 += GEMM_ROWS) {
        int rows = M - m0 < GEMM_ROWS ? M - m0 : GEMM_ROWS;
        const float *a = ta == CblasNoTrans ? A + (size_t)m0 * lda : A + m0;
        cblas_sgemm(CblasRowMajor, ta, tb, rows, N, K, alpha, a, lda, B, ldb, beta, C + (size_t)m0 * ldc, ldc);
    }
}

/* e^x to 1.4 ulp for x in [-87, 88] (Cephes' expf: x = n ln2 + r, a degree-5 polynomial for e^r, 2^n from the
 * exponent bits), written so that GCC vectorizes the loops that call it; libm's expf and tanhf do not vectorize and
 * were a quarter of the model's time. */
static inline float exp_fast(float x)
{
    x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest: 1.5 * 2^23 */
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    union {
        int32_t i;
        float f;
    } two_n = {.i = ((int32_t)n + 127) << 23};
    return (p * r * r + r + 1.0f) * two_n.f;
}

/* tanh u = 1 - 2 / (e^2u + 1), within 2e-7 of tanh (absolute; measured over [-10, 10]). */
static inline float tanh_fast(float u)
{
    return 1.0f - 2.0f / (exp_fast(2.0f * u) + 1.0f);
}

/* out[o] += sum over the rows n of x[n][o] (rows x cols), each column in row order. */
static void col_sums(float *out, const float *x, int rows, int cols)
{
#pragma omp parallel for
    for (int o0 = 0; o0 < cols; o0 += COL_BLOCK) {
        int w = cols - o0 < COL_BLOCK ? cols - o0 : COL_BLOCK;
        float acc[COL_BLOCK] = {0};
        for (int n = 0; n < rows; n++) {
            const float *r = x + (size_t)n * cols + o0;
#pragma omp simd
            for (int o = 0; o < w; o++)
                acc[o] += r[o];
        }
        for (int o = 0; o < w; o++)
            out[o0 + o] += acc[o];
    }
}

void k_embed_forward(void *ctx, float *out, const int32_t *tok, const float *wte, const float *wpe, int N, int T, int C)
{
    (void)ctx;
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *te = wte + (size_t)tok[n] * C, *pe = wpe + (size_t)(n % T) * C;
        float *o = out + (size_t)n * C;
        for (int i = 0; i < C; i++)
            o[i] = te[i] + pe[i];
    }
}

void k_embed_backward(void *ctx, float *dwte, float *dwpe, const float *dout, const int32_t *tok, int N, int T, int C)
{
    (void)ctx;
    /* Rows of the same token collide, so wte is accumulated in row order on one thread; wpe by position. */
    for (int n = 0; n < N; n++) {
        float *d = dwte + (size_t)tok[n] * C;
        const float *g = dout + (size_t)n * C;
        for (int i = 0; i < C; i++)
            d[i] += g[i];
    }
#pragma omp parallel for
    for (int t = 0; t < T; t++)
        for (int n = t; n < N; n += T) {
            float *d = dwpe + (size_t)t * C;
            const float *g = dout + (size_t)n * C;
            for (int i = 0; i < C; i++)
                d[i] += g[i];
        }
}

void k_layernorm_forward(void *ctx, float *out, float *mean, float *rstd, const float *inp, const float *w,
                         const float *b, int N, int C)
{
    (void)ctx;
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float m = 0, v = 0;
        for (int i = 0; i < C; i++)
            m += x[i];
        m /= C;
        for (int i = 0; i < C; i++)
            v += (x[i] - m) * (x[i] - m);
        v /= C;
        float s = 1.0f / sqrtf(v + 1e-5f);
        float *o = out + (size_t)n * C;
        for (int i = 0; i < C; i++)
            o[i] = (x[i] - m) * s * w[i] + b[i];
        mean[n] = m;
        rstd[n] = s;
    }
}

void k_layernorm_backward(void *ctx, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                          const float *w, const float *mean, const float *rstd, int N, int C)
{
    (void)ctx;
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *g = dout + (size_t)n * C, *x = inp + (size_t)n * C;
        float m = mean[n], s = rstd[n], dmean = 0, dproj = 0;
        for (int i = 0; i < C; i++) {
            float dnorm = w[i] * g[i];
            dmean += dnorm;
            dproj += dnorm * (x[i] - m) * s;
        }
        dmean /= C;
        dproj /= C;
        float *d = dinp + (size_t)n * C;
        for (int i = 0; i < C; i++) {
            float norm = (x[i] - m) * s;
            d[i] += (w[i] * g[i] - dmean - norm * dproj) * s;
        }
    }
    /* Column sums by channel, each in row order, so the result is the same for any thread count. */
#pragma omp parallel for
    for (int i0 = 0; i0 < C; i0 += COL_BLOCK) {
        int cw = C - i0 < COL_BLOCK ? C - i0 : COL_BLOCK;
        float sw[COL_BLOCK] = {0}, sb[COL_BLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float *g = dout + (size_t)n * C + i0, *x = inp + (size_t)n * C + i0;
            float m = mean[n], s = rstd[n];
#pragma omp simd
            for (int i = 0; i < cw; i++) {
                sw[i] += g[i] * (x[i] - m) * s;
                sb[i] += g[i];
            }
        }
        for (int i = 0; i < cw; i++) {
            dw[i0 + i] += sw[i];
            db[i0 + i] += sb[i];
        }
    }
}

void k_linear_forward(void *ctx, float *out, const float *inp, const float *W, const float *bias, int N, int C, int OC)
{
    (void)ctx;
    /* The bias goes in first and the product adds to it (beta 1): one pass over out instead of two. */
    if (bias) {
#pragma omp parallel for
        for (int n = 0; n < N; n++)
            memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
    }
    gemm(CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, W, C, bias ? 1.0f : 0.0f, out, OC);
}

void k_linear_backward(void *ctx, float *dinp, float *dW, float *dbias, const float *dout, const float *inp,
                       const float *W, int N, int C, int OC)
{
    (void)ctx;
    if (dinp)
        gemm(CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, W, C, 1.0f, dinp, C);
    gemm(CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dW, C);
    if (dbias)
        col_sums(dbias, dout, N, OC);
}

/* Each (batch, head) is one task: its products are 128 x 128 x 64 at GPT-2 small's shapes, too small to split. */
void k_attention_forward(void *ctx, float *out, float *att, const float *qkv, int B, int T, int C, int NH)
{
    (void)ctx;
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    pthread_once(&blas_once, blas_single_thread);
#pragma omp parallel for schedule(dynamic)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
        float *a = att + (size_t)bh * T * T;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, C3, k, C3, 0.0f, a, T);
        for (int i = 0; i < T; i++) {
            float *row = a + (size_t)i * T, mx = -INFINITY, sum = 0;
#pragma omp simd reduction(max : mx)
            for (int j = 0; j <= i; j++)
                mx = row[j] > mx ? row[j] : mx;
#pragma omp simd reduction(+ : sum)
            for (int j = 0; j <= i; j++) {
                row[j] = exp_fast(row[j] - mx);
                sum += row[j];
            }
            float inv = 1.0f / sum;
#pragma omp simd
            for (int j = 0; j <= i; j++)
                row[j] *= inv;
            for (int j = i + 1; j < T; j++)
                row[j] = 0.0f; /* the causal mask: future tokens get no weight */
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, v, C3, 0.0f,
                    out + (size_t)b * T * C + h * hs, C);
    }
}

void k_attention_backward(void *ctx, float *dqkv, float *scratch, const float *dout, const float *qkv, const float *att,
                          int B, int T, int C, int NH)
{
    (void)ctx;
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    pthread_once(&blas_once, blas_single_thread);
#pragma omp parallel for schedule(dynamic)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
        float *dq = dqkv + (size_t)b * T * C3 + h * hs, *dk = dq + C, *dv = dq + 2 * C;
        const float *a = att + (size_t)bh * T * T, *g = dout + (size_t)b * T * C + h * hs;
        float *da = scratch + (size_t)bh * T * T;
        /* da = dout v^T, dv = a^T dout */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, g, C, v, C3, 0.0f, da, T);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, g, C, 0.0f, dv, C3);
        /* Through the softmax: dpre = a * (da - sum(a * da)), zero above the diagonal. */
        for (int i = 0; i < T; i++) {
            const float *ar = a + (size_t)i * T;
            float *dr = da + (size_t)i * T, dot = 0;
#pragma omp simd reduction(+ : dot)
            for (int j = 0; j <= i; j++)
                dot += ar[j] * dr[j];
#pragma omp simd
            for (int j = 0; j <= i; j++)
                dr[j] = ar[j] * (dr[j] - dot);
            for (int j = i + 1; j < T; j++)
                dr[j] = 0.0f;
        }
        /* dq = scale dpre k, dk = scale dpre^T q */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, da, T, k, C3, 0.0f, dq, C3);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, da, T, q, C3, 0.0f, dk, C3);
    }
}

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */

void k_gelu_forward(void *ctx, float *out, const float *inp, size_t n)
{
    (void)ctx;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanh_fast(GELU_SCALE * (x + 0.044715f * x * x * x)));
    }
}

void k_gelu_backward(void *ctx, float *d, const float *inp, size_t n)
{
    (void)ctx;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i], u = GELU_SCALE * (x + 0.044715f * x * x * x), th = tanh_fast(u);
        float sech2 = 1.0f - th * th;
        float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        d[i] *= grad;
    }
}

void k_residual_forward(void *ctx, float *out, const float *a, const float *b, size_t n)
{
    (void)ctx;
#pragma omp parallel for
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

void k_head_loss(void *ctx, float *dx, float *dwte, float *logits, double *row_loss, const float *x, const float *wte,
                 const int32_t *targets, int N, int C, int V, int chunk, float scale)
{
    (void)ctx;
    for (int r0 = 0; r0 < N; r0 += chunk) {
        int rows = N - r0 < chunk ? N - r0 : chunk;
        const float *xr = x + (size_t)r0 * C;
        gemm(CblasNoTrans, CblasTrans, rows, V, C, 1.0f, xr, C, wte, C, 0.0f, logits, V);
#pragma omp parallel for
        for (int r = 0; r < rows; r++) {
            float *l = logits + (size_t)r * V, mx = -INFINITY;
            double sum = 0;
            for (int v = 0; v < V; v++)
                mx = l[v] > mx ? l[v] : mx;
            for (int v = 0; v < V; v++)
                sum += expf(l[v] - mx);
            int t = targets[r0 + r];
            row_loss[r0 + r] = log(sum) - (double)(l[t] - mx);
            if (dx) {
                float inv = (float)(1.0 / sum);
                for (int v = 0; v < V; v++)
                    l[v] = expf(l[v] - mx) * inv * scale;
                l[t] -= scale;
            }
        }
        if (dx) {
            gemm(CblasNoTrans, CblasNoTrans, rows, C, V, 1.0f, logits, V, wte, C, 0.0f, dx + (size_t)r0 * C, C);
            gemm(CblasTrans, CblasNoTrans, V, C, rows, 1.0f, logits, V, xr, C, 1.0f, dwte, C);
        }
    }
}
