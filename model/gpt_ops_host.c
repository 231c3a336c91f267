/* The host gpt_ops table: the OpenBLAS + OpenMP kernels of gpt_kernels.c on host memory, fp32.
 * STRATA_MODEL_PROFILE=1 swaps in a table that times each kernel (they run synchronously, so the wall time of a
 * call is the kernel's) and prints the totals to stderr at exit. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/gpt_kernels.h"
#include "model/gpt_ops.h"

static void h_zero(void *ctx, float *p, size_t n)
{
    (void)ctx;
    memset(p, 0, n * sizeof(float));
}

/* The dtype conversions are strata's own (strata_convert: base/half.h's rounding), so that the model rounds exactly as
 * the engine stores. Every dtype the model hands over (fp32, bf16, fp16) converts, so the call cannot fail here. */
static void h_to_f32(void *ctx, float *dst, const void *src, size_t n, strata_dtype dt)
{
    (void)ctx;
    (void)strata_convert(dst, STRATA_DTYPE_FP32, src, dt, n);
}

static void h_from_f32(void *ctx, void *dst, const float *src, size_t n, strata_dtype dt)
{
    (void)ctx;
    (void)strata_convert(dst, dt, src, STRATA_DTYPE_FP32, n);
}

static void h_upload(void *ctx, void *dst, const void *host_src, size_t bytes)
{
    (void)ctx;
    memcpy(dst, host_src, bytes);
}

static strata_status h_to_host(void *ctx, void *host_dst, const void *src, size_t bytes)
{
    (void)ctx;
    memcpy(host_dst, src, bytes);
    return STRATA_OK; /* host kernels cannot fail */
}

static const char *h_error(void *ctx)
{
    (void)ctx;
    return "";
}

static const gpt_ops host_ops = {
    .name = "host",
    .embed_forward = k_embed_forward,
    .embed_backward = k_embed_backward,
    .layernorm_forward = k_layernorm_forward,
    .layernorm_backward = k_layernorm_backward,
    .linear_forward = k_linear_forward,
    .linear_backward = k_linear_backward,
    .attention_forward = k_attention_forward,
    .attention_backward = k_attention_backward,
    .gelu_forward = k_gelu_forward,
    .gelu_backward = k_gelu_backward,
    .residual_forward = k_residual_forward,
    .head_loss = k_head_loss,
    .zero = h_zero,
    .to_f32 = h_to_f32,
    .from_f32 = h_from_f32,
    .upload = h_upload,
    .to_host = h_to_host,
    .error = h_error,
};

/* ---------------------------------------------------------------- STRATA_MODEL_PROFILE=1 */

enum {
    P_EMBED_F,
    P_EMBED_B,
    P_LN_F,
    P_LN_B,
    P_LINEAR_F,
    P_LINEAR_B,
    P_ATT_F,
    P_ATT_B,
    P_GELU_F,
    P_GELU_B,
    P_RESIDUAL,
    P_HEAD_LOSS,
    P_ZERO,
    P_COUNT
};
static const char *const prof_name[P_COUNT] = {"embed_forward",
                                               "embed_backward",
                                               "layernorm_forward",
                                               "layernorm_backward",
                                               "linear_forward",
                                               "linear_backward",
                                               "attention_forward",
                                               "attention_backward",
                                               "gelu_forward",
                                               "gelu_backward",
                                               "residual_forward",
                                               "head_loss",
                                               "zero"};
static _Atomic uint64_t prof_ns[P_COUNT], prof_calls[P_COUNT];

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A wrapper p_<kernel> that times one call of kernel into slot. */
#define TIMED(kernel, slot, params, args)                                       \
static void p_##kernel params                                                   \
{                                                                               \
uint64_t t0 = now_ns();                                                         \
kernel args;                                                                    \
atomic_fetch_add_explicit(&prof_ns[slot], now_ns() - t0, memory_order_relaxed); \
atomic_fetch_add_explicit(&prof_calls[slot], 1, memory_order_relaxed);          \
}

TIMED(k_embed_forward, P_EMBED_F,
      (void *c, float *o, const int32_t *t, const float *e, const float *p, int N, int T, int C),
      (c, o, t, e, p, N, T, C))
TIMED(k_embed_backward, P_EMBED_B,
      (void *c, float *de, float *dp, const float *g, const int32_t *t, int N, int T, int C),
      (c, de, dp, g, t, N, T, C))
TIMED(k_layernorm_forward, P_LN_F,
      (void *c, float *o, float *m, float *r, const float *x, const float *w, const float *b, int N, int C),
      (c, o, m, r, x, w, b, N, C))
TIMED(k_layernorm_backward, P_LN_B,
      (void *c, float *dx, float *dw, float *db, const float *g, const float *x, const float *w, const float *m,
       const float *r, int N, int C),
      (c, dx, dw, db, g, x, w, m, r, N, C))
TIMED(k_linear_forward, P_LINEAR_F,
      (void *c, float *o, const float *x, const float *W, const float *b, int N, int C, int OC),
      (c, o, x, W, b, N, C, OC))
TIMED(k_linear_backward, P_LINEAR_B,
      (void *c, float *dx, float *dW, float *db, const float *g, const float *x, const float *W, int N, int C, int OC),
      (c, dx, dW, db, g, x, W, N, C, OC))
TIMED(k_attention_forward, P_ATT_F, (void *c, float *o, float *att, const float *qkv, int B, int T, int C, int NH),
      (c, o, att, qkv, B, T, C, NH))
TIMED(k_attention_backward, P_ATT_B,
      (void *c, float *d, float *s, const float *g, const float *qkv, const float *att, int B, int T, int C, int NH),
      (c, d, s, g, qkv, att, B, T, C, NH))
TIMED(k_gelu_forward, P_GELU_F, (void *c, float *o, const float *x, size_t n), (c, o, x, n))
TIMED(k_gelu_backward, P_GELU_B, (void *c, float *d, const float *x, size_t n), (c, d, x, n))
TIMED(k_residual_forward, P_RESIDUAL, (void *c, float *o, const float *a, const float *b, size_t n), (c, o, a, b, n))
TIMED(k_head_loss, P_HEAD_LOSS,
      (void *c, float *dx, float *dwte, float *l, double *rl, const float *x, const float *wte, const int32_t *t, int N,
       int C, int V, int chunk, float scale),
      (c, dx, dwte, l, rl, x, wte, t, N, C, V, chunk, scale))
TIMED(h_zero, P_ZERO, (void *c, float *p, size_t n), (c, p, n))

static void prof_print(void)
{
    uint64_t total = 0;
    for (int i = 0; i < P_COUNT; i++)
        total += prof_ns[i];
    fprintf(stderr, "STRATA_MODEL_PROFILE: host kernels, %.3f s in all\n", (double)total * 1e-9);
    fprintf(stderr, "%-20s %10s %10s %10s %7s\n", "kernel", "calls", "total ms", "us/call", "share");
    for (int i = 0; i < P_COUNT; i++) {
        uint64_t ns = prof_ns[i], calls = prof_calls[i];
        if (calls)
            fprintf(stderr, "%-20s %10llu %10.1f %10.1f %6.1f%%\n", prof_name[i], (unsigned long long)calls,
                    (double)ns * 1e-6, (double)ns * 1e-3 / (double)calls,
                    total ? 100.0 * (double)ns / (double)total : 0);
    }
}

static gpt_ops profiled_ops;

static const gpt_ops *host_table = &host_ops;
static pthread_once_t host_table_once = PTHREAD_ONCE_INIT;

/* The environment is read once; a value other than 0 or 1 warns and leaves profiling off. */
static void pick_table(void)
{
    const char *v = getenv("STRATA_MODEL_PROFILE");
    if (!v || strcmp(v, "0") == 0)
        return;
    if (strcmp(v, "1") != 0) {
        fprintf(stderr, "strata: STRATA_MODEL_PROFILE = \"%s\" is not 0 or 1; profiling stays off\n", v);
        return;
    }
    profiled_ops = host_ops; /* the copies and conversions stay untimed */
    profiled_ops.embed_forward = p_k_embed_forward;
    profiled_ops.embed_backward = p_k_embed_backward;
    profiled_ops.layernorm_forward = p_k_layernorm_forward;
    profiled_ops.layernorm_backward = p_k_layernorm_backward;
    profiled_ops.linear_forward = p_k_linear_forward;
    profiled_ops.linear_backward = p_k_linear_backward;
    profiled_ops.attention_forward = p_k_attention_forward;
    profiled_ops.attention_backward = p_k_attention_backward;
    profiled_ops.gelu_forward = p_k_gelu_forward;
    profiled_ops.gelu_backward = p_k_gelu_backward;
    profiled_ops.residual_forward = p_k_residual_forward;
    profiled_ops.head_loss = p_k_head_loss;
    profiled_ops.zero = p_h_zero;
    atexit(prof_print);
    host_table = &profiled_ops;
}

const gpt_ops *gpt_ops_host(void)
{
    pthread_once(&host_table_once, pick_table);
    return host_table;
}
