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

static void h_zero(void *ctx, void *p, size_t bytes)
{
    (void)ctx;
    memset(p, 0, bytes);
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
    P_EMBED_TILE_F,
    P_EMBED_TILE_B,
    P_HEAD_TILE,
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
                                               "embed_tile_forward",
                                               "embed_tile_backward",
                                               "head_tile",
                                               "zero"};
/* The table's entries take the format-neutral pointer types of gpt_ops.h; the host's activations and weights are fp32,
 * so each entry h_<kernel> hands its pointers to the typed kernel (and p_<kernel>, under STRATA_MODEL_PROFILE, also
 * times the call into its slot). */
static _Atomic uint64_t prof_ns[P_COUNT], prof_calls[P_COUNT];

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#define ENTRY(kernel, slot, params, args)                                       \
static void h_##kernel params                                                   \
{                                                                               \
kernel args;                                                                    \
}                                                                               \
static void p_##kernel params                                                   \
{                                                                               \
uint64_t t0 = now_ns();                                                         \
kernel args;                                                                    \
atomic_fetch_add_explicit(&prof_ns[slot], now_ns() - t0, memory_order_relaxed); \
atomic_fetch_add_explicit(&prof_calls[slot], 1, memory_order_relaxed);          \
}

ENTRY(k_embed_forward, P_EMBED_F,
      (void *c, void *o, const int32_t *t, const void *e, const void *p, int N, int T, int C),
      (c, o, t, e, p, N, T, C))
ENTRY(k_embed_backward, P_EMBED_B,
      (void *c, float *de, float *dp, const void *g, const int32_t *t, int N, int T, int C),
      (c, de, dp, g, t, N, T, C))
ENTRY(k_layernorm_forward, P_LN_F,
      (void *c, void *o, float *m, float *r, const void *x, const void *w, const void *b, int N, int C),
      (c, o, m, r, x, w, b, N, C))
ENTRY(k_layernorm_backward, P_LN_B,
      (void *c, void *dx, float *dw, float *db, const void *g, const void *x, const void *w, const float *m,
       const float *r, int N, int C),
      (c, dx, dw, db, g, x, w, m, r, N, C))
ENTRY(k_linear_forward, P_LINEAR_F,
      (void *c, void *o, const void *x, const void *W, const void *b, int N, int C, int OC),
      (c, o, x, W, b, N, C, OC))
ENTRY(k_linear_backward, P_LINEAR_B,
      (void *c, void *dx, float *dW, float *db, const void *g, const void *x, const void *W, int N, int C, int OC),
      (c, dx, dW, db, g, x, W, N, C, OC))
ENTRY(k_attention_forward, P_ATT_F, (void *c, void *o, float *att, const void *qkv, int B, int T, int C, int NH),
      (c, o, att, qkv, B, T, C, NH))
/* The host keeps the probabilities, so its backward does not read forward's output. */
ENTRY(k_attention_backward, P_ATT_B,
      (void *c, void *d, float *s, const void *g, const void *qkv, const void *out, const float *att, int B, int T,
       int C, int NH),
      (c, d, s, g, qkv, ((void)out, att), B, T, C, NH))
ENTRY(k_gelu_forward, P_GELU_F, (void *c, void *o, const void *x, size_t n), (c, o, x, n))
ENTRY(k_gelu_backward, P_GELU_B, (void *c, void *d, const void *x, size_t n), (c, d, x, n))
ENTRY(k_residual_forward, P_RESIDUAL, (void *c, void *o, const void *a, const void *b, size_t n), (c, o, a, b, n))
ENTRY(k_head_loss, P_HEAD_LOSS,
      (void *c, void *dx, float *dwte, void *l, double *rl, const void *x, const void *wte, const int32_t *t, int N,
       int C, int V, int chunk, float scale),
      (c, dx, dwte, l, rl, x, wte, t, N, C, V, chunk, scale))
ENTRY(k_embed_tile_forward, P_EMBED_TILE_F,
      (void *c, void *o, const int32_t *t, const void *e, const void *p, int N, int T, int C, int v0, int v1),
      (c, o, t, e, p, N, T, C, v0, v1))
ENTRY(k_embed_tile_backward, P_EMBED_TILE_B,
      (void *c, float *de, const void *g, const int32_t *t, int N, int C, int v0, int v1),
      (c, de, g, t, N, C, v0, v1))
ENTRY(k_head_tile, P_HEAD_TILE,
      (void *c, gpt_head_pass pass, gpt_head_rows *st, void *dx, float *dwte, void *l, const void *x, const void *wte,
       const int32_t *t, int N, int C, int v0, int v1, int chunk, float scale),
      (c, pass, st, dx, dwte, l, x, wte, t, N, C, v0, v1, chunk, scale))

static void h_head_rows_loss(void *ctx, const gpt_head_rows *st, double *row_loss, int N)
{
    (void)ctx;
    k_head_rows_loss(st, row_loss, N);
}

ENTRY(h_zero, P_ZERO, (void *c, void *p, size_t bytes), (c, p, bytes))

static const gpt_ops host_ops = {
    .name = "host",
    .acts = GPT_ACTS_FP32,
    .embed_forward = h_k_embed_forward,
    .embed_backward = h_k_embed_backward,
    .layernorm_forward = h_k_layernorm_forward,
    .layernorm_backward = h_k_layernorm_backward,
    .linear_forward = h_k_linear_forward,
    .linear_backward = h_k_linear_backward,
    .attention_forward = h_k_attention_forward,
    .attention_backward = h_k_attention_backward,
    .gelu_forward = h_k_gelu_forward,
    .gelu_backward = h_k_gelu_backward,
    .residual_forward = h_k_residual_forward,
    .head_loss = h_k_head_loss,
    .embed_tile_forward = h_k_embed_tile_forward,
    .embed_tile_backward = h_k_embed_tile_backward,
    .head_tile = h_k_head_tile,
    .head_rows_loss = h_head_rows_loss,
    .add_f32 = k_residual_forward,
    .zero = h_h_zero,
    .to_f32 = h_to_f32,
    .from_f32 = h_from_f32,
    .upload = h_upload,
    .to_host = h_to_host,
    .error = h_error,
};

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
    profiled_ops.embed_tile_forward = p_k_embed_tile_forward;
    profiled_ops.embed_tile_backward = p_k_embed_tile_backward;
    profiled_ops.head_tile = p_k_head_tile;
    profiled_ops.zero = p_h_zero;
    atexit(prof_print);
    host_table = &profiled_ops;
}

const gpt_ops *gpt_ops_host(void)
{
    pthread_once(&host_table_once, pick_table);
    return host_table;
}
