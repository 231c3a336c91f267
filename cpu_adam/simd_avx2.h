/*
 * AVX2 + F16C loads and stores of gradients and parameter copies, 8 elements at a time, shared by the
 * *_avx2.c files (only they may include it: it needs their compile flags). Every conversion gives the
 * bits of base/half.h: widening is exact, fp16 narrowing is vcvtps2ph with round-to-nearest-even, bf16
 * narrowing is base/half.h's integer rounding done on 8 lanes.
 */
#ifndef STRATA_CPU_ADAM_SIMD_AVX2_H
#define STRATA_CPU_ADAM_SIMD_AVX2_H

#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "cpu_adam/adam.h"
#include "strata.h"

#define AVX2_ALWAYS_INLINE static inline __attribute__((always_inline))

AVX2_ALWAYS_INLINE __m256 avx2_load_grad(const void *grad, strata_dtype dtype, size_t i)
{
    if (dtype == STRATA_DTYPE_FP32)
        return _mm256_loadu_ps((const float *)grad + i);
    __m128i raw = _mm_loadu_si128((const __m128i *)((const uint16_t *)grad + i));
    if (dtype == STRATA_DTYPE_FP16)
        return _mm256_cvtph_ps(raw);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

/* fp32 -> bf16 by adding `add` to the bits and keeping the high half (NaN to the canonical quiet NaN),
 * one result in the low half of each 32-bit lane: base/half.h's round-to-nearest-even with add = 0x7fff +
 * the lowest kept bit, moments.h's stochastic rounding with add = 16 random bits. */
AVX2_ALWAYS_INLINE __m256i avx2_bf16_round(__m256 p, __m256i add)
{
    __m256i x = _mm256_castps_si256(p);
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, add), 16);
    __m256i ax = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
    __m256i nan = _mm256_cmpgt_epi32(ax, _mm256_set1_epi32(0x7f800000));
    __m256i qnan = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x8000)),
                                   _mm256_set1_epi32(0x7fc0));
    return _mm256_blendv_epi8(r, qnan, nan);
}

/* Packs two vectors of 8 x 32-bit (all <= 0xffff) to 16-bit: a's eight in the low 128 bits, b's in the
 * high (packus works per 128-bit lane, then the quarters are put in order). */
AVX2_ALWAYS_INLINE __m256i avx2_pack16(__m256i a, __m256i b)
{
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
}

AVX2_ALWAYS_INLINE __m128i avx2_to_bf16(__m256 p)
{
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(p), 16), _mm256_set1_epi32(1));
    __m256i r = avx2_bf16_round(p, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    return _mm256_castsi256_si128(avx2_pack16(r, r));
}

AVX2_ALWAYS_INLINE __m128i avx2_to_half(__m256 p, strata_dtype dtype)
{
    return dtype == STRATA_DTYPE_FP16 ? _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                                      : avx2_to_bf16(p);
}

/* Stores the parameter copy of 8 elements; non-temporally with stream (the address must then be aligned:
 * see adam_arrays_aligned). */
AVX2_ALWAYS_INLINE void avx2_store_param(void *param, strata_dtype dtype, size_t i, __m256 p, bool stream)
{
    if (dtype == STRATA_DTYPE_NONE)
        return;
    if (dtype == STRATA_DTYPE_FP32) {
        float *d = (float *)param + i;
        if (stream)
            _mm256_stream_ps(d, p);
        else
            _mm256_storeu_ps(d, p);
        return;
    }
    __m128i *d = (__m128i *)((uint16_t *)param + i);
    if (stream)
        _mm_stream_si128(d, avx2_to_half(p, dtype));
    else
        _mm_storeu_si128(d, avx2_to_half(p, dtype));
}

/* adam_update_element() (cpu_adam/adam_scalar.h) on 8 lanes, the same operations in the same order: g is the
 * stored gradient, widened; p, m, v are updated in place. l2 is c->use_l2 as a compile-time constant. */
AVX2_ALWAYS_INLINE void avx2_adam_update(const adam_consts *c, __m256 g, __m256 *p, __m256 *m, __m256 *v, bool l2)
{
    g = _mm256_mul_ps(g, _mm256_set1_ps(c->grad_scale));
    if (l2)
        g = _mm256_fmadd_ps(*p, _mm256_set1_ps(c->l2), g);
    if (c->lerp)
        *m = _mm256_fmadd_ps(_mm256_set1_ps(c->lerp_coeff), _mm256_sub_ps(g, *m), c->lerp_from_m ? *m : g);
    else
        *m = _mm256_fmadd_ps(g, _mm256_set1_ps(c->one_minus_beta1), _mm256_mul_ps(*m, _mm256_set1_ps(c->beta1)));
    *v = _mm256_fmadd_ps(_mm256_mul_ps(g, _mm256_set1_ps(c->one_minus_beta2)), g,
                         _mm256_mul_ps(*v, _mm256_set1_ps(c->beta2)));
    __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(*v), _mm256_set1_ps(c->bc2_sqrt)),
                                 _mm256_set1_ps(c->eps));
    __m256 upd = _mm256_div_ps(_mm256_mul_ps(_mm256_set1_ps(c->neg_step), *m), denom);
    __m256 pd = _mm256_mul_ps(*p, _mm256_set1_ps(c->decay));
    ADAM_KEEP_ROUNDED(pd);
    *p = _mm256_add_ps(pd, upd);
}

/* A tail of n < 8 elements at i run through the 8-lane code: zero-padded local copies of the master
 * weights, gradient and parameter copy, with `a` addressing them from 0 (its moment pointers are left to
 * the kernel). Used in place: `a` points into the struct. */
typedef struct avx2_tail {
    float p[8];
    _Alignas(32) unsigned char g[32], out[32];
    adam_arrays a;
} avx2_tail;

AVX2_ALWAYS_INLINE void avx2_tail_load(avx2_tail *t, const adam_arrays *a, size_t i, size_t n)
{
    size_t gb = strata_dtype_bytes(a->grad_dtype);
    memset(t, 0, sizeof *t);
    memcpy(t->p, a->master + i, n * 4);
    memcpy(t->g, (const char *)a->grad + i * gb, n * gb);
    t->a = (adam_arrays){t->p, NULL, NULL, t->g, a->param_dtype == STRATA_DTYPE_NONE ? NULL : t->out,
                         a->grad_dtype, a->param_dtype, false};
}

AVX2_ALWAYS_INLINE void avx2_tail_store(const avx2_tail *t, const adam_arrays *a, size_t i, size_t n)
{
    size_t pb = strata_dtype_bytes(a->param_dtype);
    memcpy(a->master + i, t->p, n * 4);
    if (pb)
        memcpy((char *)a->param + i * pb, t->out, n * pb);
}

#endif
