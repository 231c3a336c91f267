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

AVX512_ALWAYS_INLINE void store_f32(float *d, __m512 x, bool stream)
{
    if (stream)
        _mm512_stream_ps(d, x);
    else
        _mm512_storeu_ps(d, x);
}

/* nt_state: master, m and v stored non-temporally; nt_copy: the parameter copy. */
AVX512_ALWAYS_INLINE void run(const adam_arrays *a, size_t begin, size_t end, strata_dtype gd, strata_dtype pd,
                              bool nt_state, bool nt_copy, bool hw_bf16)
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
        store_f32(a->master + i, p, nt_state);
        store_f32(a->exp_avg + i, m, nt_state);
        store_f32(a->exp_avg_sq + i, v, nt_state);
        avx512_store_param(a->param, pd, i, p, 0xffff, true, hw_bf16, nt_copy);
    }
    if (nt_state || nt_copy)
        _mm_sfence();
    /* The tail (under 16 elements) costs nothing measurable; the reference does it. */
    if (i < end)
        adam_roofline_ref(a, i, end, ADAM_STORES_REGULAR);
}

#define RUN(G, P, nt_state, nt_copy, hw) run(a, begin, end, G, P, nt_state, nt_copy, hw)

void adam_roofline_avx512(const adam_arrays *a, size_t begin, size_t end, adam_stores stores)
{
    bool hw = avx512_has_bf16();
    /* Streaming stores need aligned addresses; where they are not, regular stores are used instead. */
    bool nt_state = stores == ADAM_STORES_STREAMING && adam_arrays_aligned(a, begin, true);
    bool nt_copy = stores != ADAM_STORES_REGULAR && adam_arrays_aligned(a, begin, false);
    if (nt_state) {
        ADAM_SPECIALISE(a->grad_dtype, a->param_dtype, RUN, true, true, hw);
    } else {
        ADAM_SPECIALISE(a->grad_dtype, a->param_dtype, RUN, false, nt_copy, hw);
    }
}
