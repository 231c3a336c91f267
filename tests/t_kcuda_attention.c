/*
 * The flash attention kernels (model/cuda/attention_flash.cu) against the host attention of the model
 * (k_attention_forward / k_attention_backward, which keep the T x T probabilities: the oracle), on shapes that are not
 * multiples of the 32-row tile and head sizes from 1 to KCUDA_FLASH_MAX_HEAD:
 *  - fp32: out and dqkv within fp32 reordering noise of the oracle, lse within it of a sum in double;
 *  - bf16: qkv and dout rounded to bf16 on the host and the oracle run in fp32 on the rounded values: out within one
 *    bf16 rounding, lse as close as in fp32 (the same math on the same values), dq, dk and dv by cosine and a bound;
 *  - every output element is written (the buffers start as NaN) and a second run gives the same bits;
 *  - a shape the kernels do not take (head size over KCUDA_FLASH_MAX_HEAD, C % NH != 0, NH < 1) is refused with
 *    cudaErrorInvalidValue and nothing runs.
 * Skips (77) without a CUDA device. STRATA_KCUDA_SHAPES=quick runs only the shapes of small attention work (see
 * QUICK_WORK; the emulated run in tests/cuda_emu sets it); unset, or "all", runs every shape.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "model/cuda/attention_flash.h"
#include "model/gpt_kernels.h"
#include "testlib.h"

typedef struct shape {
    int B, T, C, NH;
} shape;

static const shape shapes[] = {
    {2, 37, 72, 3}, /* hs 24: T and hs not multiples of a warp */
    {1, 1, 64, 1}, /* one token: one key per row */
    {2, 129, 128, 2}, /* hs 64: one row past four tiles */
    {1, 300, 256, 2}, /* hs 128, the largest head */
    {3, 64, 96, 4}, /* hs 24, whole tiles */
    {2, 200, 768, 12}, /* hs 64 (GPT-2 small's heads), T not a multiple of the tile */
    {1, 45, 3, 3}, /* hs 1 */
    {2, 70, 99, 3}, /* hs 33: one dim past the first 32 lanes */
    {1, 97, 127, 1}, /* hs 127: odd, so the padded stride is hs itself */
};

/* STRATA_KCUDA_SHAPES=quick keeps the shapes whose score work, B * NH * T^2 * hs, is at most this: every shape but
 * the GPT-2 sized one, which takes most of the time on the CPU emulator. They still cover an odd T with hs 24, one
 * token, hs 64 past four tiles, hs 1, 33 and 127, and hs 128 (shared memory past 48 KiB). */
#define QUICK_WORK (1.0 * (1 << 25))

/* fp32: |got - want| <= tol * (1 + |want|). */
#define TOL_OUT_F32 2e-5
#define TOL_LSE 2e-5
#define TOL_DQKV_F32 1e-4
/* bf16: out is one rounding (relative 2^-8) of an fp32 result; the gradients add the rounding of out, which the
 * backward reads (D = dout . out), to their own: bounded relative to the part's largest value, plus a cosine. A host
 * emulation of the kernels used about a third of each bound and left 1 - cosine near 2e-6. */
#define TOL_OUT_BF16 8e-3
#define TOL_DQKV_BF16 1e-2
#define MIN_COSINE_BF16 0.9999

#define T_CUDA(call)                                                                                  \
do {                                                                                                  \
cudaError_t t_e_ = (call);                                                                            \
T_CHECK(t_e_ == cudaSuccess, "%s: %s (%s)", #call, cudaGetErrorName(t_e_), cudaGetErrorString(t_e_)); \
} while (0)

/* Out of memory ends the test: nothing after it could run. */
static void *host_alloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    T_CHECK(p != NULL, "malloc(%zu) failed", bytes);
    if (!p)
        exit(t_done());
    return p;
}

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    T_CHECK(e == cudaSuccess, "cudaMalloc(%zu): %s", bytes, cudaGetErrorName(e));
    if (e != cudaSuccess)
        exit(t_done());
    return p;
}

static size_t elem_bytes(kcuda_elem elem)
{
    return elem == KCUDA_BF16 ? 2 : 4;
}

static strata_dtype elem_dtype(kcuda_elem elem)
{
    return elem == KCUDA_BF16 ? STRATA_DTYPE_BF16 : STRATA_DTYPE_FP32;
}

/* lse of every (b, h, i) row, from the scaled scores summed in double. */
static void lse_reference(float *lse, const float *qkv, shape s)
{
    int hs = s.C / s.NH;
    size_t C3 = 3 * (size_t)s.C;
    double scale = 1.0f / sqrtf((float)hs), *row = host_alloc((size_t)s.T * sizeof(double));
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++)
            for (int i = 0; i < s.T; i++) {
                const float *q = qkv + ((size_t)b * s.T + i) * C3 + (size_t)h * hs;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= i; j++) {
                    const float *k = qkv + ((size_t)b * s.T + j) * C3 + s.C + (size_t)h * hs;
                    double dot = 0;
                    for (int d = 0; d < hs; d++)
                        dot += (double)q[d] * k[d];
                    row[j] = scale * dot;
                    mx = fmax(mx, row[j]);
                }
                for (int j = 0; j <= i; j++)
                    sum += exp(row[j] - mx);
                lse[((size_t)b * s.NH + h) * s.T + i] = (float)(mx + log(sum));
            }
    free(row);
}

typedef struct agreement {
    double max_err; /* max |got - want| */
    double max_ref; /* max |want| */
    double worst; /* max |got - want| / bound; a NaN counts as infinitely far */
    size_t at; /* the flat index of worst */
    double got, want; /* the values there */
    double cosine; /* of got and want (NaN when want is all zeros) */
} agreement;

/* got against want on rows of ld floats, columns [col0, col0 + cols) of each: bound(x) = tol * (1 + |x|), or
 * tol * (1 + max |want|) when scaled_by_max. */
static agreement compare(const float *got, const float *want, size_t rows, size_t ld, size_t col0, size_t cols,
                         double tol, int scaled_by_max)
{
    agreement a = {.worst = -1};
    double dot = 0, ng = 0, nw = 0;
    for (size_t r = 0; r < rows; r++)
        for (size_t c = col0; c < col0 + cols; c++)
            a.max_ref = fmax(a.max_ref, fabs((double)want[r * ld + c]));
    for (size_t r = 0; r < rows; r++)
        for (size_t c = col0; c < col0 + cols; c++) {
            size_t at = r * ld + c;
            double g = got[at], w = want[at], err = fabs(g - w);
            double ratio = err / (tol * (1 + (scaled_by_max ? a.max_ref : fabs(w))));
            if (isnan(ratio))
                ratio = INFINITY;
            if (ratio > a.worst) {
                a.worst = ratio;
                a.at = at;
                a.got = g;
                a.want = w;
            }
            a.max_err = fmax(a.max_err, err);
            dot += g * w;
            ng += g * g;
            nw += w * w;
        }
    a.cosine = dot / sqrt(ng * nw);
    a.worst = fmax(a.worst, 0);
    return a;
}

static void expect_close(const char *ctx, const char *what, agreement a, double tol, int scaled_by_max)
{
    T_CHECK(a.worst <= 1.0,
            "%s: %s: max |diff| %.3g (max |want| %.3g); worst at [%zu]: got %.9g, want %.9g, over the bound "
            "%.3g * (1 + %s) by %.3gx",
            ctx, what, a.max_err, a.max_ref, a.at, a.got, a.want, tol, scaled_by_max ? "max |want|" : "|want|",
            a.worst);
}

/* Forward and backward of one shape in one element type, each run twice, against the oracle. */
static void check_shape(shape s, kcuda_elem elem, const float *qkv, const float *dout)
{
    int B = s.B, T = s.T, C = s.C, NH = s.NH, hs = C / NH, bf16 = elem == KCUDA_BF16;
    size_t n3 = (size_t)B * T * 3 * C, n1 = (size_t)B * T * C, nl = (size_t)B * NH * T, natt = nl * T;
    size_t es = elem_bytes(elem);
    strata_dtype dt = elem_dtype(elem);
    char ctx[160];
    snprintf(ctx, sizeof ctx, "(B,T,C,NH) = (%d,%d,%d,%d), hs %d, %s", B, T, C, NH, hs, bf16 ? "bf16" : "fp32");

    /* The inputs as the device holds them (x_e, g_e) and as fp32 for the oracle (x, g): rounded to bf16 and back
     * in a bf16 run, so both sides start from the same values. */
    float *x = host_alloc(n3 * sizeof(float)), *g = host_alloc(n1 * sizeof(float));
    void *x_e = host_alloc(n3 * es), *g_e = host_alloc(n1 * es);
    T_OK(strata_convert(x_e, dt, qkv, STRATA_DTYPE_FP32, n3));
    T_OK(strata_convert(g_e, dt, dout, STRATA_DTYPE_FP32, n1));
    T_OK(strata_convert(x, STRATA_DTYPE_FP32, x_e, dt, n3));
    T_OK(strata_convert(g, STRATA_DTYPE_FP32, g_e, dt, n1));

    float *out_ref = host_alloc(n1 * sizeof(float)), *lse_ref = host_alloc(nl * sizeof(float));
    float *dqkv_ref = host_alloc(n3 * sizeof(float)), *att = host_alloc(natt * sizeof(float));
    float *att_scratch = host_alloc(natt * sizeof(float));
    k_attention_forward(NULL, out_ref, att, x, B, T, C, NH);
    k_attention_backward(NULL, dqkv_ref, att_scratch, g, x, att, B, T, C, NH);
    lse_reference(lse_ref, x, s);

    void *d_qkv = dev_alloc(n3 * es), *d_dout = dev_alloc(n1 * es), *d_out = dev_alloc(n1 * es);
    void *d_dqkv = dev_alloc(n3 * es);
    float *d_lse = dev_alloc(nl * sizeof(float)), *d_scratch = dev_alloc(nl * sizeof(float));
    T_CUDA(cudaMemcpy(d_qkv, x_e, n3 * es, cudaMemcpyHostToDevice));
    T_CUDA(cudaMemcpy(d_dout, g_e, n1 * es, cudaMemcpyHostToDevice));

    /* Each run writes into buffers that start as NaN (all bits set), so an element left unwritten shows; the second
     * run must give the first one's bits. The second forward's out and lse feed the backward. */
    void *out_e[2] = {host_alloc(n1 * es), host_alloc(n1 * es)},
         *dqkv_e[2] = {host_alloc(n3 * es), host_alloc(n3 * es)};
    float *lse_got[2] = {host_alloc(nl * sizeof(float)), host_alloc(nl * sizeof(float))};
    for (int run = 0; run < 2; run++) {
        T_CUDA(cudaMemset(d_out, 0xff, n1 * es));
        T_CUDA(cudaMemset(d_lse, 0xff, nl * sizeof(float)));
        T_CUDA(kcuda_flash_forward(d_out, d_lse, d_qkv, B, T, C, NH, elem, 0));
        T_CUDA(cudaDeviceSynchronize());
        T_CUDA(cudaMemcpy(out_e[run], d_out, n1 * es, cudaMemcpyDeviceToHost));
        T_CUDA(cudaMemcpy(lse_got[run], d_lse, nl * sizeof(float), cudaMemcpyDeviceToHost));
    }
    for (int run = 0; run < 2; run++) {
        T_CUDA(cudaMemset(d_dqkv, 0xff, n3 * es));
        T_CUDA(cudaMemset(d_scratch, 0xff, nl * sizeof(float)));
        T_CUDA(kcuda_flash_backward(d_dqkv, d_scratch, d_dout, d_qkv, d_out, d_lse, B, T, C, NH, elem, 0));
        T_CUDA(cudaDeviceSynchronize());
        T_CUDA(cudaMemcpy(dqkv_e[run], d_dqkv, n3 * es, cudaMemcpyDeviceToHost));
    }
    T_CHECK(memcmp(out_e[0], out_e[1], n1 * es) == 0, "%s: two forward runs gave different out bits", ctx);
    T_CHECK(memcmp(lse_got[0], lse_got[1], nl * sizeof(float)) == 0, "%s: two forward runs gave different lse bits",
            ctx);
    T_CHECK(memcmp(dqkv_e[0], dqkv_e[1], n3 * es) == 0, "%s: two backward runs gave different dqkv bits", ctx);

    float *out = host_alloc(n1 * sizeof(float)), *dqkv = host_alloc(n3 * sizeof(float));
    T_OK(strata_convert(out, STRATA_DTYPE_FP32, out_e[0], dt, n1));
    T_OK(strata_convert(dqkv, STRATA_DTYPE_FP32, dqkv_e[0], dt, n3));

    double tol_out = bf16 ? TOL_OUT_BF16 : TOL_OUT_F32;
    agreement ao = compare(out, out_ref, 1, n1, 0, n1, tol_out, 0);
    agreement al = compare(lse_got[0], lse_ref, 1, nl, 0, nl, TOL_LSE, 0);
    expect_close(ctx, "out", ao, tol_out, 0);
    expect_close(ctx, "lse", al, TOL_LSE, 0);
    static const char *const part[3] = {"dq", "dk", "dv"};
    double worst_cos = 1;
    agreement ad[3];
    for (int p = 0; p < 3; p++) {
        /* dq, dk, dv: columns [p C, p C + C) of every row of dqkv. */
        ad[p] = compare(dqkv, dqkv_ref, (size_t)B * T, 3 * (size_t)C, (size_t)p * C, (size_t)C,
                        bf16 ? TOL_DQKV_BF16 : TOL_DQKV_F32, bf16);
        expect_close(ctx, part[p], ad[p], bf16 ? TOL_DQKV_BF16 : TOL_DQKV_F32, bf16);
        /* A part that is zero in the oracle (dq and dk with one token: ds = p (dp - D) = 0) has no direction. */
        if (bf16 && ad[p].max_ref > 0) {
            T_CHECK(ad[p].cosine > MIN_COSINE_BF16, "%s: %s: cosine %.6f, expected > %.6f (max |diff| %.3g)", ctx,
                    part[p], ad[p].cosine, MIN_COSINE_BF16, ad[p].max_err);
            worst_cos = fmin(worst_cos, ad[p].cosine);
        }
    }
    /* The largest error as a fraction of its bound, over every check: how much room the tolerances leave. */
    double used = fmax(fmax(ao.worst, al.worst), fmax(ad[0].worst, fmax(ad[1].worst, ad[2].worst)));
    printf("%-44s max |diff| out %.2e  lse %.2e  dq %.2e  dk %.2e  dv %.2e  worst/bound %.3f", ctx, ao.max_err,
           al.max_err, ad[0].max_err, ad[1].max_err, ad[2].max_err, used);
    if (bf16)
        printf("  cosine >= %.6f", worst_cos);
    printf("\n");

    free(out);
    free(dqkv);
    for (int run = 0; run < 2; run++) {
        free(out_e[run]);
        free(dqkv_e[run]);
        free(lse_got[run]);
    }
    T_CUDA(cudaFree(d_qkv));
    T_CUDA(cudaFree(d_dout));
    T_CUDA(cudaFree(d_out));
    T_CUDA(cudaFree(d_dqkv));
    T_CUDA(cudaFree(d_lse));
    T_CUDA(cudaFree(d_scratch));
    free(out_ref);
    free(lse_ref);
    free(dqkv_ref);
    free(att);
    free(att_scratch);
    free(x);
    free(g);
    free(x_e);
    free(g_e);
}

static double shape_work(shape s)
{
    return (double)s.B * s.NH * s.T * s.T * (s.C / s.NH);
}

/* Which shapes run: keep[n] for shapes[n], from STRATA_KCUDA_SHAPES (unset or "all": every one; "quick": those of
 * work <= QUICK_WORK). Prints the choice; returns 0 for a value it does not know (a failed check). */
static int choose_shapes(int keep[])
{
    size_t n_shapes = sizeof shapes / sizeof shapes[0], kept = 0;
    const char *v = getenv("STRATA_KCUDA_SHAPES");
    int quick = v && strcmp(v, "quick") == 0;
    if (v && *v && !quick && strcmp(v, "all") != 0) {
        T_CHECK(0, "STRATA_KCUDA_SHAPES = \"%s\" is not one of: all (the default), quick", v);
        return 0;
    }
    for (size_t n = 0; n < n_shapes; n++)
        kept += keep[n] = !quick || shape_work(shapes[n]) <= QUICK_WORK;
    printf("shapes: %s, %zu of %zu", quick ? "quick (STRATA_KCUDA_SHAPES=quick)" : "all", kept, n_shapes);
    if (quick) {
        printf(", those with B * NH * T^2 * hs <= %.0f; left out:", QUICK_WORK);
        for (size_t n = 0; n < n_shapes; n++)
            if (!keep[n])
                printf(" (%d,%d,%d,%d)", shapes[n].B, shapes[n].T, shapes[n].C, shapes[n].NH);
    }
    printf("\n");
    return 1;
}

/* Whether the n bytes at d all hold the byte v. */
static int dev_all_bytes(const void *d, size_t n, unsigned char v)
{
    unsigned char *h = host_alloc(n);
    int same = cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost) == cudaSuccess;
    for (size_t i = 0; same && i < n; i++)
        same = h[i] == v;
    free(h);
    return same;
}

/* Shapes the kernels do not take are refused with cudaErrorInvalidValue before anything runs: the outputs keep their
 * bytes and no launch error is left behind. Empty shapes succeed and write nothing. */
static void check_refusals(void)
{
    static const struct {
        shape s;
        kcuda_elem elem;
        cudaError_t want;
        const char *why;
    } cases[] = {
        {{1, 4, 258, 1}, KCUDA_F32, cudaErrorInvalidValue, "hs 258 > KCUDA_FLASH_MAX_HEAD"},
        {{1, 4, 258, 2}, KCUDA_BF16, cudaErrorInvalidValue, "hs 129 > KCUDA_FLASH_MAX_HEAD"},
        {{1, 4, 72, 5}, KCUDA_F32, cudaErrorInvalidValue, "C % NH != 0"},
        {{1, 4, 72, 0}, KCUDA_F32, cudaErrorInvalidValue, "NH 0"},
        {{1, 4, 72, -3}, KCUDA_F32, cudaErrorInvalidValue, "NH < 0"},
        {{1, 4, 72, 3}, (kcuda_elem)7, cudaErrorInvalidValue, "an element type outside kcuda_elem"},
        {{0, 4, 72, 3}, KCUDA_F32, cudaSuccess, "B 0: nothing to do"},
        {{1, 0, 72, 3}, KCUDA_F32, cudaSuccess, "T 0: nothing to do"},
    };
    /* Room for the largest case: 4 rows of 3 * 258 fp32 channels. */
    size_t bytes = 4 * 3 * 258 * sizeof(float);
    void *qkv = dev_alloc(bytes), *dout = dev_alloc(bytes), *out = dev_alloc(bytes), *dqkv = dev_alloc(bytes);
    float *lse = dev_alloc(bytes), *scratch = dev_alloc(bytes);
    T_CUDA(cudaMemset(qkv, 0, bytes));
    T_CUDA(cudaMemset(dout, 0, bytes));
    for (size_t n = 0; n < sizeof cases / sizeof cases[0]; n++) {
        shape s = cases[n].s;
        T_CUDA(cudaMemset(out, 0x5a, bytes));
        T_CUDA(cudaMemset(lse, 0x5a, bytes));
        T_CUDA(cudaMemset(dqkv, 0x5a, bytes));
        T_CUDA(cudaMemset(scratch, 0x5a, bytes));
        T_CUDA(cudaDeviceSynchronize());
        cudaError_t ef = kcuda_flash_forward(out, lse, qkv, s.B, s.T, s.C, s.NH, cases[n].elem, 0);
        cudaError_t eb =
            kcuda_flash_backward(dqkv, scratch, dout, qkv, out, lse, s.B, s.T, s.C, s.NH, cases[n].elem, 0);
        cudaError_t sync = cudaDeviceSynchronize(), last = cudaGetLastError();
        T_CHECK(ef == cases[n].want, "%s: kcuda_flash_forward returned %s, expected %s", cases[n].why,
                cudaGetErrorName(ef), cudaGetErrorName(cases[n].want));
        T_CHECK(eb == cases[n].want, "%s: kcuda_flash_backward returned %s, expected %s", cases[n].why,
                cudaGetErrorName(eb), cudaGetErrorName(cases[n].want));
        T_CHECK(sync == cudaSuccess && last == cudaSuccess, "%s: left an error behind: sync %s, last %s", cases[n].why,
                cudaGetErrorName(sync), cudaGetErrorName(last));
        T_CHECK(dev_all_bytes(out, bytes, 0x5a) && dev_all_bytes(lse, bytes, 0x5a), "%s: forward wrote its outputs",
                cases[n].why);
        T_CHECK(dev_all_bytes(dqkv, bytes, 0x5a) && dev_all_bytes(scratch, bytes, 0x5a),
                "%s: backward wrote its outputs", cases[n].why);
    }
    T_CUDA(cudaFree(qkv));
    T_CUDA(cudaFree(dout));
    T_CUDA(cudaFree(out));
    T_CUDA(cudaFree(dqkv));
    T_CUDA(cudaFree(lse));
    T_CUDA(cudaFree(scratch));
}

int main(void)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess)
        t_skip("no CUDA device here: cudaGetDeviceCount returned %s", cudaGetErrorName(e));
    if (count == 0)
        t_skip("no CUDA device here: cudaGetDeviceCount found none");
    struct cudaDeviceProp prop;
    T_CUDA(cudaGetDeviceProperties(&prop, 0));
    printf("device 0: %s (sm_%d%d); max head %d; seed %llu\n", prop.name, prop.major, prop.minor, KCUDA_FLASH_MAX_HEAD,
           (unsigned long long)t_rng_seed());

    int keep[sizeof shapes / sizeof shapes[0]];
    if (!choose_shapes(keep))
        return t_done();
    for (size_t n = 0; n < sizeof shapes / sizeof shapes[0]; n++) {
        if (!keep[n])
            continue;
        shape s = shapes[n];
        size_t n3 = (size_t)s.B * s.T * 3 * s.C, n1 = (size_t)s.B * s.T * s.C;
        float *qkv = host_alloc(n3 * sizeof(float)), *dout = host_alloc(n1 * sizeof(float));
        for (size_t i = 0; i < n3; i++)
            qkv[i] = t_rand_normal();
        for (size_t i = 0; i < n1; i++)
            dout[i] = t_rand_normal();
        check_shape(s, KCUDA_F32, qkv, dout);
        check_shape(s, KCUDA_BF16, qkv, dout);
        free(qkv);
        free(dout);
    }
    check_refusals();
    return t_done();
}
