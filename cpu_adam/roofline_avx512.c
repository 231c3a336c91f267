/*
 * The same-shape roofline, AVX-512: Adam's exact loads and stores (read master, m, v and the gradient;
 * write master, m, v and the parameter copy) with no arithmetic, so `strata bench adam` can say how
 * close Adam comes to the memory's speed for the same bytes. The values written back are the values
 * read (an empty asm hides that from the compiler, which would otherwise drop the stores), and the
 * parameter copy is master narrowed by the same single conversion instruction Adam uses.
 */
#include "cpu_adam/adam.h"
#include "cpu_adam/simd_avx512.h"

#define OPAQUE(x) __asm__ volatile("" : "+v"(x))

AVX512_ALWAYS_INLINE void store_f32(float *d, __m512 x, bool streaming)
{
    if (streaming)
        _mm512_stream_ps(d, x);
    else
        _mm512_storeu_ps(d, x);
}

AVX512_ALWAYS_INLINE void run(const adam_arrays *a, size_t begin, size_t end, strata_dtype gd, strata_dtype pd,
                              bool streaming, bool hw_bf16)
{
    size_t i = begin;
    for (; i + 16 <= end; i += 16) {
        __m512 p = _mm512_loadu_ps(a->master + i), m = _mm512_loadu_ps(a->exp_avg + i);
        __m512 v = _mm512_loadu_ps(a->exp_avg_sq + i);
        __m512 g = avx512_load_grad(a->grad, gd, i, 0xffff, true);
        OPAQUE(p);
        OPAQUE(m);
        OPAQUE(v);
        OPAQUE(g);
        store_f32(a->master + i, p, streaming);
        store_f32(a->exp_avg + i, m, streaming);
        store_f32(a->exp_avg_sq + i, v, streaming);
        if (streaming && pd != STRATA_DTYPE_NONE) {
            __m256i h = pd == STRATA_DTYPE_FP32 ? _mm256_setzero_si256()
                        : pd == STRATA_DTYPE_FP16 ? _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                                                  : avx512_to_bf16(p, hw_bf16);
            if (pd == STRATA_DTYPE_FP32)
                _mm512_stream_ps((float *)a->param + i, p);
            else
                _mm256_stream_si256((__m256i *)((uint16_t *)a->param + i), h);
        } else {
            avx512_store_param(a->param, pd, i, p, 0xffff, true, hw_bf16);
        }
    }
    if (streaming)
        _mm_sfence();
    /* The tail (under 16 elements) costs nothing measurable; the reference does it. */
    if (i < end)
        adam_roofline_ref(a, i, end, false);
}

#define RUN(G, P, s, hw) run(a, begin, end, G, P, s, hw)

void adam_roofline_avx512(const adam_arrays *a, size_t begin, size_t end, bool streaming)
{
    bool hw_bf16 = avx512_has_bf16();
    /* Streaming stores need 64-byte aligned addresses; callers that cannot promise them get regular stores. */
    if (streaming && adam_arrays_aligned(a, begin, 64) && hw_bf16) {
        ADAM_SPECIALISE(a->grad_dtype, a->param_dtype, RUN, true, true);
    } else if (streaming && adam_arrays_aligned(a, begin, 64)) {
        ADAM_SPECIALISE(a->grad_dtype, a->param_dtype, RUN, true, false);
    } else if (hw_bf16) {
        ADAM_SPECIALISE(a->grad_dtype, a->param_dtype, RUN, false, true);
    } else {
        ADAM_SPECIALISE(a->grad_dtype, a->param_dtype, RUN, false, false);
    }
}
