/*
 * Moments between fp32 and their storage form outside the step (cpu_adam/moments_convert.h): what checkpoints rely
 * on to save compressed moments as fp32 and narrow them again on load without changing a value.
 *   - bf16: stochastically rounded values widen and narrow back to their bits (NaN included, canonical);
 *   - 8-bit m and v: for blocks of many magnitudes, one holding a zero, one of zeros only, one holding a NaN, one
 *     holding an inf, and a short last block, quantize -> dequantize -> narrow -> dequantize gives every value back
 *     bit for bit, and v's codes and scales too. Plain re-quantization would not for m: the signed map's most
 *     negative code is not -1, so a block whose largest magnitude is negative re-quantizes with a smaller scale
 *     (checked, so the recovery is seen to matter);
 *   - a block below FLT_MIN cannot be given back (its values are normalised by 1/FLT_MIN): narrowing counts it;
 *   - the zero state: narrowing zeros gives the map's zero code and scale 0, as the engine's initial moments.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "cpu_adam/moments.h"
#include "cpu_adam/moments_convert.h"
#include "testlib.h"

#define NBLOCKS 9
#define N (NBLOCKS * MOMENTS_Q8_BLOCK - 777) /* a short last block */
#define MIN_N(left) ((left) < MOMENTS_Q8_BLOCK ? (left) : MOMENTS_Q8_BLOCK)

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Block b: random values at magnitude 10^(3 - 4b), with the special content the header lists. */
static void fill(float *x, bool sq)
{
    for (size_t i = 0; i < N; i++) {
        size_t b = i / MOMENTS_Q8_BLOCK;
        float v = t_rand_normal() * powf(10.0f, 3.0f - 4.0f * (float)(b % 6));
        x[i] = sq ? fabsf(v) : v;
    }
    x[1 * MOMENTS_Q8_BLOCK + 5] = 0.0f;                                  /* a zero among values */
    memset(x + 2 * MOMENTS_Q8_BLOCK, 0, MOMENTS_Q8_BLOCK * sizeof *x); /* zeros only */
    for (size_t k = 0; k < MOMENTS_Q8_BLOCK; k++)                       /* below FLT_MIN */
        x[3 * MOMENTS_Q8_BLOCK + k] = (sq ? 1.0f : (k & 1 ? -1.0f : 1.0f)) * 0x1p-140f * (float)(k % 7);
    x[4 * MOMENTS_Q8_BLOCK + 100] = NAN;
    x[5 * MOMENTS_Q8_BLOCK + 9] = sq ? INFINITY : -INFINITY;
}

/* Returns how many blocks plain re-quantization would have changed. */
static size_t check_q8(bool sq)
{
    static float x[N], wide[N], again[N];
    static uint8_t q[N], q2[N], q3[N];
    float s[NBLOCKS], s2[NBLOCKS];
    fill(x, sq);
    moments_narrow(STRATA_MOMENTS_8BIT, sq, x, N, q, s);
    moments_widen(STRATA_MOMENTS_8BIT, sq, q, s, N, wide);
    size_t inexact = moments_narrow(STRATA_MOMENTS_8BIT, sq, wide, N, q2, s2);
    moments_widen(STRATA_MOMENTS_8BIT, sq, q2, s2, N, again);
    T_EQ_INT(inexact, 1); /* the block below FLT_MIN */
    size_t plain = 0;
    for (size_t b = 0; b < NBLOCKS; b++) {
        size_t lo = b * MOMENTS_Q8_BLOCK, n = MIN_N(N - lo);
        if (b == 3)
            continue;
        bool same = true;
        for (size_t k = 0; k < n; k++)
            same &= bits(wide[lo + k]) == bits(again[lo + k]);
        T_CHECK(same, "%s block %zu: values change on a round trip (scale %a, narrowed again %a)", sq ? "v" : "m", b,
                (double)s[b], (double)s2[b]);
        if (sq)
            T_CHECK(memcmp(q + lo, q2 + lo, n) == 0 && bits(s[b]) == bits(s2[b]), "v block %zu: codes or scale change",
                    b);
        float sp;
        moments_q8_quantize_block(sq ? moments_q8_unsigned() : moments_q8_signed(), wide + lo, n, q3 + lo, &sp);
        plain += bits(sp) != bits(s[b]) && sp == sp;
    }
    T_CHECK(isnan(s[4]) && isnan(s[5]) && isnan(wide[4 * MOMENTS_Q8_BLOCK]), "NaN/inf blocks do not read back NaN");
    T_CHECK(wide[MOMENTS_Q8_BLOCK + 5] == 0.0f, "the zero inside a block reads back %a",
            (double)wide[MOMENTS_Q8_BLOCK + 5]);
    return plain;
}

static void check_bf16(void)
{
    static float x[N], wide[N];
    static uint16_t h[N], h2[N];
    fill(x, false);
    uint32_t key = moments_sr_key(7, 3);
    for (size_t i = 0; i < N; i++)
        h[i] = moments_bf16_round_sr(x[i], moments_sr_bits(key, i) & 0xffffu);
    moments_widen(STRATA_MOMENTS_BF16, false, h, NULL, N, wide);
    moments_narrow(STRATA_MOMENTS_BF16, false, wide, N, h2, NULL);
    T_CHECK(memcmp(h, h2, sizeof h) == 0, "bf16 moments change on a round trip");
}

static void check_zeros(void)
{
    static float z[2 * MOMENTS_Q8_BLOCK];
    static uint8_t q[2 * MOMENTS_Q8_BLOCK];
    float s[2];
    for (int sq = 0; sq < 2; sq++) {
        moments_narrow(STRATA_MOMENTS_8BIT, sq, z, 2 * MOMENTS_Q8_BLOCK, q, s);
        uint8_t zero = (sq ? moments_q8_unsigned() : moments_q8_signed())->zero;
        bool all = bits(s[0]) == 0 && bits(s[1]) == 0;
        for (size_t i = 0; i < 2 * MOMENTS_Q8_BLOCK; i++)
            all &= q[i] == zero;
        T_CHECK(all, "%s: zeros quantize to something other than the map's zero with scale 0", sq ? "v" : "m");
    }
}

int main(void)
{
    size_t plain = 0;
    for (int trial = 0; trial < 4; trial++)
        plain += check_q8(false);
    check_q8(true);
    printf("m: plain re-quantization changes %zu of 20 blocks' scales (the signed map's most negative code is "
           "%.9g); the recovered scales give every value back\n", plain, (double)moments_q8_signed()->code[0]);
    T_CHECK(plain > 0, "no m block had a negative absmax: the test does not exercise the recovery");
    check_bf16();
    check_zeros();
    return t_done();
}
