/*
 * The gradient pre-pass, AVX2: sum of squares in fp32 lanes, moved to a double every block so that the
 * total stays accurate over a billion elements, and an inf/NaN flag from the exponent bits.
 */
#include "cpu_adam/adam.h"
#include "base/half.h"
#include "cpu_adam/simd_avx2.h"

/* Elements summed in fp32 before the partial sum goes to the double total. */
#define BLOCK 4096

AVX2_ALWAYS_INLINE void block(const void *grad, strata_dtype dt, size_t begin, size_t end, adam_gradstats *out)
{
    /* Four accumulators so that the FMA latency chain never limits the read speed. */
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(),
           acc3 = _mm256_setzero_ps();
    __m256i bad = _mm256_setzero_si256();
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), max_finite = _mm256_set1_epi32(0x7f7fffff);
#define ACC(acc, g)                                                                                            \
    do {                                                                                                       \
        acc = _mm256_fmadd_ps(g, g, acc);                                                                      \
        bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_castps_si256(g), abs_mask),     \
                                                      max_finite));                                            \
    } while (0)
    size_t i = begin;
    for (; i + 32 <= end; i += 32) {
        __m256 g0 = avx2_load_grad(grad, dt, i), g1 = avx2_load_grad(grad, dt, i + 8);
        __m256 g2 = avx2_load_grad(grad, dt, i + 16), g3 = avx2_load_grad(grad, dt, i + 24);
        ACC(acc0, g0);
        ACC(acc1, g1);
        ACC(acc2, g2);
        ACC(acc3, g3);
    }
#undef ACC
    __m256 acc = _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3));
    __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(acc)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(acc, 1));
    double lanes[4];
    _mm256_storeu_pd(lanes, _mm256_add_pd(lo, hi));
    double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    bool nonfinite = !_mm256_testz_si256(bad, bad);
    /* Fewer than 32 left: the same per-element work in scalar form. */
    for (; i < end; i++) {
        float g = dt == STRATA_DTYPE_FP32   ? ((const float *)grad)[i]
                  : dt == STRATA_DTYPE_FP16 ? cvt_fp16_to_f32(((const uint16_t *)grad)[i])
                                            : cvt_bf16_to_f32(((const uint16_t *)grad)[i]);
        sum += (double)(g * g);
        nonfinite |= (cvt_f32_bits(g) & 0x7fffffffu) > 0x7f7fffffu;
    }
    out->sumsq += sum;
    out->nonfinite |= nonfinite;
}

AVX2_ALWAYS_INLINE void run(const void *grad, strata_dtype dt, size_t begin, size_t end, adam_gradstats *out)
{
    for (size_t b = begin; b < end; b += BLOCK)
        block(grad, dt, b, end - b < BLOCK ? end : b + BLOCK, out);
}

void adam_gradstats_avx2(const void *grad, strata_dtype dtype, size_t begin, size_t end, adam_gradstats *out)
{
    switch (dtype) {
    case STRATA_DTYPE_BF16: run(grad, STRATA_DTYPE_BF16, begin, end, out); break;
    case STRATA_DTYPE_FP16: run(grad, STRATA_DTYPE_FP16, begin, end, out); break;
    default: run(grad, STRATA_DTYPE_FP32, begin, end, out); break;
    }
}
