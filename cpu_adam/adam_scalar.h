/*
 * The scalar Adam element in one place, shared by the references of every moment storage (adam_ref.c for
 * fp32 moments, adam_moments_ref.c for compressed ones): the gradient read, the update formula of
 * adam_ref.c's header, and the parameter copy. Only the scalar files include it.
 */
#ifndef STRATA_CPU_ADAM_ADAM_SCALAR_H
#define STRATA_CPU_ADAM_ADAM_SCALAR_H

#include <math.h>

#include "cpu_adam/adam.h"
#include "base/half.h"

static inline float adam_load_grad(const void *grad, strata_dtype dtype, size_t i)
{
    switch (dtype) {
    case STRATA_DTYPE_BF16: return cvt_bf16_to_f32(((const uint16_t *)grad)[i]);
    case STRATA_DTYPE_FP16: return cvt_fp16_to_f32(((const uint16_t *)grad)[i]);
    default: return ((const float *)grad)[i];
    }
}

static inline void adam_store_param(void *param, strata_dtype dtype, size_t i, float p)
{
    switch (dtype) {
    case STRATA_DTYPE_FP32: ((float *)param)[i] = p; break;
    case STRATA_DTYPE_BF16: ((uint16_t *)param)[i] = cvt_f32_to_bf16(p); break;
    case STRATA_DTYPE_FP16: ((uint16_t *)param)[i] = cvt_f32_to_fp16(p); break;
    default: break;
    }
}

/* One element's update (the formula in adam_ref.c): g is the stored gradient, widened; *p, *m, *v are
 * the master weight and the two moments in fp32, read and updated in place. */
static inline void adam_update_element(const adam_consts *c, float g, float *p, float *m, float *v)
{
    float pv = *p;
    g = g * c->grad_scale;
    if (c->use_l2)
        g = fmaf(pv, c->l2, g);
    float mv = c->lerp ? fmaf(c->lerp_coeff, g - *m, c->lerp_from_m ? *m : g)
                       : fmaf(g, c->one_minus_beta1, *m * c->beta1);
    float vv = fmaf(g * c->one_minus_beta2, g, *v * c->beta2);
    float denom = sqrtf(vv) / c->bc2_sqrt + c->eps;
    pv = pv * c->decay;
    ADAM_KEEP_ROUNDED(pv);
    *p = pv + (c->neg_step * mv) / denom;
    *m = mv;
    *v = vv;
}

#endif
