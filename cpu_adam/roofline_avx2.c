/*
 * The same-shape roofline, AVX2: Adam's exact loads and stores with no arithmetic (see
 * roofline_avx512.c for why it exists and how the compiler is kept from dropping the stores).
 */
#include "cpu_adam/adam.h"
#include "cpu_adam/simd_avx2.h"

#define OPAQUE(x) __asm__ volatile("" : "+x"(x))

AVX2_ALWAYS_INLINE void store_f32(float *d, __m256 x, bool streaming)
{
    if (streaming)
        _mm256_stream_ps(d, x);
    else
        _mm256_storeu_ps(d, x);
}

AVX2_ALWAYS_INLINE void run(const adam_arrays *a, size_t begin, size_t end, strata_dtype gd, strata_dtype pd,
                            bool streaming)
{
    size_t i = begin;
    for (; i + 8 <= end; i += 8) {
        __m256 p = _mm256_loadu_ps(a->master + i), m = _mm256_loadu_ps(a->exp_avg + i);
        __m256 v = _mm256_loadu_ps(a->exp_avg_sq + i);
        __m256 g = avx2_load_grad(a->grad, gd, i);
        OPAQUE(p);
        OPAQUE(m);
        OPAQUE(v);
        OPAQUE(g);
        store_f32(a->master + i, p, streaming);
        store_f32(a->exp_avg + i, m, streaming);
        store_f32(a->exp_avg_sq + i, v, streaming);
        if (pd == STRATA_DTYPE_NONE)
            continue;
        if (pd == STRATA_DTYPE_FP32)
            store_f32((float *)a->param + i, p, streaming);
        else if (streaming)
            _mm_stream_si128((__m128i *)((uint16_t *)a->param + i), avx2_to_half(p, pd));
        else
            _mm_storeu_si128((__m128i *)((uint16_t *)a->param + i), avx2_to_half(p, pd));
    }
    if (streaming)
        _mm_sfence();
    if (i < end)
        adam_roofline_ref(a, i, end, false);
}

#define RUN(G, P, s) run(a, begin, end, G, P, s)

void adam_roofline_avx2(const adam_arrays *a, size_t begin, size_t end, bool streaming)
{
    /* Streaming stores need 32-byte aligned addresses; callers that cannot promise them get regular stores. */
    if (streaming && adam_arrays_aligned(a, begin, 32)) {
        ADAM_SPECIALISE(a->grad_dtype, a->param_dtype, RUN, true);
    } else {
        ADAM_SPECIALISE(a->grad_dtype, a->param_dtype, RUN, false);
    }
}
