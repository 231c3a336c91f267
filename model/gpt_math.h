/* The GPT host kernels' elementwise math, inlined where it is used so that GCC vectorizes the loops for each file's
 * ISA: a fast e^x and tanh (libm's expf and tanhf do not vectorize and were a quarter of the model's time), and the
 * GELU bodies that gpt_kernels.c builds for baseline x86-64 and gpt_gelu_avx2.c for AVX2 + FMA. The loops clamp
 * before they compute: files that use them are built with -fno-trapping-math (CMakeLists.txt), without which GCC
 * does not if-convert, and so does not vectorize, them. */
#ifndef STRATA_MODEL_GPT_MATH_H
#define STRATA_MODEL_GPT_MATH_H

#include <stddef.h>
#include <stdint.h>

/* e^x to 1.4 ulp for x in [-87, 88] (Cephes' expf: x = n ln2 + r, a degree-5 polynomial for e^r, 2^n from the
 * exponent bits), written so that GCC vectorizes the loops that call it; libm's expf and tanhf do not vectorize and
 * were a quarter of the model's time. */
static inline float exp_fast(float x)
{
    x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest: 1.5 * 2^23 */
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    union {
        int32_t i;
        float f;
    } two_n = {.i = ((int32_t)n + 127) << 23};
    return (p * r * r + r + 1.0f) * two_n.f;
}

/* tanh u = 1 - 2 / (e^2u + 1), within 2e-7 of tanh (absolute; measured over [-10, 10]). */
static inline float tanh_fast(float u)
{
    return 1.0f - 2.0f / (exp_fast(2.0f * u) + 1.0f);
}

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */

/* GELU, tanh approximation (GPT-2's), of n elements; the backward multiplies d (the output's gradient) in place. */
static inline __attribute__((always_inline)) void gelu_forward_body(float *out, const float *inp, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanh_fast(GELU_SCALE * (x + 0.044715f * x * x * x)));
    }
}

static inline __attribute__((always_inline)) void gelu_backward_body(float *d, const float *inp, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float x = inp[i], u = GELU_SCALE * (x + 0.044715f * x * x * x), th = tanh_fast(u);
        float sech2 = 1.0f - th * th;
        float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        d[i] *= grad;
    }
}

/* gpt_gelu_avx2.c: the bodies built for AVX2 + FMA (call only where the CPU has both). */
void gelu_forward_avx2(float *out, const float *inp, size_t n);
void gelu_backward_avx2(float *d, const float *inp, size_t n);

#endif
