/*
 * AVX-512 loads and stores of gradients and parameter copies, 16 elements at a time, shared by the
 * *_avx512.c files (only they may include it: it needs their compile flags).
 *
 * Every conversion gives the bits of base/half.h: widening is exact; fp16 narrowing is vcvtps2ph with
 * round-to-nearest-even; bf16 narrowing is AVX512-BF16's vcvtneps2bf16 where the CPU has it. That
 * instruction treats subnormal inputs as zero, unlike PyTorch, so a vector holding a subnormal (or a
 * NaN, to return PyTorch's canonical NaN) takes the integer path of base/half.h instead; that is rare and
 * costs nothing when it does not happen.
 */
#ifndef STRATA_CPU_ADAM_SIMD_AVX512_H
#define STRATA_CPU_ADAM_SIMD_AVX512_H

#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>

#include "strata.h"

#define AVX512_ALWAYS_INLINE static inline __attribute__((always_inline))

/* Loads 16 gradient elements as fp32; lanes outside k read as zero. */
AVX512_ALWAYS_INLINE __m512 avx512_load_grad(const void *grad, strata_dtype dtype, size_t i, __mmask16 k, bool full)
{
    if (dtype == STRATA_DTYPE_FP32) {
        const float *g = (const float *)grad + i;
        return full ? _mm512_loadu_ps(g) : _mm512_maskz_loadu_ps(k, g);
    }
    const uint16_t *h = (const uint16_t *)grad + i;
    __m256i raw = full ? _mm256_loadu_si256((const __m256i *)h) : _mm256_maskz_loadu_epi16(k, h);
    if (dtype == STRATA_DTYPE_FP16)
        return _mm512_cvtph_ps(raw);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

/* fp32 -> bf16 with integers, as cvt_f32_to_bf16() does it. */
AVX512_ALWAYS_INLINE __m256i avx512_bf16_rne_int(__m512 p)
{
    __m512i x = _mm512_castps_si512(p);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    __m512i ax = _mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(ax, _mm512_set1_epi32(0x7f800000));
    __m512i qnan = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x8000)),
                                   _mm512_set1_epi32(0x7fc0));
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(r, nan, qnan));
}

AVX512_ALWAYS_INLINE __m256i avx512_to_bf16(__m512 p, bool hw_bf16)
{
    if (!hw_bf16)
        return avx512_bf16_rne_int(p);
    /* fpclass 0x20 | 0x01 | 0x80: subnormal, quiet NaN, signalling NaN. */
    if (__builtin_expect(_mm512_fpclass_ps_mask(p, 0xa1) != 0, 0))
        return avx512_bf16_rne_int(p);
    return (__m256i)_mm512_cvtneps_pbh(p);
}

/* Stores the parameter copy of 16 elements (only lanes in k unless full); a full vector non-temporally
 * with stream (the address must then be aligned: see adam_arrays_aligned). */
AVX512_ALWAYS_INLINE void avx512_store_param(void *param, strata_dtype dtype, size_t i, __m512 p, __mmask16 k,
                                             bool full, bool hw_bf16, bool stream)
{
    if (dtype == STRATA_DTYPE_NONE)
        return;
    if (dtype == STRATA_DTYPE_FP32) {
        float *d = (float *)param + i;
        if (full && stream)
            _mm512_stream_ps(d, p);
        else if (full)
            _mm512_storeu_ps(d, p);
        else
            _mm512_mask_storeu_ps(d, k, p);
        return;
    }
    __m256i h = dtype == STRATA_DTYPE_FP16 ? _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                                           : avx512_to_bf16(p, hw_bf16);
    uint16_t *d = (uint16_t *)param + i;
    if (full && stream)
        _mm256_stream_si256((__m256i *)d, h);
    else if (full)
        _mm256_storeu_si256((__m256i *)d, h);
    else
        _mm256_mask_storeu_epi16(d, k, h);
}

/* Whether this CPU has the AVX512-BF16 conversion (looked up once per call site's caller). */
static inline bool avx512_has_bf16(void)
{
    return __builtin_cpu_supports("avx512bf16");
}

#endif
