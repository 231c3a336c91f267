/*
 * The gradient pre-pass, AVX-512: sum of squares in fp32 lanes, moved to a double every block so that
 * the total stays accurate over a billion elements, and an inf/NaN flag from the exponent bits.
 */
#include "cpu_adam/adam.h"
#include "cpu_adam/simd_avx512.h"

/* Elements summed in fp32 before the partial sum goes to the double total. */
#define BLOCK 4096

AVX512_ALWAYS_INLINE void block(const void *grad, strata_dtype dt, size_t begin, size_t end, adam_gradstats *out)
{
    /* Four accumulators so that the FMA latency chain never limits the read speed. */
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps(),
           acc3 = _mm512_setzero_ps();
    __mmask16 bad = 0;
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), max_finite = _mm512_set1_epi32(0x7f7fffff);
#define ACC(acc, g)                                                                                        \
    do {                                                                                                   \
        acc = _mm512_fmadd_ps(g, g, acc);                                                                  \
        bad |= _mm512_cmpgt_epu32_mask(_mm512_and_si512(_mm512_castps_si512(g), abs_mask), max_finite);    \
    } while (0)
    size_t i = begin;
    for (; i + 64 <= end; i += 64) {
        __m512 g0 = avx512_load_grad(grad, dt, i, 0xffff, true);
        __m512 g1 = avx512_load_grad(grad, dt, i + 16, 0xffff, true);
        __m512 g2 = avx512_load_grad(grad, dt, i + 32, 0xffff, true);
        __m512 g3 = avx512_load_grad(grad, dt, i + 48, 0xffff, true);
        ACC(acc0, g0);
        ACC(acc1, g1);
        ACC(acc2, g2);
        ACC(acc3, g3);
    }
    for (; i < end; i += 16) {
        __mmask16 k = end - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (end - i)) - 1u);
        __m512 g = avx512_load_grad(grad, dt, i, k, false);
        ACC(acc0, g);
    }
#undef ACC
    __m512 acc = _mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3));
    out->sumsq += _mm512_reduce_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(acc))) +
                  _mm512_reduce_add_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(acc, 1)));
    out->nonfinite |= bad != 0;
}

AVX512_ALWAYS_INLINE void run(const void *grad, strata_dtype dt, size_t begin, size_t end, adam_gradstats *out)
{
    for (size_t b = begin; b < end; b += BLOCK)
        block(grad, dt, b, end - b < BLOCK ? end : b + BLOCK, out);
}

void adam_gradstats_avx512(const void *grad, strata_dtype dtype, size_t begin, size_t end, adam_gradstats *out)
{
    switch (dtype) {
    case STRATA_DTYPE_BF16: run(grad, STRATA_DTYPE_BF16, begin, end, out); break;
    case STRATA_DTYPE_FP16: run(grad, STRATA_DTYPE_FP16, begin, end, out); break;
    default: run(grad, STRATA_DTYPE_FP32, begin, end, out); break;
    }
}
