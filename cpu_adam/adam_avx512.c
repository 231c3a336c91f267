/*
 * Adam, AVX-512: 16 elements per iteration, masked loads and stores for the tail. The same float
 * operations in the same order as adam_step_ref() (see adam_ref.c), so the results are bit-identical.
 */
#include "cpu_adam/adam.h"
#include "cpu_adam/simd_avx512.h"

AVX512_ALWAYS_INLINE void step16(const adam_consts *c, const adam_arrays *a, size_t i, __mmask16 k, bool full,
                                 strata_dtype gd, strata_dtype pd, bool l2, bool hw_bf16, bool stream)
{
    float *pm = a->master + i, *mm = a->exp_avg + i, *vm = a->exp_avg_sq + i;
    __m512 p = full ? _mm512_loadu_ps(pm) : _mm512_maskz_loadu_ps(k, pm);
    __m512 m = full ? _mm512_loadu_ps(mm) : _mm512_maskz_loadu_ps(k, mm);
    __m512 v = full ? _mm512_loadu_ps(vm) : _mm512_maskz_loadu_ps(k, vm);
    __m512 g = _mm512_mul_ps(avx512_load_grad(a->grad, gd, i, k, full), _mm512_set1_ps(c->grad_scale));
    if (l2)
        g = _mm512_fmadd_ps(p, _mm512_set1_ps(c->l2), g);
    if (c->lerp)
        m = _mm512_fmadd_ps(_mm512_set1_ps(c->lerp_coeff), _mm512_sub_ps(g, m), c->lerp_from_m ? m : g);
    else
        m = _mm512_fmadd_ps(g, _mm512_set1_ps(c->one_minus_beta1), _mm512_mul_ps(m, _mm512_set1_ps(c->beta1)));
    v = _mm512_fmadd_ps(_mm512_mul_ps(g, _mm512_set1_ps(c->one_minus_beta2)), g,
                        _mm512_mul_ps(v, _mm512_set1_ps(c->beta2)));
    __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), _mm512_set1_ps(c->bc2_sqrt)),
                                 _mm512_set1_ps(c->eps));
    __m512 upd = _mm512_div_ps(_mm512_mul_ps(_mm512_set1_ps(c->neg_step), m), denom);
    p = _mm512_mul_ps(p, _mm512_set1_ps(c->decay));
    ADAM_KEEP_ROUNDED(p);
    p = _mm512_add_ps(p, upd);
    if (full) {
        _mm512_storeu_ps(pm, p);
        _mm512_storeu_ps(mm, m);
        _mm512_storeu_ps(vm, v);
    } else {
        _mm512_mask_storeu_ps(pm, k, p);
        _mm512_mask_storeu_ps(mm, k, m);
        _mm512_mask_storeu_ps(vm, k, v);
    }
    avx512_store_param(a->param, pd, i, p, k, full, hw_bf16, stream);
}

/* One loop per (gradient dtype, parameter dtype, L2) so that every branch above folds away. */
AVX512_ALWAYS_INLINE void run(const adam_consts *c, const adam_arrays *a, size_t begin, size_t end,
                              strata_dtype gd, strata_dtype pd, bool l2, bool hw_bf16)
{
    bool stream = a->stream_param && adam_arrays_aligned(a, begin, false);
    size_t i = begin;
    for (; i + 16 <= end; i += 16)
        step16(c, a, i, 0xffff, true, gd, pd, l2, hw_bf16, stream);
    if (i < end)
        step16(c, a, i, (__mmask16)((1u << (end - i)) - 1u), false, gd, pd, l2, hw_bf16, false);
    /* Non-temporal stores are weakly ordered: fence them before anyone is told the range is done. */
    if (stream)
        _mm_sfence();
}

#define RUN(G, P, l2, hw) run(c, a, begin, end, G, P, l2, hw)

void adam_step_avx512(const adam_consts *c, const adam_arrays *a, size_t begin, size_t end)
{
    /* The BF16 conversion matters only for bf16 output; CPUs without it take the integer path. */
    bool hw_bf16 = avx512_has_bf16();
    if (c->use_l2 && hw_bf16) {
        ADAM_SPECIALISE(a->grad_dtype, a->param_dtype, RUN, true, true);
    } else if (c->use_l2) {
        ADAM_SPECIALISE(a->grad_dtype, a->param_dtype, RUN, true, false);
    } else if (hw_bf16) {
        ADAM_SPECIALISE(a->grad_dtype, a->param_dtype, RUN, false, true);
    } else {
        ADAM_SPECIALISE(a->grad_dtype, a->param_dtype, RUN, false, false);
    }
}
