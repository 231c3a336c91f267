/*
 * CPU Adam, internal contract: the per-step constants, the arrays of one update, and the kernel
 * table that each ISA file (adam_ref.c, adam_avx2.c, adam_avx512.c) fills.
 *
 * The update is PyTorch 1.13's torch.optim.AdamW / torch.optim.Adam (single-tensor and foreach paths),
 * per element, with each multiply-add either written as one fma or kept as two roundings with
 * ADAM_KEEP_ROUNDED, as PyTorch does it, so that no compiler can contract it differently in one variant
 * than in another (see adam_ref.c for the formula). Every kernel must give the bits of adam_step_ref()
 * (NaN payloads aside); the tests check that.
 *
 * Files: adam_<isa>.c the step, gradstats_<isa>.c the gradient pre-pass, roofline_<isa>.c the benchmark's
 * same-shape roofline (the scalar ones all in adam_ref.c), simd_<isa>.h their shared loads, stores and
 * conversions, base/half.h the scalar rounding spec, dispatch.c the choice of ISA, driver.[ch] the OpenMP
 * team, api.c the public strata_adam_* functions. adam_scalar.h is the scalar element all references share;
 * moments.[ch] the compressed moment forms (bf16 with stochastic rounding, 8-bit block-wise) and
 * adam_moments*.[ch] the steps that keep m and v in them (in the kernel table as step_bf16 / step_q8).
 */
#ifndef STRATA_CPU_ADAM_ADAM_H
#define STRATA_CPU_ADAM_ADAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strata.h"

/* Keeps x rounded to fp32 here, so that an add that follows is not fused with the multiply that made x:
 * GCC's default for GNU C is -ffp-contract=fast, and a fusion made in one file and not in another would
 * break bit-identity between the kernels. An empty asm costs nothing. */
#define ADAM_KEEP_ROUNDED(x) __asm__("" : "+v"(x))

/* The scalars of one step, already rounded to fp32 the way PyTorch rounds its Python doubles. */
typedef struct adam_consts {
    float grad_scale;   /* 1/loss_scale * clip coefficient, folded into the gradient read */
    float beta1, one_minus_beta1;
    float beta2, one_minus_beta2;
    float eps;
    float bc2_sqrt;     /* sqrt(1 - beta2^step), or 1 without bias correction */
    float neg_step;     /* -(lr / (1 - beta1^step)) */
    float decay;        /* AdamW: 1 - lr * weight_decay; Adam: 1 */
    float l2;           /* Adam: weight_decay added to the gradient as l2 * param; AdamW: 0 */
    bool use_l2;        /* Adam with weight_decay != 0 (PyTorch skips the add when it is 0) */
    /* STRATA_ADAM_LERP: m = fma(lerp_coeff, g - m, lerp_from_m ? m : g), torch's lerp of weight w = 1 - beta1
     * (ATen's Lerp.h: from m with coefficient w while |w| < 0.5, else from g with coefficient w - 1). */
    bool lerp;
    bool lerp_from_m;
    float lerp_coeff;
} adam_consts;

/* The arrays of one update. Element i of every array belongs to parameter element i. */
typedef struct adam_arrays {
    float *master, *exp_avg, *exp_avg_sq;
    const void *grad;
    void *param;              /* NULL when param_dtype is STRATA_DTYPE_NONE */
    strata_dtype grad_dtype;  /* FP32, BF16 or FP16 */
    strata_dtype param_dtype; /* FP32, BF16, FP16 or NONE */
    bool stream_param;        /* write the parameter copy with non-temporal stores where it is 64-byte
                                 aligned: it is only written, so this saves reading its lines first */
} adam_arrays;

/* How the roofline stores: all regular, all non-temporal, or regular in place with a non-temporal
 * parameter copy (what Adam does with stream_param). */
typedef enum adam_stores {
    ADAM_STORES_REGULAR = 0,
    ADAM_STORES_STREAMING,
    ADAM_STORES_STREAM_COPY,
    ADAM_STORES_COUNT,
} adam_stores;

/* What the gradient pre-pass finds in a range. */
typedef struct adam_gradstats {
    double sumsq;     /* sum of squares of the stored values (not scaled) */
    bool nonfinite;   /* any inf or NaN */
} adam_gradstats;

/* Updates elements [begin, end). */
typedef void (*adam_step_fn)(const adam_consts *c, const adam_arrays *a, size_t begin, size_t end);
/* Adds the statistics of grad[begin, end) to *out. */
typedef void (*adam_gradstats_fn)(const void *grad, strata_dtype dtype, size_t begin, size_t end,
                                  adam_gradstats *out);
/* The same-shape roofline: Adam's loads and stores over [begin, end) with no arithmetic.
 * Leaves master, m and v as they were and writes the parameter copy, storing as `stores` says (regular
 * stores where an address is not aligned for a streaming one). */
typedef void (*adam_roofline_fn)(const adam_arrays *a, size_t begin, size_t end, adam_stores stores);

/* Runs BODY(G, P, ...) with G and P the compile-time constants equal to the run-time dtypes gd and pd, so
 * that an always-inline SIMD loop is specialised per (gradient, parameter) pair and its dtype branches
 * fold away. The trailing arguments go to BODY unchanged (more compile-time switches). */
#define ADAM_SPECIALISE(gd, pd, BODY, ...)                                                               \
    switch (gd) {                                                                                        \
    case STRATA_DTYPE_BF16: ADAM_SPECIALISE_PD_(STRATA_DTYPE_BF16, pd, BODY, __VA_ARGS__); break;        \
    case STRATA_DTYPE_FP16: ADAM_SPECIALISE_PD_(STRATA_DTYPE_FP16, pd, BODY, __VA_ARGS__); break;        \
    default: ADAM_SPECIALISE_PD_(STRATA_DTYPE_FP32, pd, BODY, __VA_ARGS__); break;                       \
    }
#define ADAM_SPECIALISE_PD_(G, pd, BODY, ...)                                                            \
    switch (pd) {                                                                                        \
    case STRATA_DTYPE_FP32: BODY(G, STRATA_DTYPE_FP32, __VA_ARGS__); break;                              \
    case STRATA_DTYPE_BF16: BODY(G, STRATA_DTYPE_BF16, __VA_ARGS__); break;                              \
    case STRATA_DTYPE_FP16: BODY(G, STRATA_DTYPE_FP16, __VA_ARGS__); break;                              \
    default: BODY(G, STRATA_DTYPE_NONE, __VA_ARGS__); break;                                             \
    }

/* Whether the parameter copy (from element begin on) starts on a 64-byte boundary, and with in_place also
 * master, m and v: streaming stores need it. Every later vector store of a kernel is then aligned too. */
static inline bool adam_arrays_aligned(const adam_arrays *a, size_t begin, bool in_place)
{
    size_t pb = a->param_dtype == STRATA_DTYPE_FP32 ? 4 : a->param_dtype == STRATA_DTYPE_NONE ? 0 : 2;
    uintptr_t any = a->param ? (uintptr_t)((char *)a->param + begin * pb) : 0;
    if (in_place)
        any |= (uintptr_t)(a->master + begin) | (uintptr_t)(a->exp_avg + begin) | (uintptr_t)(a->exp_avg_sq + begin);
    return (any & 63u) == 0;
}

typedef enum adam_isa {
    ADAM_ISA_REF = 0,
    ADAM_ISA_AVX2,
    ADAM_ISA_AVX512,
    ADAM_ISA_COUNT,
} adam_isa;

/* The steps with compressed moments (adam_moments.h), declared there. */
struct adam_bf16_moments;
struct adam_q8_moments;

typedef struct adam_ops {
    adam_isa isa;
    const char *name;  /* "ref", "avx2", "avx512" as STRATA_ISA spells them */
    adam_step_fn step;
    /* The same update with bf16 / 8-bit moments: the best variant this ISA runs (AVX-512 uses the AVX2 one). */
    void (*step_bf16)(const adam_consts *c, const adam_arrays *a, const struct adam_bf16_moments *mo, size_t begin,
                      size_t end);
    void (*step_q8)(const adam_consts *c, const adam_arrays *a, const struct adam_q8_moments *mo, size_t begin,
                    size_t end);
    adam_gradstats_fn gradstats;
    adam_roofline_fn roofline;
} adam_ops;

/* Fills the per-step constants. step counts from 1. */
void adam_consts_init(adam_consts *c, const strata_adam_hparams *hp, int64_t step, double grad_scale);

/* The kernels. The SIMD ones may only be called when adam_isa_supported() says so. */
void adam_step_ref(const adam_consts *c, const adam_arrays *a, size_t begin, size_t end);
void adam_step_avx2(const adam_consts *c, const adam_arrays *a, size_t begin, size_t end);
void adam_step_avx512(const adam_consts *c, const adam_arrays *a, size_t begin, size_t end);
void adam_gradstats_ref(const void *grad, strata_dtype dtype, size_t begin, size_t end, adam_gradstats *out);
void adam_gradstats_avx2(const void *grad, strata_dtype dtype, size_t begin, size_t end, adam_gradstats *out);
void adam_gradstats_avx512(const void *grad, strata_dtype dtype, size_t begin, size_t end, adam_gradstats *out);
void adam_roofline_ref(const adam_arrays *a, size_t begin, size_t end, adam_stores stores);
void adam_roofline_avx2(const adam_arrays *a, size_t begin, size_t end, adam_stores stores);
void adam_roofline_avx512(const adam_arrays *a, size_t begin, size_t end, adam_stores stores);

/* True when this CPU can run isa. */
bool adam_isa_supported(adam_isa isa);

/* The kernel table of one ISA: STRATA_EUNSUPPORTED (with the missing CPU features named) when the
 * CPU cannot run it. */
strata_status adam_ops_for(adam_isa isa, const adam_ops **out);

/* The table chosen once per process: STRATA_ISA when set, else the best the CPU runs. An unknown
 * STRATA_ISA value warns once, names the allowed values and falls back to the best; a known ISA the
 * CPU lacks is an error (STRATA_EUNSUPPORTED) every time, so a forced run never silently runs another. */
strata_status adam_ops_default(const adam_ops **out);

/* Parses "ref" / "avx2" / "avx512". */
bool adam_isa_parse(const char *name, adam_isa *out);

#endif
