/*
 * The compressed storage forms of Adam's moments (exp_avg m, exp_avg_sq v), specified in scalar C. The
 * master weights stay fp32; only m and v change form. The SIMD kernels (adam_moments_<isa>.c) give the
 * bits these functions give; the tests check it.
 *
 * bf16 with stochastic rounding. A moment x is narrowed to bf16 by adding a random 16-bit value r to the
 * low half of its fp32 bits and keeping the high half: it rounds away from zero with probability
 * (low half)/2^16, so the stored value is x in expectation (round-to-nearest would lose the small
 * increments (1 - beta2) * g^2 that make up v). NaN becomes the canonical quiet NaN (base/half.h); inf stays
 * inf; a finite value above bf16's largest may round to inf. Widening is exact. r is a counter-based hash
 * of (seed, step, element index): the same call gives the same bits whatever the thread or lane split,
 * and a different step gives fresh bits. One 32-bit hash per element serves both moments: m takes its low
 * half, v its high half. The hash is of key + index (moments_sr_bits), so that a SIMD kernel keeps it as a
 * counter it adds 8 to (one instruction per 8 elements rather than four).
 *
 * 8-bit block-wise (Dettmers et al., "8-bit Optimizers via Block-wise Quantization", 2022). Each block of
 * MOMENTS_Q8_BLOCK elements stores one fp32 scale, absmax = max |x| of the block, and one byte per
 * element: the index of the code nearest x / absmax in a 256-entry "dynamic" map (a sign, then a run of
 * zeros that picks the decade, then the bits of a linear fraction: codes dense near zero and spread over
 * seven decades). m uses the signed map, v (never negative) the unsigned one, whose sign bit becomes a
 * fraction bit. Dequantization is code[q] * absmax. The rules at the edges:
 *   - absmax is the integer maximum of the bits with the sign cleared (so a NaN, then an inf, wins);
 *   - a block holding NaN or inf stores scale NaN and every index = the map's zero: it reads back all NaN;
 *   - x / absmax is computed as x * (1 / max(absmax, FLT_MIN)): a block below FLT_MIN reads back as zeros;
 *   - "nearest" is q = the number of midpoints mid[k] = (code[k] + code[k+1]) / 2 (fp32) below the
 *     normalised value, so a value exactly on a midpoint takes the lower code.
 * A kernel's range must start on a block boundary (element index a multiple of MOMENTS_Q8_BLOCK); the last
 * block of an array may be short, and its scale covers only its own elements.
 */
#ifndef STRATA_CPU_ADAM_MOMENTS_H
#define STRATA_CPU_ADAM_MOMENTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------ bf16, stochastic rounding */

/* The murmur3 finaliser: a bijection of 32-bit values with full avalanche (for the keys). */
static inline uint32_t moments_mix32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x85ebca6bu;
    x ^= x >> 13;
    x *= 0xc2b2ae35u;
    x ^= x >> 16;
    return x;
}

/* The per-element mixer of stochastic rounding: the murmur3 finaliser without its first xorshift, a
 * bijection (odd multiplies, xorshifts), so each half of the result is exactly uniform over the random
 * step keys: the rounding of every element is unbiased whatever the mixer's quality. The quality only
 * decides how independent the roundings of different elements in one step are. The dropped xorshift folds
 * high input bits into low ones, and here the input's varying bits are the low ones (key + element index);
 * tests/t_adam_moments checks uniformity and the independence of neighbours' halves. Six instructions on 8
 * lanes where the full finaliser takes eight: b_adam_moments measures that the step is bound by its vector
 * instruction count, not by the multiplies' latency. */
static inline uint32_t moments_sr_mix(uint32_t x)
{
    x *= 0x85ebca6bu;
    x ^= x >> 13;
    x *= 0xc2b2ae35u;
    x ^= x >> 16;
    return x;
}

/* The key of one step of one array: splitmix64 of (seed, step). Different steps give unrelated keys. */
uint32_t moments_sr_key(uint64_t seed, int64_t step);

/* The key of the 2^32 elements whose index has high half hi (so that indices past 2^32 get fresh bits). */
static inline uint32_t moments_sr_key_hi(uint32_t key, uint32_t hi)
{
    return moments_mix32(key + hi * 0x9e3779b9u);
}

/* The 32 random bits of element i: the low half rounds m, the high half rounds v. */
static inline uint32_t moments_sr_bits(uint32_t key, size_t i)
{
    return moments_sr_mix((uint32_t)i + moments_sr_key_hi(key, (uint32_t)((uint64_t)i >> 32)));
}

/* fp32 -> bf16, rounding up in magnitude with probability (low 16 bits of x) / 2^16; r is 16 random bits. */
static inline uint16_t moments_bf16_round_sr(float x, uint32_t r16)
{
    union { float f; uint32_t u; } b = {x};
    if ((b.u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)(((b.u >> 16) & 0x8000u) | 0x7fc0u);
    return (uint16_t)((b.u + r16) >> 16);
}

/* ------------------------------------------------------------------ 8-bit block-wise */

#define MOMENTS_Q8_BLOCK 2048

/* The buckets of the fast nearest-code search: the fp32 bits of |y| >> 15 (exponent and 8 mantissa
 * bits), clamped to [2^-24, 1.0]; negative values get the mirrored buckets below. Each bucket holds at
 * most one midpoint, and the clamped ones none (checked when the map is made), so one table entry and one
 * integer compare finish the search: the entry holds the number of midpoints below the bucket (bits 0-7)
 * and the low 15 bits of the midpoint inside it, in the bucket's order (bits 16-30: mirrored for a negative
 * bucket; 0x7fff when no midpoint is inside, which no value exceeds). */
#define MOMENTS_Q8_BUCKET_SHIFT 15
#define MOMENTS_Q8_BUCKET_LOW_BITS 0x7fffu
#define MOMENTS_Q8_BUCKET_LO (0x33800000u >> MOMENTS_Q8_BUCKET_SHIFT) /* 2^-24 */
#define MOMENTS_Q8_BUCKET_HI (0x3f800000u >> MOMENTS_Q8_BUCKET_SHIFT) /* 1.0 */
#define MOMENTS_Q8_BUCKETS (MOMENTS_Q8_BUCKET_HI - MOMENTS_Q8_BUCKET_LO + 1)

typedef struct moments_q8_map {
    float code[256];  /* ascending; code[zero] == 0, code[255] == 1 */
    float mid[256];   /* mid[k] = (code[k] + code[k+1]) / 2 for k < 255; mid[255] = +inf */
    uint8_t zero;     /* the index of code 0 */
    uint32_t bucket[2 * MOMENTS_Q8_BUCKETS]; /* negative buckets first, in value order */
} moments_q8_map;

/* The two maps, made on first use (thread-safe): signed for m, unsigned for v. */
const moments_q8_map *moments_q8_signed(void);
const moments_q8_map *moments_q8_unsigned(void);

/* The specification of "nearest": the number of midpoints below y, by binary search. */
uint8_t moments_q8_nearest(const moments_q8_map *map, float y);

/* The same result by bucket lookup and one compare (what the SIMD kernels do), for |y| <= 1.0039. */
static inline uint8_t moments_q8_nearest_fast(const moments_q8_map *map, float y)
{
    union { float f; uint32_t u; } b = {y};
    uint32_t mag = (b.u & 0x7fffffffu) >> MOMENTS_Q8_BUCKET_SHIFT;
    uint32_t key = (mag < MOMENTS_Q8_BUCKET_LO ? MOMENTS_Q8_BUCKET_LO : mag > MOMENTS_Q8_BUCKET_HI ? MOMENTS_Q8_BUCKET_HI : mag) -
                   MOMENTS_Q8_BUCKET_LO;
    bool neg = b.u >> 31;
    uint32_t entry = map->bucket[neg ? MOMENTS_Q8_BUCKETS - 1 - key : MOMENTS_Q8_BUCKETS + key];
    uint32_t low = (b.u & MOMENTS_Q8_BUCKET_LOW_BITS) ^ (neg ? MOMENTS_Q8_BUCKET_LOW_BITS : 0); /* in value order */
    return (uint8_t)((entry & 0xffu) + (low > entry >> 16));
}

/* The block's scale from absmax_bits (the largest of its values' bits with the sign cleared) and the
 * reciprocal its values are normalised by (see the rules above). Returns false when the block holds NaN
 * or inf: *scale is then NaN and the indices are all the map's zero. */
static inline bool moments_q8_scale(uint32_t absmax_bits, float *scale, float *inv)
{
    union { uint32_t u; float f; } b = {absmax_bits >= 0x7f800000u ? 0x7fc00000u : absmax_bits};
    *scale = b.f;
    *inv = 1.0f / (b.f > 0x1p-126f ? b.f : 0x1p-126f);
    return absmax_bits < 0x7f800000u;
}

/* Quantizes one block of n <= MOMENTS_Q8_BLOCK values: writes q[0..n) and *scale. */
void moments_q8_quantize_block(const moments_q8_map *map, const float *x, size_t n, uint8_t *q, float *scale);

static inline float moments_q8_dequantize(const moments_q8_map *map, uint8_t q, float scale)
{
    return map->code[q] * scale;
}

#endif
