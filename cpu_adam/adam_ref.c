/*
 * The scalar reference: the specification of strata's Adam and the oracle of every test.
 *
 * Per element, in this order (PyTorch 1.13 torch.optim.AdamW / torch.optim.Adam, foreach or not):
 *
 *   g     = grad * grad_scale                      unscale and clip in one multiply
 *   g     = fma(p, weight_decay, g)                Adam only, when weight_decay != 0 (L2 decay)
 *   m     = fma(g, 1 - beta1, m * beta1)           exp_avg.mul_(beta1).add_(g, alpha=1-beta1)   (torch < 2.0)
 *     or  fma(w, g - m, m), w = 1 - beta1          exp_avg.lerp_(g, w)   (torch >= 2.0, STRATA_ADAM_LERP;
 *         fma(w - 1, g - m, g) when w >= 0.5)      ATen's lerp, vectorised and scalar, fuses this way)
 *   v     = fma(g * (1 - beta2), g, v * beta2)     exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1-beta2)
 *   denom = sqrt(v) / sqrt(1 - beta2^t) + eps      (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
 *   p     = p * decay                              param.mul_(1 - lr * weight_decay)  (AdamW; decay = 1 for Adam)
 *   p     = p + (-step_size * m) / denom           param.addcdiv_(m, denom, value=-step_size),
 *                                                  step_size = lr / (1 - beta1^t)
 *   param = round_to_nearest_even(p)               the low-precision copy (base/half.h)
 *
 * The multiply-adds are fused exactly where PyTorch's CPU kernels fuse them (its vectorised add with
 * alpha and addcmul are FMAs; the decay is a separate mul_), and written out as fma or kept rounded with
 * ADAM_KEEP_ROUNDED, so no compiler can contract them one way here and another way in a SIMD file:
 * every variant is bit-identical to this one, and on this machine to PyTorch 1.13 and 2.x as well
 * (benchmarks/adam_vs_torch.py checks it). sqrt and division are exact IEEE operations in every
 * variant; nothing uses an approximate reciprocal.
 */
#include <math.h>

#include "cpu_adam/adam_scalar.h"

void adam_consts_init(adam_consts *c, const strata_adam_hparams *hp, int64_t step, double grad_scale)
{
    /* PyTorch computes these in Python doubles and rounds each to fp32 when it meets an fp32 tensor. */
    double bc1 = hp->bias_correction ? 1.0 - pow(hp->beta1, (double)step) : 1.0;
    double bc2 = hp->bias_correction ? 1.0 - pow(hp->beta2, (double)step) : 1.0;
    bool adamw = hp->kind == STRATA_OPTIMIZER_ADAMW;

    c->grad_scale = (float)grad_scale;
    c->beta1 = (float)hp->beta1;
    c->one_minus_beta1 = (float)(1.0 - hp->beta1);
    c->beta2 = (float)hp->beta2;
    c->one_minus_beta2 = (float)(1.0 - hp->beta2);
    c->eps = (float)hp->eps;
    c->bc2_sqrt = (float)sqrt(bc2);
    c->neg_step = (float)-(hp->lr / bc1);
    c->decay = adamw ? (float)(1.0 - hp->lr * hp->weight_decay) : 1.0f;
    c->use_l2 = !adamw && hp->weight_decay != 0.0;
    c->l2 = c->use_l2 ? (float)hp->weight_decay : 0.0f;
    /* torch passes 1 - beta1 to lerp_ as a Python double, which its kernel rounds to the fp32 weight. */
    float w = c->one_minus_beta1;
    c->lerp = hp->formula == STRATA_ADAM_LERP;
    c->lerp_from_m = fabsf(w) < 0.5f;
    c->lerp_coeff = c->lerp_from_m ? w : w - 1.0f;
}

void adam_step_ref(const adam_consts *c, const adam_arrays *a, size_t begin, size_t end)
{
    for (size_t i = begin; i < end; i++) {
        adam_update_element(c, adam_load_grad(a->grad, a->grad_dtype, i), &a->master[i], &a->exp_avg[i],
                            &a->exp_avg_sq[i]);
        adam_store_param(a->param, a->param_dtype, i, a->master[i]);
    }
}

void adam_gradstats_ref(const void *grad, strata_dtype dtype, size_t begin, size_t end, adam_gradstats *out)
{
    double sum = 0.0;
    bool bad = false;
    for (size_t i = begin; i < end; i++) {
        float g = adam_load_grad(grad, dtype, i);
        bad |= !isfinite(g);
        sum += (double)(g * g);
    }
    out->sumsq += sum;
    out->nonfinite |= bad;
}

/* The roofline in scalar form (so that STRATA_ISA=ref has one, and for the SIMD files' tails): read master,
 * m, v and the gradient, write the same values back and the parameter copy of master. volatile keeps the
 * compiler from dropping stores of unchanged values; the compare keeps the gradient load. */
void adam_roofline_ref(const adam_arrays *a, size_t begin, size_t end, adam_stores stores)
{
    (void)stores;
    volatile float *pm = a->master, *mm = a->exp_avg, *vm = a->exp_avg_sq;
    for (size_t i = begin; i < end; i++) {
        float p = pm[i], m = mm[i], v = vm[i];
        float g = adam_load_grad(a->grad, a->grad_dtype, i);
        pm[i] = p;
        mm[i] = m;
        vm[i] = v;
        adam_store_param(a->param, a->param_dtype, i, g == g ? p : g);
    }
}
