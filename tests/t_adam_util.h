/*
 * What the CPU Adam tests share: random optimizer state with the awkward values mixed in, and a
 * bitwise comparison that treats any two NaNs as equal (a NaN's payload is unspecified, base/half.h).
 */
#ifndef STRATA_TESTS_T_ADAM_UTIL_H
#define STRATA_TESTS_T_ADAM_UTIL_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_adam/adam.h"
#include "base/half.h"
#include "testlib.h"

typedef struct ta_state {
    size_t n;
    float *master, *m, *v;
    void *grad, *param;
    strata_dtype gd, pd;
} ta_state;

/* Values that exercise the edges of the conversions: fp32 and fp16 subnormals, bf16 rounding ties,
 * the fp16 overflow tie, huge values, signed zeros. */
static const float ta_special[] = {0.0f, -0.0f, 1e-39f, -3e-41f, 6e-5f, -6e-8f, 65519.0f, 65520.0f, -1e5f,
                                   3e38f, 1.00390625f, 1.01171875f, -2.0f, 0x1p-126f, 0x1.fep-127f};

/* Zeroed arrays on 64-byte boundaries (so that streaming stores can be taken at aligned starts). */
static inline void *ta_calloc64(size_t n)
{
    size_t bytes = (n * 4 + 64) / 64 * 64;
    void *p = aligned_alloc(64, bytes);
    if (!p) {
        fprintf(stderr, "out of memory for %zu bytes\n", bytes);
        exit(1);
    }
    return memset(p, 0, bytes);
}

static inline void ta_alloc(ta_state *s, size_t n, strata_dtype gd, strata_dtype pd)
{
    s->n = n;
    s->gd = gd;
    s->pd = pd;
    s->master = ta_calloc64(n);
    s->m = ta_calloc64(n);
    s->v = ta_calloc64(n);
    s->grad = ta_calloc64(n);
    s->param = pd == STRATA_DTYPE_NONE ? NULL : ta_calloc64(n);
}

static inline void ta_free(ta_state *s)
{
    free(s->master);
    free(s->m);
    free(s->v);
    free(s->grad);
    free(s->param);
}

static inline void ta_copy(ta_state *dst, const ta_state *src)
{
    memcpy(dst->master, src->master, src->n * 4);
    memcpy(dst->m, src->m, src->n * 4);
    memcpy(dst->v, src->v, src->n * 4);
    memcpy(dst->grad, src->grad, src->n * 4);
    if (src->param)
        memcpy(dst->param, src->param, src->n * 4);
}

static inline float ta_value(float scale)
{
    if (t_rand_range(0, 60) == 0)
        return ta_special[t_rand_range(0, sizeof ta_special / sizeof ta_special[0] - 1)];
    return t_rand_normal() * scale;
}

/* Fresh master weights (moments start at zero, as in PyTorch). */
static inline void ta_fill_master(ta_state *s)
{
    for (size_t i = 0; i < s->n; i++)
        s->master[i] = ta_value(0.5f);
    memset(s->m, 0, s->n * 4);
    memset(s->v, 0, s->n * 4);
}

/* A fresh gradient of magnitudes from 1e-4 to 10, stored in the gradient dtype; with specials, the
 * edge values above mixed in (some overflow fp16). nan_every > 0 puts a NaN or inf about once in that
 * many elements. */
static inline void ta_fill_grad(ta_state *s, size_t nan_every, bool specials)
{
    for (size_t i = 0; i < s->n; i++) {
        float scale = (float)pow(10.0, -4.0 + 5.0 * t_rand_unit());
        float g = specials ? ta_value(scale) : t_rand_normal() * scale;
        if (nan_every && t_rand_range(0, nan_every - 1) == 0)
            g = t_rand_range(0, 1) ? NAN : -INFINITY;
        if (s->gd == STRATA_DTYPE_FP32)
            ((float *)s->grad)[i] = g;
        else if (s->gd == STRATA_DTYPE_BF16)
            ((uint16_t *)s->grad)[i] = cvt_f32_to_bf16(g);
        else
            ((uint16_t *)s->grad)[i] = cvt_f32_to_fp16(g);
    }
}

static inline float ta_param_at(const ta_state *s, size_t i)
{
    switch (s->pd) {
    case STRATA_DTYPE_FP32: return ((const float *)s->param)[i];
    case STRATA_DTYPE_BF16: return cvt_bf16_to_f32(((const uint16_t *)s->param)[i]);
    case STRATA_DTYPE_FP16: return cvt_fp16_to_f32(((const uint16_t *)s->param)[i]);
    default: return 0.0f;
    }
}

static inline bool ta_same(float a, float b)
{
    return (isnan(a) && isnan(b)) || cvt_f32_bits(a) == cvt_f32_bits(b);
}

/* Counts elements where got and want differ; prints the first few with the context `what`. */
static inline size_t ta_compare(const ta_state *got, const ta_state *want, const char *what)
{
    size_t bad = 0;
    t_checks++;
    for (size_t i = 0; i < got->n; i++) {
        float g[4] = {got->master[i], got->m[i], got->v[i], got->param ? ta_param_at(got, i) : 0.0f};
        float w[4] = {want->master[i], want->m[i], want->v[i], want->param ? ta_param_at(want, i) : 0.0f};
        for (int k = 0; k < 4; k++) {
            if (ta_same(g[k], w[k]))
                continue;
            if (bad++ < 5)
                t_fail(__FILE__, __LINE__, "%s: element %zu of %s: got %a (0x%08x), reference %a (0x%08x)", what, i,
                       (const char *[]){"master", "exp_avg", "exp_avg_sq", "param"}[k], g[k], cvt_f32_bits(g[k]),
                       w[k], cvt_f32_bits(w[k]));
        }
    }
    return bad;
}

#endif
