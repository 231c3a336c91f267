/*
 * Proves that base/half.h — the one specification of strata's bf16/fp16 rounding — is round-to-nearest-even
 * with NaN kept NaN, overflow to infinity and subnormals kept, against an independent oracle that rounds
 * in double arithmetic (nearbyint at the target's unit in the last place), and that widening is exact for
 * all 65536 inputs of each type.
 */
#include <fenv.h>
#include <math.h>

#include "base/half.h"
#include "testlib.h"

/* Rounds f to `bits` significant bits with the smallest unit 2^min_ulp_exp and overflow at max_exp. */
static double oracle_round(float f, int bits, int min_ulp_exp, int max_exp)
{
    double d = f;
    if (d == 0.0)
        return d;
    int e;
    frexp(d, &e); /* d = m * 2^e, m in [0.5, 1) */
    int ulp_exp = e - bits;
    if (ulp_exp < min_ulp_exp)
        ulp_exp = min_ulp_exp;
    double q = ldexp(nearbyint(ldexp(d, -ulp_exp)), ulp_exp);
    if (fabs(q) >= ldexp(1.0, max_exp))
        return copysign(INFINITY, d);
    return q;
}

/* One narrowing format: its conversions and the oracle's parameters (significant bits, smallest unit,
 * the power of two that overflows). */
typedef struct format {
    const char *name;
    uint16_t (*narrow)(float);
    float (*widen)(uint16_t);
    int bits, min_ulp_exp, max_exp;
} format;

static const format bf16 = {"bf16", cvt_f32_to_bf16, cvt_bf16_to_f32, 8, -133, 128};
static const format fp16 = {"fp16", cvt_f32_to_fp16, cvt_fp16_to_f32, 11, -24, 16};

static void check(const format *fmt, float f)
{
    uint16_t got = fmt->narrow(f);
    double have = fmt->widen(got);
    if (isnan(f)) {
        T_CHECK(isnan(have), "%s(NaN 0x%08x) = 0x%04x is not NaN", fmt->name, cvt_f32_bits(f), got);
        return;
    }
    double want = oracle_round(f, fmt->bits, fmt->min_ulp_exp, fmt->max_exp);
    T_CHECK(have == want && !signbit(have) == !signbit(want), "%s(0x%08x = %a) = 0x%04x = %a, oracle %a",
            fmt->name, cvt_f32_bits(f), f, got, have, want);
}

int main(void)
{
    fesetround(FE_TONEAREST);
    t_rng_seed();

    /* Widening is exact: every 16-bit pattern against ldexp arithmetic. */
    for (uint32_t h = 0; h < 65536 && t_failures < 20; h++) {
        float b = cvt_bf16_to_f32((uint16_t)h);
        T_CHECK(cvt_f32_bits(b) == h << 16, "bf16 0x%04x widened to 0x%08x", h, cvt_f32_bits(b));
        float f = cvt_fp16_to_f32((uint16_t)h);
        int exp = (h >> 10) & 31, mant = h & 1023;
        double want = exp == 0 ? ldexp(mant, -24) : exp == 31 ? (mant ? NAN : INFINITY) : ldexp(1024 + mant, exp - 25);
        if (h & 0x8000)
            want = -want;
        T_CHECK(isnan(want) ? isnan(f) : (f == want && !signbit(f) == !signbit(want)),
                "fp16 0x%04x widened to %a, want %a", h, f, want);
        /* Narrowing what was widened gives the pattern back (NaNs aside). */
        if (!isnan(b))
            T_CHECK(cvt_f32_to_bf16(b) == h, "bf16 round trip of 0x%04x gave 0x%04x", h, cvt_f32_to_bf16(b));
        if (!isnan(f))
            T_CHECK(cvt_f32_to_fp16(f) == h, "fp16 round trip of 0x%04x gave 0x%04x", h, cvt_f32_to_fp16(f));
    }

    /* Every exponent, with mantissas at and around the rounding ties, plus random patterns. */
    static const uint32_t low[] = {0, 1, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x2001, 0x7fff, 0x8000,
                                   0x8001, 0xffff, 0x10000, 0x18000, 0x7fffff, 0x400000, 0x3fe000};
    for (uint32_t sign = 0; sign < 2; sign++)
        for (uint32_t exp = 0; exp < 256; exp++)
            for (size_t k = 0; k < sizeof low / sizeof low[0]; k++) {
                float f = cvt_bits_f32(sign << 31 | exp << 23 | (low[k] & 0x7fffff));
                check(&bf16, f);
                check(&fp16, f);
            }
    for (int i = 0; i < 2000000 && t_failures < 20; i++) {
        float f = cvt_bits_f32((uint32_t)t_rand_u64());
        check(&bf16, f);
        check(&fp16, f);
    }
    /* Named edges: the fp16 overflow tie, the largest finite values, the smallest subnormals. */
    T_EQ_INT(cvt_f32_to_fp16(65519.0f), 0x7bff);
    T_EQ_INT(cvt_f32_to_fp16(65520.0f), 0x7c00);
    T_EQ_INT(cvt_f32_to_fp16(0x1p-25f), 0x0000);
    T_EQ_INT(cvt_f32_to_fp16(0x1.000002p-25f), 0x0001);
    T_EQ_INT(cvt_f32_to_fp16(-0x1p-24f), 0x8001);
    T_EQ_INT(cvt_f32_to_bf16(0x1.fffffep127f), 0x7f80);
    T_EQ_INT(cvt_f32_to_bf16(cvt_bits_f32(0x00000001u)), 0x0000);
    T_EQ_INT(cvt_f32_to_bf16(cvt_bits_f32(0x00008001u)), 0x0001);
    T_EQ_INT(cvt_f32_to_bf16(NAN), 0x7fc0);
    T_EQ_INT(cvt_f32_to_fp16(-NAN), 0xfe00);
    return t_done();
}
