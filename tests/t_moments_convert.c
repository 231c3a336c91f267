/*
 * Moments between fp32 and their storage form outside the step (cpu_adam/moments_convert.h): what checkpoints rely
 * on to save compressed moments as fp32 and narrow them again on load.
 *   - bf16: stochastically rounded values widen and narrow back to their bits (NaN included, canonical);
 *   - 8-bit v (the unsigned map): for blocks of many magnitudes, one holding a zero, one of zeros only, one holding
 *     a NaN, one holding an inf, and a short last block, quantize -> dequantize -> quantize gives the same codes and
 *     the same scale;
 *   - 8-bit m (the signed map) does NOT survive it: the map's most negative code is not -1, so a block whose
 *     largest magnitude is negative re-quantizes with a smaller scale. This is why strata_save refuses 8-bit
 *     moments (engine/ckpt/checkpoint.c); the test keeps the fact in view;
 *   - a block below FLT_MIN does not survive either (its values are normalised by 1/FLT_MIN);
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

/* The blocks that survive a round trip: every one for v except the one below FLT_MIN; for m the NaN, inf and zero
 * blocks only. Returns how many m blocks changed their scale. */
static size_t check_q8(bool sq)
{
    static float x[N], wide[N];
    static uint8_t q[N], q2[N];
    float s[NBLOCKS], s2[NBLOCKS];
    fill(x, sq);
    moments_narrow(STRATA_MOMENTS_8BIT, sq, x, N, q, s);
    moments_widen(STRATA_MOMENTS_8BIT, sq, q, s, N, wide);
    moments_narrow(STRATA_MOMENTS_8BIT, sq, wide, N, q2, s2);
    size_t changed = 0;
    for (size_t b = 0; b < NBLOCKS; b++) {
        size_t lo = b * MOMENTS_Q8_BLOCK, n = MIN_N(N - lo);
        bool same = memcmp(q + lo, q2 + lo, n) == 0 && bits(s[b]) == bits(s2[b]);
        if (b == 3)
            continue; /* below FLT_MIN */
        if (sq || b == 2 || b == 4 || b == 5)
            T_CHECK(same, "%s block %zu: scale %a re-quantized as %a, codes %s", sq ? "v" : "m", b, (double)s[b],
                    (double)s2[b], memcmp(q + lo, q2 + lo, n) ? "changed" : "the same");
        changed += !same;
    }
    T_CHECK(isnan(s[4]) && isnan(s[5]) && isnan(wide[4 * MOMENTS_Q8_BLOCK]), "NaN/inf blocks do not read back NaN");
    T_CHECK(wide[MOMENTS_Q8_BLOCK + 5] == 0.0f, "the zero inside a block reads back %a",
            (double)wide[MOMENTS_Q8_BLOCK + 5]);
    return changed;
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
    size_t changed = check_q8(false);
    check_q8(true);
    printf("m: %zu of %d blocks of values change on a round trip; the signed map's most negative code is %.9g\n",
           changed, NBLOCKS - 4, (double)moments_q8_signed()->code[0]);
    T_CHECK(moments_q8_signed()->code[0] != -1.0f || changed == 0,
            "the signed map reaches -1 now: 8-bit checkpoints could be exact (engine/ckpt/checkpoint.c refuses them)");
    check_bf16();
    check_zeros();
    return t_done();
}
