/*
 * The same-shape roofline, AVX2: Adam's exact loads and stores with no arithmetic (see
 * roofline_avx512.c for why it exists and how the compiler is kept from dropping the stores).
 */
#include "cpu_adam/adam.h"
#include "cpu_adam/simd_avx2.h"

#define OPAQUE(x) __asm__ volatile("" : "+x"(x))

AVX2_ALWAYS_INLINE void store_f32(float *d, __m256 x, bool stream)
{
    if (stream)
        _mm256_stream_ps(d, x);
    else
        _mm256_storeu_ps(d, x);
}

/* nt_state: master, m and v stored non-temporally; nt_copy: the parameter copy. */
AVX2_ALWAYS_INLINE void run(const adam_arrays *a, size_t begin, size_t end, strata_dtype gd, strata_dtype pd,
                            bool nt_state, bool nt_copy)
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
        store_f32(a->master + i, p, nt_state);
        store_f32(a->exp_avg + i, m, nt_state);
        store_f32(a->exp_avg_sq + i, v, nt_state);
        avx2_store_param(a->param, pd, i, p, nt_copy);
    }
    if (nt_state || nt_copy)
        _mm_sfence();
    if (i < end)
        adam_roofline_ref(a, i, end, ADAM_STORES_REGULAR);
}

#define RUN(G, P, nt_state, nt_copy) run(a, begin, end, G, P, nt_state, nt_copy)

void adam_roofline_avx2(const adam_arrays *a, size_t begin, size_t end, adam_stores stores)
{
    /* Streaming stores need aligned addresses; where they are not, regular stores are used instead. */
    bool nt_state = stores == ADAM_STORES_STREAMING && adam_arrays_aligned(a, begin, true);
    bool nt_copy = stores != ADAM_STORES_REGULAR && adam_arrays_aligned(a, begin, false);
    if (nt_state) {
        ADAM_SPECIALISE(a->grad_dtype, a->param_dtype, RUN, true, true);
    } else {
        ADAM_SPECIALISE(a->grad_dtype, a->param_dtype, RUN, false, nt_copy);
    }
}
