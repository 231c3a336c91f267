/*
 * bf16 / fp16 <-> fp32 conversions in scalar form: the one place where strata's rounding is specified.
 *
 * Narrowing is round-to-nearest-even, NaN stays NaN, overflow goes to infinity, subnormals are kept
 * (never flushed) — the same results as PyTorch's c10::BFloat16 / c10::Half conversions. Only the
 * payload of a NaN is unspecified: these functions return PyTorch's canonical quiet NaN (0x7FC0 /
 * 0x7E00 with the sign kept), while the SIMD kernels may keep the input's payload bits.
 * Widening is exact. Everything is integer arithmetic so that no compiler flag (FMA contraction,
 * flush-to-zero) can change a result; the SIMD kernels are tested against these bit for bit.
 */
#ifndef STRATA_BASE_HALF_H
#define STRATA_BASE_HALF_H

#include <stdint.h>
#include <string.h>

/* How each function is declared: a CUDA file that includes this header defines CVT_FN as
 * `__host__ __device__ static inline` first, so that its kernels narrow with these very lines. */
#ifndef CVT_FN
#define CVT_FN static inline
#endif

CVT_FN uint32_t cvt_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

CVT_FN float cvt_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* fp32 -> bf16: add 0x7FFF plus the lowest kept bit, keep the high half (c10::round_to_nearest_even). */
CVT_FN uint16_t cvt_f32_to_bf16(float f)
{
    uint32_t x = cvt_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)(((x >> 16) & 0x8000u) | 0x7fc0u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

CVT_FN float cvt_bf16_to_f32(uint16_t h)
{
    return cvt_bits_f32((uint32_t)h << 16);
}

/* fp32 -> fp16 (IEEE binary16), round to nearest even at the kept bit in each range. */
CVT_FN uint16_t cvt_f32_to_fp16(float f)
{
    uint32_t x = cvt_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;

    if (ax > 0x7f800000u)                    /* NaN */
        return sign | 0x7e00u;
    if (ax >= 0x477ff000u)                   /* >= 65520 rounds (ties to even) to infinity */
        return sign | 0x7c00u;
    if (ax >= 0x38800000u) {                 /* fp16 normal range, >= 2^-14 */
        uint32_t r = ax + 0x0fffu + ((ax >> 13) & 1u);
        return sign | (uint16_t)((r - 0x38000000u) >> 13); /* rebias the exponent from 127 to 15 */
    }
    if (ax <= 0x33000000u)                   /* <= 2^-25: half of the smallest subnormal ties to 0 */
        return sign;
    /* fp16 subnormal: the result is round(value / 2^-24) = round(mant * 2^(e - 126 - 24 + 24)). */
    uint32_t e = ax >> 23;
    uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e;               /* 14 .. 24 here */
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u)))
        q++;
    return sign | (uint16_t)q;
}

CVT_FN float cvt_fp16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;

    if (exp == 0x1fu) /* inf, or NaN made quiet as the hardware conversion does */
        return cvt_bits_f32(sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u));
    if (exp == 0) {
        if (mant == 0)
            return cvt_bits_f32(sign);
        /* A subnormal is mant * 2^-24: exact in fp32, and a power-of-two scale of a small integer. */
        return cvt_bits_f32(sign | cvt_f32_bits((float)mant * 0x1p-24f));
    }
    return cvt_bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

#endif
