/*
 * The GPT model's backward against finite differences of its forward, on a tiny config with perturbed
 * weights (so LayerNorm weights and biases are not at their trivial initial values). For every parameter
 * tensor a random direction v is drawn and the analytic directional derivative g.v is compared with the
 * fourth-order central difference (8(L(+h) - L(-h)) - (L(+2h) - L(-2h))) / 12h along v, computed in double
 * from the fp32 forward.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/gpt.h"
#include "synth.h"
#include "testlib.h"

static double loss_at(gpt_net *net, gpt_flat *f, const int32_t *tok, const int32_t *tgt)
{
    gpt_source src = gpt_flat_source(f);
    double loss = 0;
    T_OK(gpt_net_step(net, &src, tok, tgt, false, 1.0f, &loss));
    return loss;
}

int main(void)
{
    gpt_dims d = {.layers = 2, .heads = 2, .hidden = 16, .vocab = 256, .seq = 8};
    int B = 2, T = 8, N = B * T;
    gpt_flat *f = NULL;
    T_OK(gpt_flat_create(&d, t_rand_u64(), &f));
    size_t n = gpt_numel(&d);
    for (size_t i = 0; i < n; i++)
        f->params[i] += 0.05f * t_rand_normal();
    size_t bytes = gpt_activation_bytes(&d, B, T, GPT_ACT_KEEP, GPT_ACTS_FP32);
    void *mem = malloc(bytes);
    gpt_net *net = NULL;
    T_OK(gpt_net_create(&d, B, T, GPT_ACT_KEEP, NULL, gpt_ops_host(), mem, bytes, &net));
    int32_t tok[16], tgt[16];
    synth_rand_tokens(tok, tgt, N);
    gpt_source src = gpt_flat_source(f);
    double loss = 0;
    T_OK(gpt_net_step(net, &src, tok, tgt, true, 1.0f, &loss));
    T_CHECK(fabs(loss - log(256.0)) < 1.0, "initial loss %.4f should be near ln(256) = %.4f", loss, log(256.0));

    /* The forward-only pass must give the same loss as the one with backward. */
    double again = loss_at(net, f, tok, tgt);
    T_CHECK(again == loss, "forward-only loss %.9f != loss with backward %.9f", again, loss);

    float *v = malloc(n * sizeof(float)), *save = malloc(n * sizeof(float));
    memcpy(save, f->params, n * sizeof(float));
    double worst = 0;
    const double h = 2e-3;
    for (int m = 0; m < gpt_modules(&d); m++) {
        size_t sizes[GPT_MAX_MODULE_PARAMS], pos = f->module_offset[m];
        int np = gpt_module_param_sizes(&d, m, sizes);
        for (int k = 0; k < np; k++) {
            double gv = 0, vv = 0;
            for (size_t i = 0; i < sizes[k]; i++) {
                v[i] = t_rand_normal();
                gv += (double)f->grads[pos + i] * v[i];
                vv += (double)v[i] * v[i];
            }
            /* Scale the step to the tensor: every element moves by about h / sqrt(elements) ... h. */
            double step = h / sqrt(vv / (double)sizes[k]);
            /* Fourth-order central difference: the O(h^2) truncation term of the plain central
             * difference reached 1e-2 for attention projections (all elements move at once), while a
             * smaller h would drown the difference in fp32 rounding. This stencil cancels that term. */
            double l[4];
            const double at[4] = {1, -1, 2, -2};
            for (int s = 0; s < 4; s++) {
                for (size_t i = 0; i < sizes[k]; i++)
                    f->params[pos + i] = (float)(save[pos + i] + at[s] * step * v[i]);
                l[s] = loss_at(net, f, tok, tgt);
            }
            memcpy(f->params + pos, save + pos, sizes[k] * sizeof(float));
            double fd = (8 * (l[0] - l[1]) - (l[2] - l[3])) / (12 * step);
            /* Relative error with an absolute floor: a random direction can nearly cancel a tensor's
             * gradient (|g.v| ~ 1e-4), and there the difference of two fp32 forwards is only good to
             * about 1e-5 (worst seen over 180 tensors: 7.5e-6). err < 1e-2 thus means
             * |fd - g.v| < 1e-2 |g.v| + 2e-5. */
            double err = fabs(fd - gv) / fmax(fabs(gv), 2e-3);
            worst = fmax(worst, err);
            printf("  %-10s %-18s analytic %+.6e  finite-diff %+.6e  rel.err %.2e\n", m == 0 ? "embed"
                   : m == d.layers + 1 ? "ln_f" : "block", gpt_param_name(&d, m, k), gv, fd, err);
            T_CHECK(err < 1e-2, "module %d %s: analytic %.6e vs finite difference %.6e (rel. error %.3e)", m,
                    gpt_param_name(&d, m, k), gv, fd, err);
            pos += sizes[k];
        }
    }
    printf("worst relative error %.3e\n", worst);
    free(v);
    free(save);
    gpt_net_destroy(net);
    free(mem);
    gpt_flat_destroy(f);
    return t_done();
}
