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

AVX2_ALWAYS_INLINE __m128i avx2_to_bf16(__m256 p)
{
    __m256i x = _mm256_castps_si256(p);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    __m256i ax = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
    __m256i nan = _mm256_cmpgt_epi32(ax, _mm256_set1_epi32(0x7f800000));
    __m256i qnan = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x8000)),
                                   _mm256_set1_epi32(0x7fc0));
    r = _mm256_blendv_epi8(r, qnan, nan);
    /* Pack 8 x 32-bit (all <= 0xffff) to 16-bit: packus works per 128-bit lane, then gather the halves. */
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xd8);
    return _mm256_castsi256_si128(packed);
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

#endif
