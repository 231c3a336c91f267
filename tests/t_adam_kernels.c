/*
 * Proves that every SIMD kernel this CPU runs gives the bits of the scalar reference (adam_step_ref):
 * every gradient x parameter dtype, AdamW and Adam (with and without decay), bias correction on and off, both
 * first-moment formulas (torch < 2.0's mul_add, torch >= 2.0's lerp from m and from the gradient),
 * odd lengths and unaligned starts (so both streaming and regular parameter stores), and six steps with the state carried over and a new gradient (with
 * a few inf/NaN in it) each step. The tolerance is zero: the kernels do the same IEEE operations in the
 * same order, each multiply-add written as one fma (adam_ref.c). Only NaN payloads may differ.
 * Also proves the parameter copy through each kernel's conversion path equals base/half.h on random bit
 * patterns (every exponent, subnormals, NaN, inf), using lr = 0 so that the copy is of master itself.
 */
#include "t_adam_util.h"

static const strata_dtype grad_types[] = {STRATA_DTYPE_FP32, STRATA_DTYPE_BF16, STRATA_DTYPE_FP16};
static const strata_dtype param_types[] = {STRATA_DTYPE_FP32, STRATA_DTYPE_BF16, STRATA_DTYPE_FP16,
                                           STRATA_DTYPE_NONE};

static void run_case(const adam_ops *ops, strata_dtype gd, strata_dtype pd, const strata_adam_hparams *hp,
                     size_t n, size_t begin)
{
    ta_state ref, simd;
    ta_alloc(&ref, n, gd, pd);
    ta_alloc(&simd, n, gd, pd);
    ta_fill_master(&ref);
    char what[160];
    snprintf(what, sizeof what, "%s grad=%s param=%s %s%s wd=%g bias=%d n=%zu begin=%zu", ops->name,
             strata_dtype_name(gd), strata_dtype_name(pd), hp->kind == STRATA_OPTIMIZER_ADAMW ? "adamw" : "adam",
             hp->formula == STRATA_ADAM_LERP ? " lerp" : "", hp->weight_decay, hp->bias_correction, n, begin);
    for (int step = 1; step <= 6; step++) {
        ta_fill_grad(&ref, 500, true);
        ta_copy(&simd, &ref);
        adam_consts c;
        adam_consts_init(&c, hp, step, step == 3 ? 1.0 / 1024.0 : 0.75);
        adam_arrays ar = {ref.master, ref.m, ref.v, ref.grad, ref.param, gd, pd, false};
        /* Streaming parameter stores where the start is aligned (begin 0 and multiples of 32), regular
         * stores elsewhere: both paths must give the same bits. */
        adam_arrays as = {simd.master, simd.m, simd.v, simd.grad, simd.param, gd, pd, true};
        adam_step_ref(&c, &ar, begin, n);
        ops->step(&c, &as, begin, n);
        char label[200];
        snprintf(label, sizeof label, "%s step=%d", what, step);
        if (ta_compare(&simd, &ref, label))
            break;
    }
    ta_free(&ref);
    ta_free(&simd);
}

static void conversion_paths(const adam_ops *ops)
{
    size_t n = 100003;
    strata_adam_hparams hp = {STRATA_OPTIMIZER_ADAMW, 0.0, 0.9, 0.999, 1e-8, 0.0, true, STRATA_ADAM_MUL_ADD};
    adam_consts c;
    adam_consts_init(&c, &hp, 1, 1.0);
    for (size_t k = 0; k < 3; k++) {
        ta_state s;
        ta_alloc(&s, n, STRATA_DTYPE_BF16, param_types[k]);
        for (size_t i = 0; i < n; i++)
            s.master[i] = cvt_bits_f32((uint32_t)t_rand_u64() >> (i % 3 == 0 ? 8 : 0)); /* many subnormals */
        adam_arrays a = {s.master, s.m, s.v, s.grad, s.param, s.gd, s.pd, true};
        ops->step(&c, &a, 0, n);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) {
            float want = s.master[i];
            uint32_t got_bits = s.pd == STRATA_DTYPE_FP32 ? cvt_f32_bits(((float *)s.param)[i]) : ((uint16_t *)s.param)[i];
            uint32_t want_bits = s.pd == STRATA_DTYPE_FP32   ? cvt_f32_bits(want)
                                 : s.pd == STRATA_DTYPE_BF16 ? cvt_f32_to_bf16(want)
                                                             : cvt_f32_to_fp16(want);
            if (isnan(want) ? !isnan(ta_param_at(&s, i)) : got_bits != want_bits) {
                if (bad++ < 5)
                    t_fail(__FILE__, __LINE__, "%s copy to %s of 0x%08x: got 0x%x, base/half.h 0x%x", ops->name,
                           strata_dtype_name(s.pd), cvt_f32_bits(want), got_bits, want_bits);
            }
        }
        t_checks++;
        ta_free(&s);
    }
}

int main(void)
{
    t_rng_seed();
    int tested = 0;
    for (int isa = ADAM_ISA_AVX2; isa < ADAM_ISA_COUNT; isa++) {
        const adam_ops *ops;
        if (adam_ops_for((adam_isa)isa, &ops) != STRATA_OK) {
            printf("not tested here: %s\n", strata_last_error(NULL));
            continue;
        }
        tested++;
        conversion_paths(ops);
        const strata_adam_hparams hps[] = {
            {STRATA_OPTIMIZER_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.01, true, STRATA_ADAM_MUL_ADD},
            {STRATA_OPTIMIZER_ADAM, 3e-4, 0.8, 0.95, 1e-6, 0.1, true, STRATA_ADAM_MUL_ADD},
            {STRATA_OPTIMIZER_ADAM, 1e-2, 0.9, 0.999, 1e-8, 0.0, false, STRATA_ADAM_MUL_ADD},
            {STRATA_OPTIMIZER_ADAMW, 5e-2, 0.0, 0.5, 0.0, 0.0, false, STRATA_ADAM_MUL_ADD},
            /* torch >= 2.0's first moment, from m (small lerp weight) and from the gradient (large). */
            {STRATA_OPTIMIZER_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.01, true, STRATA_ADAM_LERP},
            {STRATA_OPTIMIZER_ADAM, 3e-4, 0.3, 0.95, 1e-6, 0.1, true, STRATA_ADAM_LERP},
        };
        for (size_t h = 0; h < sizeof hps / sizeof hps[0]; h++)
            for (size_t g = 0; g < 3; g++)
                for (size_t p = 0; p < 4; p++) {
                    size_t n = t_rand_range(1, 3) == 1 ? t_rand_range(1, 40) : t_rand_range(1000, 9000);
                    size_t begin = t_rand_range(0, 3) == 0 ? 0 : t_rand_range(1, 40);
                    run_case(ops, grad_types[g], param_types[p], &hps[h], n, begin < n ? begin : 0);
                }
    }
    if (!tested)
        t_skip("this CPU runs neither the AVX2 nor the AVX-512 kernel: %s", strata_last_error(NULL));
    return t_done();
}
