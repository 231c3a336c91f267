/*
 * Adam, AVX2 + FMA + F16C: 8 elements per iteration. The same float operations in the same order as
 * adam_step_ref() (see adam_ref.c), so the results are bit-identical. The tail (under 8 elements) is
 * copied into zero-padded local arrays, run through the same vector code and copied back, so that it
 * too is computed by exactly the same instructions.
 */
#include <string.h>

#include "cpu_adam/adam.h"
#include "cpu_adam/simd_avx2.h"

AVX2_ALWAYS_INLINE void step8(const adam_consts *c, const adam_arrays *a, size_t i, strata_dtype gd, strata_dtype pd,
                              bool l2, bool stream)
{
    float *pm = a->master + i, *mm = a->exp_avg + i, *vm = a->exp_avg_sq + i;
    __m256 p = _mm256_loadu_ps(pm), m = _mm256_loadu_ps(mm), v = _mm256_loadu_ps(vm);
    avx2_adam_update(c, avx2_load_grad(a->grad, gd, i), &p, &m, &v, l2);
    _mm256_storeu_ps(pm, p);
    _mm256_storeu_ps(mm, m);
    _mm256_storeu_ps(vm, v);
    avx2_store_param(a->param, pd, i, p, stream);
}

AVX2_ALWAYS_INLINE void run(const adam_consts *c, const adam_arrays *a, size_t begin, size_t end, strata_dtype gd,
                            strata_dtype pd, bool l2)
{
    bool stream = a->stream_param && adam_arrays_aligned(a, begin, false);
    size_t i = begin;
    for (; i + 8 <= end; i += 8)
        step8(c, a, i, gd, pd, l2, stream);
    /* Non-temporal stores are weakly ordered: fence them before anyone is told the range is done. */
    if (stream)
        _mm_sfence();
    if (i == end)
        return;
    size_t n = end - i;
    float m[8] = {0}, v[8] = {0};
    memcpy(m, a->exp_avg + i, n * 4);
    memcpy(v, a->exp_avg_sq + i, n * 4);
    avx2_tail t;
    avx2_tail_load(&t, a, i, n);
    t.a.exp_avg = m;
    t.a.exp_avg_sq = v;
    step8(c, &t.a, 0, gd, pd, l2, false);
    avx2_tail_store(&t, a, i, n);
    memcpy(a->exp_avg + i, m, n * 4);
    memcpy(a->exp_avg_sq + i, v, n * 4);
}

#define RUN(G, P, l2) run(c, a, begin, end, G, P, l2)

void adam_step_avx2(const adam_consts *c, const adam_arrays *a, size_t begin, size_t end)
{
    if (c->use_l2) {
        ADAM_SPECIALISE(a->grad_dtype, a->param_dtype, RUN, true);
    } else {
        ADAM_SPECIALISE(a->grad_dtype, a->param_dtype, RUN, false);
    }
}
