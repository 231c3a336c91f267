/* Host kernels of the GPT model (see gpt_kernels.h). The formulas are GPT-2's, as in llm.c's reference
 * train_gpt2.c, with the matrix products on OpenBLAS. */
#include "model/gpt_kernels.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

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
    for (int i = 0; i < C; i++) {
        float sw = 0, sb = 0;
        for (int n = 0; n < N; n++) {
            float g = dout[(size_t)n * C + i];
            sw += g * (inp[(size_t)n * C + i] - mean[n]) * rstd[n];
            sb += g;
        }
        dw[i] += sw;
        db[i] += sb;
    }
}

void k_linear_forward(void *ctx, float *out, const float *inp, const float *W, const float *bias, int N, int C, int OC)
{
    (void)ctx;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, W, C, 0.0f, out, OC);
    if (!bias)
        return;
#pragma omp parallel for
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++)
            out[(size_t)n * OC + o] += bias[o];
}

void k_linear_backward(void *ctx, float *dinp, float *dW, float *dbias, const float *dout, const float *inp,
                       const float *W, int N, int C, int OC)
{
    (void)ctx;
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, W, C, 1.0f, dinp, C);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dW, C);
    if (!dbias)
        return;
#pragma omp parallel for
    for (int o = 0; o < OC; o++) {
        float s = 0;
        for (int n = 0; n < N; n++)
            s += dout[(size_t)n * OC + o];
        dbias[o] += s;
    }
}

void k_attention_forward(void *ctx, float *out, float *att, const float *qkv, int B, int T, int C, int NH)
{
    (void)ctx;
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
            float *a = att + ((size_t)b * NH + h) * T * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, C3, k, C3, 0.0f, a, T);
#pragma omp parallel for
            for (int i = 0; i < T; i++) {
                float *row = a + (size_t)i * T, mx = -INFINITY, sum = 0;
                for (int j = 0; j <= i; j++)
                    mx = row[j] > mx ? row[j] : mx;
                for (int j = 0; j <= i; j++) {
                    row[j] = expf(row[j] - mx);
                    sum += row[j];
                }
                for (int j = 0; j <= i; j++)
                    row[j] /= sum;
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
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
            float *dq = dqkv + (size_t)b * T * C3 + h * hs, *dk = dq + C, *dv = dq + 2 * C;
            const float *a = att + ((size_t)b * NH + h) * T * T, *g = dout + (size_t)b * T * C + h * hs;
            float *da = scratch;
            /* da = dout v^T, dv = a^T dout */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, g, C, v, C3, 0.0f, da, T);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, g, C, 0.0f, dv, C3);
            /* Through the softmax: dpre = a * (da - sum(a * da)), zero above the diagonal. */
#pragma omp parallel for
            for (int i = 0; i < T; i++) {
                const float *ar = a + (size_t)i * T;
                float *dr = da + (size_t)i * T, dot = 0;
                for (int j = 0; j <= i; j++)
                    dot += ar[j] * dr[j];
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
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + 0.044715f * x * x * x)));
    }
}

void k_gelu_backward(void *ctx, float *d, const float *inp, size_t n)
{
    (void)ctx;
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float x = inp[i], u = GELU_SCALE * (x + 0.044715f * x * x * x), th = tanhf(u);
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
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, V, C, 1.0f, xr, C, wte, C, 0.0f, logits, V);
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
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, C, V, 1.0f, logits, V, wte, C, 0.0f,
                        dx + (size_t)r0 * C, C);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, rows, 1.0f, logits, V, xr, C, 1.0f, dwte, C);
        }
    }
}
