/*
 * The bf16 CUDA kernels (model/cuda/gpt_kernels_bf16.h) and the grouped embedding backward
 * (model/cuda/embed_backward.h) against the host kernels (model/gpt_kernels.h) run on the same bf16-rounded inputs,
 * with fresh random data, on shapes that are not multiples of a warp or of the kernels' 16-byte vectors (C = 72, 77,
 * 768; N = 1, 37, 300) and on buffers one element off 16-byte alignment (the kernels' one-element path):
 *  - bf16 outputs within their rounding (2^-8 of the magnitude) plus fp32 reordering noise, and bit for bit where the
 *    host computes the very same fp32 value before rounding (embedding, bias, residual);
 *  - fp32 outputs (LayerNorm statistics and dw / db, column sums, row losses) within fp32 reordering noise;
 *  - the embedding backward bit for bit, fp32 and bf16 dout, with many rows per token (and kcuda_embed_backward, the
 *    fp32 table's entry, which now runs on it);
 *  - the classifier ignores its padding columns (filled with 100 and NaN), zeroes them with the gradient, leaves the
 *    logits alone without it, and gives a NaN loss for a target out of range;
 *  - the LayerNorm backward and the column sum give the same bits when run twice, and the LayerNorm and the
 *    classifier the same bits on aligned buffers as one element off (their order of summation is the shapes').
 * Skips (77) without a CUDA device.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "model/cuda/embed_backward.h"
#include "model/cuda/gpt_kernels_bf16.h"
#include "model/cuda/gpt_kernels_cuda.h"
#include "model/gpt_kernels.h"
#include "testlib.h"

/* A bf16 output is the fp32 result rounded to nearest: at most half an ulp, 2^-8 of its magnitude, away from it. */
#define BF16_RTOL 3.91e-3

/* A CUDA call or launch that must succeed. After a failure the device's state says nothing more: the test ends. */
#define CU(call)                                                                                         \
    do {                                                                                                 \
        cudaError_t cu_e_ = (call);                                                                      \
        T_CHECK(cu_e_ == cudaSuccess, "%s: %s (%s)", #call, cudaGetErrorName(cu_e_),                     \
                cudaGetErrorString(cu_e_));                                                              \
        if (cu_e_ != cudaSuccess)                                                                        \
            exit(t_done());                                                                              \
    } while (0)

/* A launch, then the device's verdict on the kernels it queued. */
#define RUN(launch)                          \
    do {                                     \
        CU(launch);                          \
        CU(cudaDeviceSynchronize());         \
    } while (0)

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    T_CHECK(p != NULL, "out of memory (%zu bytes)", bytes);
    if (!p)
        exit(t_done());
    return p;
}

/* ---------------------------------------------------------------- buffers */

/* A bf16 tensor in three copies: h, the values as fp32 (what the host kernels read); b, their bits; d, on the device,
 * off elements past a 16-byte aligned allocation (off = 1 sends the kernels down their one-element path). */
typedef struct tensor {
    size_t n;
    float *h;
    uint16_t *b;
    uint16_t *base;
    void *d;
} tensor;

static void to_bf16(uint16_t *dst, const float *src, size_t n)
{
    T_OK(strata_convert(dst, STRATA_DTYPE_BF16, src, STRATA_DTYPE_FP32, n));
}

static void from_bf16(float *dst, const uint16_t *src, size_t n)
{
    T_OK(strata_convert(dst, STRATA_DTYPE_FP32, src, STRATA_DTYPE_BF16, n));
}

static void tensor_upload(tensor *x)
{
    CU(cudaMemcpy(x->d, x->b, x->n * 2, cudaMemcpyHostToDevice));
}

/* n values mean + sd * normal, rounded to bf16, on the host and the device. */
static tensor tensor_rand(size_t n, int off, float mean, float sd)
{
    tensor x = {.n = n, .h = xmalloc(n * sizeof(float)), .b = xmalloc(n * 2)};
    for (size_t i = 0; i < n; i++)
        x.h[i] = mean + sd * t_rand_normal();
    to_bf16(x.b, x.h, n);
    from_bf16(x.h, x.b, n);
    CU(cudaMalloc((void **)&x.base, (n + 8) * 2));
    x.d = x.base + off;
    tensor_upload(&x);
    return x;
}

/* The device's copy into x->b, and into out as fp32. */
static void tensor_read(tensor *x, float *out)
{
    CU(cudaMemcpy(x->b, x->d, x->n * 2, cudaMemcpyDeviceToHost));
    from_bf16(out, x->b, x->n);
}

static void tensor_free(tensor *x)
{
    free(x->h);
    free(x->b);
    CU(cudaFree(x->base));
}

/* n floats on the device, a copy of h (left unset when h is NULL). */
static float *dev_f32(const float *h, size_t n)
{
    float *d = NULL;
    CU(cudaMalloc((void **)&d, (n ? n : 1) * sizeof(float)));
    if (h && n)
        CU(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

static void read_f32(float *h, const float *d, size_t n)
{
    CU(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
}

static float *rand_f32(size_t n, float sd)
{
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = sd * t_rand_normal();
    return x;
}

static float *copy_f32(const float *x, size_t n)
{
    float *y = xmalloc(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

static double max_abs(const float *x, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs((double)x[i]));
    return m;
}

/* ---------------------------------------------------------------- comparisons */

/* |got - ref| <= rtol |ref| + atol (atol: one value, or one per element when atols is not NULL) for every element. */
static void check_close_v(const char *what, const float *got, const double *ref, size_t n, double rtol, double atol,
                          const double *atols)
{
    size_t bad = 0, at = 0;
    double worst = 0, worst_tol = 0, max_diff = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]), tol = rtol * fabs(ref[i]) + (atols ? atols[i] : atol);
        max_diff = fmax(max_diff, d);
        if (!(d <= tol)) {
            if (bad == 0 || d / tol > worst / worst_tol || isnan(d)) {
                at = i;
                worst = d;
                worst_tol = tol;
            }
            bad++;
        }
    }
    T_CHECK(bad == 0,
            "%s: %zu of %zu elements beyond tolerance; max |diff| %.3g; worst [%zu]: got %.9g, expected %.9g, "
            "|diff| %.3g > tol %.3g (%.3g relative + %.3g)",
            what, bad, n, max_diff, at, got[at], ref[at], worst, worst_tol, rtol, atols ? atols[at] : atol);
}

static void check_close(const char *what, const float *got, const float *ref, size_t n, double rtol, double atol)
{
    double *r = xmalloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        r[i] = ref[i];
    check_close_v(what, got, r, n, rtol, atol, NULL);
    free(r);
}

/* Bit for bit; prints the first difference. */
static void check_same(const char *what, const void *got, const void *ref, size_t n, size_t elem_bytes)
{
    const unsigned char *g = got, *r = ref;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(g + i * elem_bytes, r + i * elem_bytes, elem_bytes) != 0 && bad++ == 0)
            first = i;
    unsigned long long gv = 0, rv = 0;
    if (bad) {
        memcpy(&gv, g + first * elem_bytes, elem_bytes);
        memcpy(&rv, r + first * elem_bytes, elem_bytes);
    }
    T_CHECK(bad == 0, "%s: %zu of %zu elements differ; first [%zu]: bits 0x%llx, expected 0x%llx", what, bad, n, first,
            gv, rv);
}

/* The host's fp32 values rounded to bf16, against the device's bf16 bits. */
static void check_bf16_exact(const char *what, const uint16_t *got, const float *ref, size_t n)
{
    uint16_t *r = xmalloc(n * 2);
    to_bf16(r, ref, n);
    check_same(what, got, r, n, 2);
    free(r);
}

/* ---------------------------------------------------------------- embedding forward */

static void test_embed_forward(int N, int T, int C, int V, int off)
{
    char what[96];
    snprintf(what, sizeof what, "embed_forward N %d T %d C %d off %d", N, T, C, off);
    tensor wte = tensor_rand((size_t)V * C, off, 0, 0.5f), wpe = tensor_rand((size_t)T * C, off, 0, 0.5f);
    tensor out = tensor_rand((size_t)N * C, off, 0, 1);
    int32_t *tok = xmalloc((size_t)N * sizeof(int32_t)), *dtok = NULL;
    for (int n = 0; n < N; n++)
        tok[n] = (int32_t)t_rand_range(0, (size_t)V - 1);
    CU(cudaMalloc((void **)&dtok, (size_t)N * sizeof(int32_t)));
    CU(cudaMemcpy(dtok, tok, (size_t)N * sizeof(int32_t), cudaMemcpyHostToDevice));
    RUN(kbf16_embed_forward(out.d, dtok, wte.d, wpe.d, N, T, C, 0));

    float *ref = xmalloc(out.n * sizeof(float)), *got = xmalloc(out.n * sizeof(float));
    k_embed_forward(NULL, ref, tok, wte.h, wpe.h, N, T, C);
    tensor_read(&out, got);
    check_bf16_exact(what, out.b, ref, out.n);

    free(ref);
    free(got);
    free(tok);
    CU(cudaFree(dtok));
    tensor_free(&wte);
    tensor_free(&wpe);
    tensor_free(&out);
}

/* ---------------------------------------------------------------- layernorm */

static void test_layernorm(int N, int C, int off)
{
    char what[128];
    size_t n = (size_t)N * C;
    tensor inp = tensor_rand(n, off, 0.5f, 2), w = tensor_rand((size_t)C, off, 1, 0.1f);
    tensor b = tensor_rand((size_t)C, off, 0, 0.1f), out = tensor_rand(n, off, 0, 1);
    float *dmean = dev_f32(NULL, (size_t)N), *drstd = dev_f32(NULL, (size_t)N);

    /* Forward. */
    RUN(kbf16_layernorm_forward(out.d, dmean, drstd, inp.d, w.d, b.d, N, C, 0));
    float *ref = xmalloc(n * sizeof(float)), *got = xmalloc(n * sizeof(float));
    float *mean = xmalloc((size_t)N * sizeof(float)), *rstd = xmalloc((size_t)N * sizeof(float));
    float *gmean = xmalloc((size_t)N * sizeof(float)), *grstd = xmalloc((size_t)N * sizeof(float));
    k_layernorm_forward(NULL, ref, mean, rstd, inp.h, w.h, b.h, N, C);
    tensor_read(&out, got);
    read_f32(gmean, dmean, (size_t)N);
    read_f32(grstd, drstd, (size_t)N);
    snprintf(what, sizeof what, "layernorm_forward N %d C %d off %d: out", N, C, off);
    check_close(what, got, ref, n, BF16_RTOL, 1e-4);
    snprintf(what, sizeof what, "layernorm_forward N %d C %d off %d: mean", N, C, off);
    check_close(what, gmean, mean, (size_t)N, 1e-5, 1e-5 * max_abs(inp.h, n));
    snprintf(what, sizeof what, "layernorm_forward N %d C %d off %d: rstd", N, C, off);
    check_close(what, grstd, rstd, (size_t)N, 1e-5, 0);

    /* Backward from the host's statistics, so that both sides see the same mean and rstd. */
    CU(cudaMemcpy(dmean, mean, (size_t)N * sizeof(float), cudaMemcpyHostToDevice));
    CU(cudaMemcpy(drstd, rstd, (size_t)N * sizeof(float), cudaMemcpyHostToDevice));
    tensor dout = tensor_rand(n, off, 0, 1), dinp = tensor_rand(n, off, 0, 1);
    float *dw0 = rand_f32((size_t)C, 1), *db0 = rand_f32((size_t)C, 1);
    float *ddw = dev_f32(dw0, (size_t)C), *ddb = dev_f32(db0, (size_t)C);
    RUN(kbf16_layernorm_backward(dinp.d, ddw, ddb, dout.d, inp.d, w.d, dmean, drstd, N, C, 0));

    float *rdinp = copy_f32(dinp.h, n), *rdw = copy_f32(dw0, (size_t)C), *rdb = copy_f32(db0, (size_t)C);
    k_layernorm_backward(NULL, rdinp, rdw, rdb, dout.h, inp.h, w.h, mean, rstd, N, C);
    float *gdw = xmalloc((size_t)C * sizeof(float)), *gdb = xmalloc((size_t)C * sizeof(float));
    uint16_t *first_dinp = xmalloc(n * 2);
    tensor_read(&dinp, got);
    memcpy(first_dinp, dinp.b, n * 2);
    read_f32(gdw, ddw, (size_t)C);
    read_f32(gdb, ddb, (size_t)C);
    snprintf(what, sizeof what, "layernorm_backward N %d C %d off %d: dinp", N, C, off);
    check_close(what, got, rdinp, n, BF16_RTOL, 1e-4);

    /* dw and db are fp32 sums over the rows in another order: within a few ulps of the sum of their terms' sizes. */
    double *rw = xmalloc((size_t)C * sizeof(double)), *rb = xmalloc((size_t)C * sizeof(double));
    double *tw = xmalloc((size_t)C * sizeof(double)), *tb = xmalloc((size_t)C * sizeof(double));
    for (int c = 0; c < C; c++) {
        double mw = fabs(dw0[c]), mb = fabs(db0[c]);
        for (int r = 0; r < N; r++) {
            size_t at = (size_t)r * C + c;
            mw += fabs((double)dout.h[at] * (inp.h[at] - mean[r]) * rstd[r]);
            mb += fabs((double)dout.h[at]);
        }
        rw[c] = rdw[c];
        rb[c] = rdb[c];
        tw[c] = 1e-6 * mw;
        tb[c] = 1e-6 * mb;
    }
    snprintf(what, sizeof what, "layernorm_backward N %d C %d off %d: dw", N, C, off);
    check_close_v(what, gdw, rw, (size_t)C, 0, 0, tw);
    snprintf(what, sizeof what, "layernorm_backward N %d C %d off %d: db", N, C, off);
    check_close_v(what, gdb, rb, (size_t)C, 0, 0, tb);

    /* The same call on the same data again: the same bits. */
    to_bf16(dinp.b, dinp.h, n); /* h still holds the initial values */
    tensor_upload(&dinp);
    CU(cudaMemcpy(ddw, dw0, (size_t)C * sizeof(float), cudaMemcpyHostToDevice));
    CU(cudaMemcpy(ddb, db0, (size_t)C * sizeof(float), cudaMemcpyHostToDevice));
    RUN(kbf16_layernorm_backward(dinp.d, ddw, ddb, dout.d, inp.d, w.d, dmean, drstd, N, C, 0));
    float *gdw2 = xmalloc((size_t)C * sizeof(float)), *gdb2 = xmalloc((size_t)C * sizeof(float));
    tensor_read(&dinp, got);
    read_f32(gdw2, ddw, (size_t)C);
    read_f32(gdb2, ddb, (size_t)C);
    snprintf(what, sizeof what, "layernorm_backward N %d C %d off %d twice: dinp", N, C, off);
    check_same(what, dinp.b, first_dinp, n, 2);
    snprintf(what, sizeof what, "layernorm_backward N %d C %d off %d twice: dw", N, C, off);
    check_same(what, gdw2, gdw, (size_t)C, sizeof(float));
    snprintf(what, sizeof what, "layernorm_backward N %d C %d off %d twice: db", N, C, off);
    check_same(what, gdb2, gdb, (size_t)C, sizeof(float));

    free(ref);
    free(got);
    free(mean);
    free(rstd);
    free(gmean);
    free(grstd);
    free(dw0);
    free(db0);
    free(rdinp);
    free(rdw);
    free(rdb);
    free(gdw);
    free(gdb);
    free(gdw2);
    free(gdb2);
    free(first_dinp);
    free(rw);
    free(rb);
    free(tw);
    free(tb);
    CU(cudaFree(dmean));
    CU(cudaFree(drstd));
    CU(cudaFree(ddw));
    CU(cudaFree(ddb));
    tensor_free(&inp);
    tensor_free(&w);
    tensor_free(&b);
    tensor_free(&out);
    tensor_free(&dout);
    tensor_free(&dinp);
}

/* ---------------------------------------------------------------- bias and column sums */

static void test_add_bias(int N, int OC, int off)
{
    char what[96];
    snprintf(what, sizeof what, "add_bias N %d OC %d off %d", N, OC, off);
    size_t n = (size_t)N * OC;
    tensor out = tensor_rand(n, off, 0, 1), bias = tensor_rand((size_t)OC, off, 0, 1);
    RUN(kbf16_add_bias(out.d, bias.d, N, OC, 0));
    float *ref = xmalloc(n * sizeof(float)), *got = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        ref[i] = out.h[i] + bias.h[i % OC];
    tensor_read(&out, got);
    check_bf16_exact(what, out.b, ref, n);
    free(ref);
    free(got);
    tensor_free(&out);
    tensor_free(&bias);
}

static void test_colsum(int N, int C, int off)
{
    char what[96];
    tensor src = tensor_rand((size_t)N * C, off, 0.25f, 1);
    float *dst0 = rand_f32((size_t)C, 1), *ddst = dev_f32(dst0, (size_t)C);
    RUN(kbf16_colsum_add(ddst, src.d, N, C, 0));
    float *got = xmalloc((size_t)C * sizeof(float)), *got2 = xmalloc((size_t)C * sizeof(float));
    read_f32(got, ddst, (size_t)C);

    double *ref = xmalloc((size_t)C * sizeof(double)), *tol = xmalloc((size_t)C * sizeof(double));
    for (int c = 0; c < C; c++) {
        double s = dst0[c], m = fabs(dst0[c]);
        for (int r = 0; r < N; r++) {
            s += src.h[(size_t)r * C + c];
            m += fabs((double)src.h[(size_t)r * C + c]);
        }
        ref[c] = s;
        tol[c] = 1e-6 * m;
    }
    snprintf(what, sizeof what, "colsum_add N %d C %d off %d", N, C, off);
    check_close_v(what, got, ref, (size_t)C, 0, 0, tol);

    CU(cudaMemcpy(ddst, dst0, (size_t)C * sizeof(float), cudaMemcpyHostToDevice));
    RUN(kbf16_colsum_add(ddst, src.d, N, C, 0));
    read_f32(got2, ddst, (size_t)C);
    snprintf(what, sizeof what, "colsum_add N %d C %d off %d twice", N, C, off);
    check_same(what, got2, got, (size_t)C, sizeof(float));

    free(dst0);
    free(got);
    free(got2);
    free(ref);
    free(tol);
    CU(cudaFree(ddst));
    tensor_free(&src);
}

/* ---------------------------------------------------------------- elementwise */

/* GELU forward, out of place or in place. The host's tanh is within 2e-7 of tanhf (absolute), hence the absolute
 * slack, a few times 0.5 |x| 2e-7 for the |x| <= 11 that sd 2 draws. */
static void test_gelu_forward(size_t n, int off, int in_place)
{
    char what[96];
    snprintf(what, sizeof what, "gelu_forward n %zu off %d%s", n, off, in_place ? " in place" : "");
    tensor inp = tensor_rand(n, off, 0, 2), out = tensor_rand(n, off, 0, 1);
    tensor *res = in_place ? &inp : &out;
    RUN(kbf16_gelu_forward(res->d, inp.d, n, 0));
    float *ref = xmalloc(n * sizeof(float)), *got = xmalloc(n * sizeof(float));
    k_gelu_forward(NULL, ref, inp.h, n);
    tensor_read(res, got);
    check_close(what, got, ref, n, BF16_RTOL, 5e-6);
    free(ref);
    free(got);
    tensor_free(&inp);
    tensor_free(&out);
}

/* The derivative multiplies that tanh error by up to ~5 |x| (at |x| ~ 4) and by |d|: a few 1e-6. */
static void test_gelu_backward(size_t n, int off)
{
    char what[96];
    snprintf(what, sizeof what, "gelu_backward n %zu off %d", n, off);
    tensor inp = tensor_rand(n, off, 0, 2), d = tensor_rand(n, off, 0, 1);
    RUN(kbf16_gelu_backward(d.d, inp.d, n, 0));
    float *ref = copy_f32(d.h, n), *got = xmalloc(n * sizeof(float));
    k_gelu_backward(NULL, ref, inp.h, n);
    tensor_read(&d, got);
    check_close(what, got, ref, n, BF16_RTOL, 3e-5);
    free(ref);
    free(got);
    tensor_free(&inp);
    tensor_free(&d);
}

/* out = a + b, into a third buffer or into a. */
static void test_residual(size_t n, int off, int in_place)
{
    char what[96];
    snprintf(what, sizeof what, "residual_forward n %zu off %d%s", n, off, in_place ? " in place" : "");
    tensor a = tensor_rand(n, off, 0, 1), b = tensor_rand(n, off, 0, 1), out = tensor_rand(n, off, 0, 1);
    tensor *res = in_place ? &a : &out;
    RUN(kbf16_residual_forward(res->d, a.d, b.d, n, 0));
    float *ref = xmalloc(n * sizeof(float)), *got = xmalloc(n * sizeof(float));
    k_residual_forward(NULL, ref, a.h, b.h, n);
    tensor_read(res, got);
    check_bf16_exact(what, res->b, ref, n);
    free(ref);
    free(got);
    tensor_free(&a);
    tensor_free(&b);
    tensor_free(&out);
}

/* ---------------------------------------------------------------- embedding backward */

enum tokens { TOK_SPREAD, TOK_SAME };

/* dwte and dwpe from fp32 dout (kcuda_embed_backward_grouped and kcuda_embed_backward) and from bf16 dout, each bit
 * for bit the host's on the same dout (the bf16 one widened). Tokens from a vocabulary of V, or all one token. */
static void test_embed_backward(int N, int T, int C, int V, enum tokens mode)
{
    char what[128];
    size_t n = (size_t)N * C, nte = (size_t)V * C, npe = (size_t)T * C;
    int32_t *tok = xmalloc((size_t)N * sizeof(int32_t)), *dtok = NULL;
    int32_t same = (int32_t)t_rand_range(0, (size_t)V - 1);
    for (int r = 0; r < N; r++)
        tok[r] = mode == TOK_SAME ? same : (int32_t)t_rand_range(0, (size_t)V - 1);
    CU(cudaMalloc((void **)&dtok, (size_t)N * sizeof(int32_t)));
    CU(cudaMemcpy(dtok, tok, (size_t)N * sizeof(int32_t), cudaMemcpyHostToDevice));
    float *dwte0 = rand_f32(nte, 1), *dwpe0 = rand_f32(npe, 1), *dout = rand_f32(n, 1);
    float *ddwte = dev_f32(NULL, nte), *ddwpe = dev_f32(NULL, npe), *ddout = dev_f32(dout, n);
    float *gte = xmalloc(nte * sizeof(float)), *gpe = xmalloc(npe * sizeof(float));
    const char *mode_name = mode == TOK_SAME ? "one token" : "spread";
    static const char *pass_name[] = {"grouped fp32", "kcuda_embed_backward", "grouped bf16"};

    for (int pass = 0; pass < 3; pass++) {
        /* 0: grouped fp32; 1: kcuda_embed_backward; 2: grouped bf16 (dout rounded, on the host too). */
        float *rte = copy_f32(dwte0, nte), *rpe = copy_f32(dwpe0, npe), *hout = copy_f32(dout, n);
        uint16_t *b16 = NULL;
        void *dd = ddout;
        if (pass == 2) {
            b16 = xmalloc(n * 2);
            to_bf16(b16, dout, n);
            from_bf16(hout, b16, n);
            CU(cudaMalloc(&dd, n * 2));
            CU(cudaMemcpy(dd, b16, n * 2, cudaMemcpyHostToDevice));
        }
        CU(cudaMemcpy(ddwte, dwte0, nte * sizeof(float), cudaMemcpyHostToDevice));
        CU(cudaMemcpy(ddwpe, dwpe0, npe * sizeof(float), cudaMemcpyHostToDevice));
        if (pass == 0)
            RUN(kcuda_embed_backward_grouped(ddwte, ddwpe, dd, KCUDA_F32, dtok, N, T, C, 0));
        else if (pass == 1)
            RUN(kcuda_embed_backward(ddwte, ddwpe, ddout, dtok, N, T, C, 0));
        else
            RUN(kcuda_embed_backward_grouped(ddwte, ddwpe, dd, KCUDA_BF16, dtok, N, T, C, 0));
        k_embed_backward(NULL, rte, rpe, hout, tok, N, T, C);
        read_f32(gte, ddwte, nte);
        read_f32(gpe, ddwpe, npe);
        snprintf(what, sizeof what, "embed_backward %s N %d T %d C %d V %d %s: dwte", pass_name[pass], N, T, C, V,
                 mode_name);
        check_same(what, gte, rte, nte, sizeof(float));
        snprintf(what, sizeof what, "embed_backward %s N %d T %d C %d V %d %s: dwpe", pass_name[pass], N, T, C, V,
                 mode_name);
        check_same(what, gpe, rpe, npe, sizeof(float));
        if (pass == 2) {
            free(b16);
            CU(cudaFree(dd));
        }
        free(rte);
        free(rpe);
        free(hout);
    }

    free(tok);
    free(dwte0);
    free(dwpe0);
    free(dout);
    free(gte);
    free(gpe);
    CU(cudaFree(dtok));
    CU(cudaFree(ddwte));
    CU(cudaFree(ddwpe));
    CU(cudaFree(ddout));
}

/* ---------------------------------------------------------------- classifier */

/* A row loss is an fp32 sum of exponentials, logged in double: within a few ulps of fp32 of the double reference. */
#define LOSS_TOL(want) (2e-5 + 1e-6 * fabs(want))

/* rows rows of V logits at row stride ld, padding filled with 100 and NaN (either would spoil the softmax if read).
 * The reference is computed in double from the bf16 logits. Row 0's target is V and row 1's is -1 (NaN losses, no
 * subtraction) when there are more than two rows. */
static void test_classifier(int rows, int V, int ld, int off, int with_grad)
{
    char what[128];
    size_t n = (size_t)rows * ld;
    float scale = 1.0f / (float)rows;
    tensor l = tensor_rand(n, off, 0, 3);
    for (int r = 0; r < rows; r++)
        for (int v = V; v < ld; v++)
            l.b[(size_t)r * ld + v] = (v & 1) ? 0x7fc0 : 0x42c8; /* NaN, 100.0 */
    from_bf16(l.h, l.b, n);
    tensor_upload(&l);
    int32_t *tgt = xmalloc((size_t)rows * sizeof(int32_t)), *dtgt = NULL;
    for (int r = 0; r < rows; r++)
        tgt[r] = (int32_t)t_rand_range(0, (size_t)V - 1);
    if (rows > 2) {
        tgt[0] = V;
        tgt[1] = -1;
    }
    CU(cudaMalloc((void **)&dtgt, (size_t)rows * sizeof(int32_t)));
    CU(cudaMemcpy(dtgt, tgt, (size_t)rows * sizeof(int32_t), cudaMemcpyHostToDevice));
    double *dloss = NULL;
    CU(cudaMalloc((void **)&dloss, (size_t)rows * sizeof(double)));
    RUN(kbf16_classifier(l.d, dloss, dtgt, rows, V, ld, scale, with_grad, 0));

    double *loss = xmalloc((size_t)rows * sizeof(double));
    CU(cudaMemcpy(loss, dloss, (size_t)rows * sizeof(double), cudaMemcpyDeviceToHost));
    uint16_t *before = xmalloc(n * 2); /* the bits uploaded */
    memcpy(before, l.b, n * 2);
    float *got = xmalloc(n * sizeof(float)), *gl = xmalloc((size_t)V * sizeof(float));
    double *ref = xmalloc((size_t)V * sizeof(double));
    tensor_read(&l, got);

    size_t bad_loss = 0, bad_pad = 0, bad_at = 0;
    int worst_row = 0;
    double max_loss_diff = 0, worst_want = 0;
    for (int r = 0; r < rows; r++) {
        const float *x = l.h + (size_t)r * ld;
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < V; v++)
            mx = fmax(mx, x[v]);
        for (int v = 0; v < V; v++)
            sum += exp(x[v] - mx);
        int t = tgt[r], ok = t >= 0 && t < V;
        if (ok) {
            double want = log(sum) - (x[t] - mx), d = fabs(loss[r] - want);
            if (!(d <= LOSS_TOL(want)))
                bad_loss++;
            if (!(d <= max_loss_diff)) {
                max_loss_diff = d;
                worst_row = r;
                worst_want = want;
            }
        } else {
            T_CHECK(isnan(loss[r]), "classifier rows %d V %d ld %d: row %d target %d out of range: loss %.9g, not NaN",
                    rows, V, ld, r, t, loss[r]);
        }
        if (!with_grad)
            continue;
        for (int v = 0; v < V; v++) {
            ref[v] = scale * (exp(x[v] - mx) / sum - (ok && v == t ? 1.0 : 0.0));
            gl[v] = got[(size_t)r * ld + v];
        }
        snprintf(what, sizeof what, "classifier rows %d V %d ld %d off %d: row %d gradient", rows, V, ld, off, r);
        check_close_v(what, gl, ref, (size_t)V, BF16_RTOL + 2e-6, 1e-6 * scale, NULL);
        for (int v = V; v < ld; v++)
            if (l.b[(size_t)r * ld + v] != 0 && bad_pad++ == 0)
                bad_at = (size_t)r * ld + v;
    }
    T_CHECK(bad_loss == 0,
            "classifier rows %d V %d ld %d off %d: %zu rows with a wrong loss; worst row %d: %.9f, expected %.9f "
            "(|diff| %.3g > tol %.3g)",
            rows, V, ld, off, bad_loss, worst_row, loss[worst_row], worst_want, max_loss_diff, LOSS_TOL(worst_want));
    if (with_grad) {
        T_CHECK(bad_pad == 0,
                "classifier rows %d V %d ld %d off %d: %zu padding columns not zeroed; first [%zu] = 0x%x", rows, V,
                ld, off, bad_pad, bad_at, bad_pad ? l.b[bad_at] : 0);
    } else {
        snprintf(what, sizeof what, "classifier rows %d V %d ld %d off %d without gradient: logits", rows, V, ld, off);
        check_same(what, l.b, before, n, 2);
    }
    printf("classifier rows %d V %d ld %d off %d grad %d: max |loss diff| %.3g\n", rows, V, ld, off, with_grad,
           max_loss_diff);

    free(tgt);
    free(loss);
    free(before);
    free(got);
    free(gl);
    free(ref);
    CU(cudaFree(dtgt));
    CU(cudaFree(dloss));
    tensor_free(&l);
}

/* ---------------------------------------------------------------- alignment */

/* x's values (as created: before any read into x->b) on the device again, off elements past an aligned start. */
static tensor tensor_clone(const tensor *x, int off)
{
    tensor y = {.n = x->n, .h = copy_f32(x->h, x->n), .b = xmalloc(x->n * 2)};
    memcpy(y.b, x->b, x->n * 2);
    CU(cudaMalloc((void **)&y.base, (x->n + 8) * 2));
    y.d = y.base + off;
    tensor_upload(&y);
    return y;
}

enum { A_INP, A_W, A_B, A_OUT, A_DOUT, A_DINP, A_LOGITS, A_COUNT };

/* The same data through the 16-byte path (aligned buffers) and the one-element path (every buffer one element off):
 * the same bits from the LayerNorm forward and backward and the classifier, since which thread sums which element
 * depends on the shapes only. */
static void test_alignment(int N, int C, int V, int ld)
{
    char what[128];
    size_t n = (size_t)N * C, sizes[A_COUNT] = {n, (size_t)C, (size_t)C, n, n, n, (size_t)N * ld};
    static const float sd[A_COUNT] = {2, 0.1f, 0.1f, 1, 1, 1, 3};
    static const char *name[A_COUNT] = {"inp", "w", "b", "ln out", "dout", "dinp", "classifier gradient"};
    tensor t[2][A_COUNT];
    for (int i = 0; i < A_COUNT; i++) {
        t[0][i] = tensor_rand(sizes[i], 0, i == A_W ? 1.0f : 0.0f, sd[i]);
        t[1][i] = tensor_clone(&t[0][i], 1);
    }
    int32_t *tgt = xmalloc((size_t)N * sizeof(int32_t)), *dtgt = NULL;
    for (int r = 0; r < N; r++)
        tgt[r] = (int32_t)t_rand_range(0, (size_t)V - 1);
    CU(cudaMalloc((void **)&dtgt, (size_t)N * sizeof(int32_t)));
    CU(cudaMemcpy(dtgt, tgt, (size_t)N * sizeof(int32_t), cudaMemcpyHostToDevice));
    float *zeros = xmalloc((size_t)(N > C ? N : C) * sizeof(float));
    memset(zeros, 0, (size_t)(N > C ? N : C) * sizeof(float));
    float *stats[2][4], *hstats[2][4]; /* mean, rstd, dw, db */
    double *dloss[2], *loss[2];
    for (int k = 0; k < 2; k++) {
        tensor *x = t[k];
        for (int j = 0; j < 4; j++) {
            size_t len = j < 2 ? (size_t)N : (size_t)C;
            stats[k][j] = dev_f32(zeros, len);
            hstats[k][j] = xmalloc(len * sizeof(float));
        }
        CU(cudaMalloc((void **)&dloss[k], (size_t)N * sizeof(double)));
        loss[k] = xmalloc((size_t)N * sizeof(double));
        RUN(kbf16_layernorm_forward(x[A_OUT].d, stats[k][0], stats[k][1], x[A_INP].d, x[A_W].d, x[A_B].d, N, C, 0));
        RUN(kbf16_layernorm_backward(x[A_DINP].d, stats[k][2], stats[k][3], x[A_DOUT].d, x[A_INP].d, x[A_W].d,
                                     stats[k][0], stats[k][1], N, C, 0));
        RUN(kbf16_classifier(x[A_LOGITS].d, dloss[k], dtgt, N, V, ld, 1.0f, 1, 0));
        float *scratch = xmalloc(sizes[A_LOGITS] * sizeof(float));
        for (int i = A_OUT; i < A_COUNT; i++)
            if (i != A_DOUT)
                tensor_read(&x[i], scratch);
        free(scratch);
        for (int j = 0; j < 4; j++)
            read_f32(hstats[k][j], stats[k][j], j < 2 ? (size_t)N : (size_t)C);
        CU(cudaMemcpy(loss[k], dloss[k], (size_t)N * sizeof(double), cudaMemcpyDeviceToHost));
    }
    for (int i = A_OUT; i < A_COUNT; i++) {
        if (i == A_DOUT)
            continue;
        snprintf(what, sizeof what, "N %d C %d V %d ld %d, aligned vs one element off: %s", N, C, V, ld, name[i]);
        check_same(what, t[1][i].b, t[0][i].b, sizes[i], 2);
    }
    static const char *stat_name[4] = {"mean", "rstd", "dw", "db"};
    for (int j = 0; j < 4; j++) {
        snprintf(what, sizeof what, "N %d C %d, aligned vs one element off: %s", N, C, stat_name[j]);
        check_same(what, hstats[1][j], hstats[0][j], j < 2 ? (size_t)N : (size_t)C, sizeof(float));
    }
    snprintf(what, sizeof what, "N %d V %d ld %d, aligned vs one element off: row losses", N, V, ld);
    check_same(what, loss[1], loss[0], (size_t)N, sizeof(double));

    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < A_COUNT; i++)
            tensor_free(&t[k][i]);
        for (int j = 0; j < 4; j++) {
            CU(cudaFree(stats[k][j]));
            free(hstats[k][j]);
        }
        CU(cudaFree(dloss[k]));
        free(loss[k]);
    }
    CU(cudaFree(dtgt));
    free(tgt);
    free(zeros);
}

/* ---------------------------------------------------------------- main */

int main(void)
{
    int devices = 0;
    cudaError_t e = cudaGetDeviceCount(&devices);
    if (e != cudaSuccess)
        t_skip("no CUDA device: cudaGetDeviceCount gives %s", cudaGetErrorName(e));
    if (devices == 0)
        t_skip("no CUDA device: cudaGetDeviceCount gives 0");
    t_rng_seed(); /* printed now, before the first data it draws: STRATA_TEST_SEED repeats the run */

    static const struct {
        int N, C;
    } rows[] = {{1, 72}, {37, 77}, {300, 768}, {37, 72}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        for (int off = 0; off < 2; off++) {
            int N = rows[i].N, C = rows[i].C;
            test_embed_forward(N, 16, C, 100, off);
            test_layernorm(N, C, off);
            test_add_bias(N, C, off);
            test_colsum(N, C, off);
            test_gelu_forward((size_t)N * C, off, 0);
            test_gelu_forward((size_t)N * C + 3, off, 1);
            test_gelu_backward((size_t)N * C, off);
            test_residual((size_t)N * C, off, 0);
            test_residual((size_t)N * C + 5, off, 1);
        }
    test_add_bias(5, 2304, 0);
    test_colsum(1000, 72, 0);
    printf("embedding, layernorm, bias, column sums, gelu, residual: done\n");

    static const struct {
        int N, T, C, V;
        enum tokens mode;
    } emb[] = {
        {1, 1, 72, 5, TOK_SPREAD},       {37, 16, 77, 5, TOK_SPREAD},     {37, 37, 72, 50, TOK_SAME},
        {1000, 128, 768, 5, TOK_SPREAD}, {1000, 300, 77, 1000, TOK_SPREAD}, {1000, 64, 72, 7, TOK_SAME},
        {3000, 1024, 72, 7, TOK_SPREAD}, {4100, 1024, 64, 50257, TOK_SPREAD},
    };
    for (size_t i = 0; i < sizeof emb / sizeof emb[0]; i++)
        test_embed_backward(emb[i].N, emb[i].T, emb[i].C, emb[i].V, emb[i].mode);
    printf("embedding backward: done\n");

    test_classifier(4, 50257, 50304, 0, 1);
    test_classifier(37, 100, 128, 0, 1);
    test_classifier(37, 100, 128, 0, 0);
    test_classifier(37, 100, 128, 1, 1);
    test_classifier(5, 77, 77, 0, 1);
    test_classifier(1, 50257, 50304, 1, 1);
    printf("classifier: done\n");

    test_alignment(37, 72, 100, 128);
    test_alignment(64, 768, 50257, 50304);
    printf("alignment: done\n");
    return t_done();
}
