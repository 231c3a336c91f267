/* The GPT's initial values as one loop body, built twice (gpt_init.c for the baseline x86-64, gpt_init_avx2.c for
 * AVX2 without FMA): each element is only exactly rounded IEEE float operations on hashed integers, so both builds,
 * any CPU and any chunking give the same bits (ranks agree on them by checksum, rank_agree.h). Not for other files. */
#ifndef STRATA_MODEL_GPT_INIT_BODY_H
#define STRATA_MODEL_GPT_INIT_BODY_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "model/gpt.h"

/* ln x for x in (0, 1]: x = m 2^e with m in [sqrt(1/2), sqrt(2)), ln m from Cephes logf's polynomial in m - 1;
 * branch-free so the loop vectorizes. */
static inline float init_ln_unit(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    uint32_t mbits = (bits & 0x7fffffu) | 0x3f800000u;
    float m;
    memcpy(&m, &mbits, sizeof m);
    int e = (int)(bits >> 23) - 127;
    int high = m > 1.41421356f;
    m *= high ? 0.5f : 1.0f;
    e += high;
    float f = m - 1.0f, z = f * f;
    float p = 7.0376836292e-2f;
    p = p * f - 1.1514610310e-1f;
    p = p * f + 1.1676998740e-1f;
    p = p * f - 1.2420140846e-1f;
    p = p * f + 1.4249322787e-1f;
    p = p * f - 1.6668057665e-1f;
    p = p * f + 2.0000714765e-1f;
    p = p * f - 2.4999993993e-1f;
    p = p * f + 3.3333331174e-1f;
    return f * z * p - 0.5f * z + f + (float)e * 0.693147180559945f;
}

/* cos(2 pi u) for u in [0, 1): folded onto a in [0, 1/4] turns (cos is even and cos(pi - x) = -cos x), then the
 * Taylor series of cos to x^12, whose error on [0, pi/2] is below 1e-8. */
static inline float init_cos_turn(float u)
{
    float t = u - (float)(int)(u + 0.5f); /* [-1/2, 1/2] */
    float a = fabsf(t);
    int far = a > 0.25f;
    a = far ? 0.5f - a : a;
    float x = 6.28318530717958648f * a, x2 = x * x;
    float c = -1.1470745597729725e-11f;
    c = c * x2 + 2.0876756987868099e-9f;
    c = c * x2 - 2.7557319223985893e-7f;
    c = c * x2 + 2.4801587301587302e-5f;
    c = c * x2 - 1.3888888888888889e-3f;
    c = c * x2 + 4.1666666666666666e-2f;
    c = c * x2 - 0.5f;
    c = c * x2 + 1.0f;
    return far ? -c : c;
}

/* A standard normal from a counter (Box-Muller on two hashed uniforms; u1 has 31 bits, so |z| < 6.7), so any
 * element can be made alone. The hashes run first, the float part after them in one vectorizable loop. */
static inline void gpt_init_normals_body(uint64_t base, size_t first, size_t count, float scale, float *out)
{
    enum { BLOCK = 512 };
    int32_t h1[BLOCK], h2[BLOCK];
    for (size_t at = 0; at < count; at += BLOCK) {
        size_t n = count - at < BLOCK ? count - at : BLOCK;
        for (size_t j = 0; j < n; j++) {
            uint64_t a = gpt_mix64(base ^ ((first + at + j) * 0x9e3779b97f4a7c15ull));
            uint64_t b = gpt_mix64(a ^ 0x5851f42d4c957f2dull);
            h1[j] = (int32_t)(a >> 33);
            h2[j] = (int32_t)(b >> 40);
        }
        float *o = out + at;
#pragma omp simd
        for (size_t j = 0; j < n; j++) {
            float u1 = ((float)h1[j] + 0.5f) * 0x1.0p-31f, u2 = (float)h2[j] * 0x1.0p-24f;
            o[j] = scale * (sqrtf(-2.0f * init_ln_unit(u1)) * init_cos_turn(u2));
        }
    }
}

#endif
