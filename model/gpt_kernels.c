/* Host kernels of the GPT model (see gpt_kernels.h). The formulas are GPT-2's, as in llm.c's reference
 * train_gpt2.c, with the matrix products on OpenBLAS.
 *
 * Threads: one OpenMP team does all the work. OpenBLAS runs single-threaded inside it, on fixed pieces of each
 * product (GEMM_ROWS rows of the output) or on one attention head per task: OpenBLAS's own pthreads beside the
 * OpenMP team fought it for the cores (their spinning took the CPU the OpenMP loops between the products needed),
 * and its per-call team was too slow to start for one head's 128 x 128 products. The pieces do not depend on the
 * thread count, so neither do the results. */
#include "model/gpt_kernels.h"
#include "model/gpt_math.h"

#include <cblas.h>
#include <math.h>
#include <stdbool.h>
#include <pthread.h>
#include <string.h>

/* Rows of a product's output one task computes, and columns of a column sum one task adds. */
#define GEMM_ROWS 128
#define COL_BLOCK 64

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

static void blas_single_thread(void)
{
    openblas_set_num_threads(1);
}

/* Rows m0 .. m0 + rows of C = alpha op(A) op(B) + beta C (row-major): one piece of a product. With a bias (length N),
 * the piece first writes it into its rows of C and the product adds to it (then beta must be 1): the rows are still
 * in cache when the product reads them, and no separate pass over C is made. */
static void gemm_piece(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m0, int rows, int N, int K, float alpha,
                       const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc,
                       const float *bias)
{
    const float *a = ta == CblasNoTrans ? A + (size_t)m0 * lda : A + m0;
    for (int r = 0; bias && r < rows; r++)
        memcpy(C + (size_t)(m0 + r) * ldc, bias, (size_t)N * sizeof(float));
    cblas_sgemm(CblasRowMajor, ta, tb, rows, N, K, alpha, a, lda, B, ldb, beta, C + (size_t)m0 * ldc, ldc);
}

/* The whole product in pieces of GEMM_ROWS rows of C, one OpenMP task each. */
static void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float beta, float *C, int ldc, const float *bias)
{
    pthread_once(&blas_once, blas_single_thread);
#pragma omp parallel for schedule(dynamic)
    for (int m0 = 0; m0 < M; m0 += GEMM_ROWS) {
        int rows = M - m0 < GEMM_ROWS ? M - m0 : GEMM_ROWS;
        gemm_piece(ta, tb, m0, rows, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
    }
}

/* out[o] += sum over the rows n of x[n][o] for the cols columns of x (rows x cols, row stride ld), each column in row
 * order; one thread. */
static void col_sums(float *out, const float *x, int rows, int cols, int ld)
{
    for (int o0 = 0; o0 < cols; o0 += COL_BLOCK) {
        int w = cols - o0 < COL_BLOCK ? cols - o0 : COL_BLOCK;
        float acc[COL_BLOCK] = {0};
        for (int n = 0; n < rows; n++) {
            const float *r = x + (size_t)n * ld + o0;
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
    for (int n = 0; dwte && n < N; n++) {
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
    gemm(CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, W, C, bias ? 1.0f : 0.0f, out, OC, bias);
}

void k_linear_backward(void *ctx, float *dinp, float *dW, float *dbias, const float *dout, const float *inp,
                       const float *W, int N, int C, int OC)
{
    (void)ctx;
    /* One team runs the pieces of both products, dW's first (each is dout^T inp over all N rows, the longer ones):
     * one barrier instead of three. A dW piece also sums dbias over the columns of dout it reads. */
    int nw = (OC + GEMM_ROWS - 1) / GEMM_ROWS, nd = dinp ? (N + GEMM_ROWS - 1) / GEMM_ROWS : 0;
    pthread_once(&blas_once, blas_single_thread);
#pragma omp parallel for schedule(dynamic)
    for (int p = 0; p < nw + nd; p++) {
        int m0 = (p < nw ? p : p - nw) * GEMM_ROWS, M = p < nw ? OC : N;
        int rows = M - m0 < GEMM_ROWS ? M - m0 : GEMM_ROWS;
        if (p < nw) {
            gemm_piece(CblasTrans, CblasNoTrans, m0, rows, C, N, 1.0f, dout, OC, inp, C, 1.0f, dW, C, NULL);
            if (dbias)
                col_sums(dbias + m0, dout + m0, N, rows, OC);
        } else {
            gemm_piece(CblasNoTrans, CblasNoTrans, m0, rows, C, OC, 1.0f, dout, OC, W, C, 1.0f, dinp, C, NULL);
        }
    }
}

/* Each (batch, head) is one task: its products are 128 x 128 x 64 at GPT-2 small's shapes, too small to split.
 * The causal mask makes the scores lower triangular, so the products run on blocks of ATT_ROWS rows (or columns)
 * and skip the blocks above the diagonal, which are all zero: 5/8 of the work at T = 128. The zeros they skip add
 * nothing, and the blocks do not depend on the thread count. */
#define ATT_ROWS 32

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
        float *a = att + (size_t)bh * T * T, *o = out + (size_t)b * T * C + h * hs;
        for (int i0 = 0; i0 < T; i0 += ATT_ROWS) {
            int rows = T - i0 < ATT_ROWS ? T - i0 : ATT_ROWS, cols = i0 + rows;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, hs, scale, q + (size_t)i0 * C3, C3, k,
                        C3, 0.0f, a + (size_t)i0 * T, T);
            for (int i = i0; i < i0 + rows; i++) {
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
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, cols, 1.0f, a + (size_t)i0 * T, T, v, C3,
                        0.0f, o + (size_t)i0 * C, C);
        }
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
        /* da = dout v^T (rows of da up to the diagonal block), dv = a^T dout (rows of a from the diagonal block). */
        for (int i0 = 0; i0 < T; i0 += ATT_ROWS) {
            int n = T - i0 < ATT_ROWS ? T - i0 : ATT_ROWS;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, i0 + n, hs, 1.0f, g + (size_t)i0 * C, C, v, C3,
                        0.0f, da + (size_t)i0 * T, T);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, T - i0, 1.0f, a + (size_t)i0 * T + i0, T,
                        g + (size_t)i0 * C, C, 0.0f, dv + (size_t)i0 * C3, C3);
        }
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
        /* dq = scale dpre k, dk = scale dpre^T q, on the same blocks. */
        for (int i0 = 0; i0 < T; i0 += ATT_ROWS) {
            int n = T - i0 < ATT_ROWS ? T - i0 : ATT_ROWS;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hs, i0 + n, scale, da + (size_t)i0 * T, T, k, C3,
                        0.0f, dq + (size_t)i0 * C3, C3);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, T - i0, scale, da + (size_t)i0 * T + i0, T,
                        q + (size_t)i0 * C3, C3, 0.0f, dk + (size_t)i0 * C3, C3);
        }
    }
}

/* The GELU loops are compute-bound (the exp's polynomial and a division per element): built for AVX2 + FMA
 * (gpt_gelu_avx2.c) they take 0.6 of the time of the baseline x86-64 build, so the CPU picks one, once. Each thread
 * runs them on pieces of GELU_PIECE elements. */
#define GELU_PIECE 16384

static void gelu_forward_base(float *out, const float *inp, size_t n)
{
    gelu_forward_body(out, inp, n);
}

static void gelu_backward_base(float *d, const float *inp, size_t n)
{
    gelu_backward_body(d, inp, n);
}

typedef void (*gelu_fn)(float *, const float *, size_t);
static gelu_fn gelu_forward_fn = gelu_forward_base, gelu_backward_fn = gelu_backward_base;
static pthread_once_t gelu_once = PTHREAD_ONCE_INIT;

static void gelu_pick(void)
{
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        gelu_forward_fn = gelu_forward_avx2;
        gelu_backward_fn = gelu_backward_avx2;
    }
#endif
}

/* Runs the picked forward or backward body on pieces of GELU_PIECE elements (out is d for the backward). */
static void gelu_run(int backward, float *out, const float *inp, size_t n)
{
    pthread_once(&gelu_once, gelu_pick);
    gelu_fn fn = backward ? gelu_backward_fn : gelu_forward_fn;
#pragma omp parallel for schedule(static)
    for (size_t i0 = 0; i0 < n; i0 += GELU_PIECE)
        fn(out + i0, inp + i0, n - i0 < GELU_PIECE ? n - i0 : GELU_PIECE);
}

void k_gelu_forward(void *ctx, float *out, const float *inp, size_t n)
{
    (void)ctx;
    gelu_run(0, out, inp, n);
}

void k_gelu_backward(void *ctx, float *d, const float *inp, size_t n)
{
    (void)ctx;
    gelu_run(1, d, inp, n);
}

void k_residual_forward(void *ctx, float *out, const float *a, const float *b, size_t n)
{
    (void)ctx;
#pragma omp parallel for
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

void k_embed_tile_forward(void *ctx, float *out, const int32_t *tok, const float *wte, const float *wpe, int N, int T,
                          int C, int v0, int v1)
{
    (void)ctx;
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        if (tok[n] < v0 || tok[n] >= v1)
            continue;
        const float *te = wte + (size_t)(tok[n] - v0) * C, *pe = wpe + (size_t)(n % T) * C;
        float *o = out + (size_t)n * C;
        for (int i = 0; i < C; i++)
            o[i] = te[i] + pe[i];
    }
}

void k_embed_tile_backward(void *ctx, float *dwte, const float *dout, const int32_t *tok, int N, int C, int v0, int v1)
{
    (void)ctx;
    for (int n = 0; n < N; n++) { /* in row order, as k_embed_backward adds */
        if (tok[n] < v0 || tok[n] >= v1)
            continue;
        float *d = dwte + (size_t)(tok[n] - v0) * C;
        const float *g = dout + (size_t)n * C;
        for (int i = 0; i < C; i++)
            d[i] += g[i];
    }
}

/* One piece of the head's logits: l (rows x w, row stride ld) = xr (rows x C) times the piece's w rows of wte
 * (pw), transposed. */
static void head_logits(float *l, int ld, const float *xr, const float *pw, int rows, int C, int w)
{
    gemm(CblasNoTrans, CblasTrans, rows, w, C, 1.0f, xr, C, pw, C, 0.0f, l, ld, NULL);
}

/* One piece's gradient: dx (rows x C) gets dl (rows x w, stride ld) times the piece's rows of wte (pw), added in
 * piece order (the vocabulary's first piece writes), and the piece's rows of dwte (pdw) get dl^T xr. */
static void head_piece_grad(float *dx, float *pdw, const float *dl, int ld, const float *xr, const float *pw, int rows,
                            int C, int w, bool first)
{
    gemm(CblasNoTrans, CblasNoTrans, rows, C, w, 1.0f, dl, ld, pw, C, first ? 0.0f : 1.0f, dx, C, NULL);
    gemm(CblasTrans, CblasNoTrans, w, C, rows, 1.0f, dl, ld, xr, C, 1.0f, pdw, C, NULL);
}

/* The width of the piece at p0 of a range ending at end. */
static int piece_width(int p0, int end)
{
    return end - p0 < GPT_HEAD_PIECE ? end - p0 : GPT_HEAD_PIECE;
}

void k_head_loss(void *ctx, float *dx, float *dwte, float *logits, double *row_loss, const float *x, const float *wte,
                 const int32_t *targets, int N, int C, int V, int chunk, float scale)
{
    (void)ctx;
    for (int r0 = 0; r0 < N; r0 += chunk) {
        int rows = N - r0 < chunk ? N - r0 : chunk;
        const float *xr = x + (size_t)r0 * C;
        for (int v0 = 0; v0 < V; v0 += GPT_HEAD_PIECE)
            head_logits(logits + v0, V, xr, wte + (size_t)v0 * C, rows, C, piece_width(v0, V));
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
        for (int v0 = 0; dx && v0 < V; v0 += GPT_HEAD_PIECE)
            head_piece_grad(dx + (size_t)r0 * C, dwte + (size_t)v0 * C, logits + v0, V, xr, wte + (size_t)v0 * C,
                            rows, C, piece_width(v0, V), v0 == 0);
    }
}

/* One row's share of a head pass over a tile's logits l (w of them, the tile's first at vocabulary row v0). */
static void head_tile_row(gpt_head_pass pass, gpt_head_rows *st, float *l, int w, int n, int t, float scale,
                          bool first)
{
    if (pass == GPT_HEAD_MAX) {
        float mx = first ? -INFINITY : st->max[n];
        for (int v = 0; v < w; v++)
            mx = l[v] > mx ? l[v] : mx;
        st->max[n] = mx;
    } else if (pass == GPT_HEAD_SUM) {
        double sum = first ? 0 : st->sum[n];
        for (int v = 0; v < w; v++)
            sum += expf(l[v] - st->max[n]);
        st->sum[n] = sum;
        if (t >= 0 && t < w)
            st->target[n] = l[t] - st->max[n];
    } else {
        float inv = (float)(1.0 / st->sum[n]);
        for (int v = 0; v < w; v++)
            l[v] = expf(l[v] - st->max[n]) * inv * scale;
        if (t >= 0 && t < w)
            l[t] -= scale;
    }
}

void k_head_tile(void *ctx, gpt_head_pass pass, gpt_head_rows *st, float *dx, float *dwte, float *logits,
                 const float *x, const float *wte, const int32_t *targets, int N, int C, int v0, int v1, int chunk,
                 float scale)
{
    (void)ctx;
    int w = v1 - v0;
    for (int r0 = 0; r0 < N; r0 += chunk) {
        int rows = N - r0 < chunk ? N - r0 : chunk;
        const float *xr = x + (size_t)r0 * C;
        for (int p0 = v0; p0 < v1; p0 += GPT_HEAD_PIECE)
            head_logits(logits + (p0 - v0), w, xr, wte + (size_t)(p0 - v0) * C, rows, C, piece_width(p0, v1));
#pragma omp parallel for
        for (int r = 0; r < rows; r++)
            head_tile_row(pass, st, logits + (size_t)r * w, w, r0 + r, targets[r0 + r] - v0, scale, v0 == 0);
        for (int p0 = v0; pass == GPT_HEAD_GRAD && p0 < v1; p0 += GPT_HEAD_PIECE)
            head_piece_grad(dx + (size_t)r0 * C, dwte + (size_t)(p0 - v0) * C, logits + (p0 - v0), w, xr,
                            wte + (size_t)(p0 - v0) * C, rows, C, piece_width(p0, v1), p0 == 0);
    }
}

void k_head_rows_loss(const gpt_head_rows *st, double *row_loss, int N)
{
    for (int n = 0; n < N; n++)
        row_loss[n] = log(st->sum[n]) - (double)st->target[n];
}
