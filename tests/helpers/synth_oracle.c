/* The synthetic model's scalar oracle: see synth_oracle.h. */
#include "synth_oracle.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_adam/adam_moments.h"
#include "cpu_adam/adam_scalar.h"
#include "engine/plan/plan.h"
#include "engine/step/step.h"
#include "testlib.h"

static const synth_groups one_group;

/* The groups of o: one group when it names none. */
static const synth_groups *G(const synth_opts *o)
{
    return o->groups ? o->groups : &one_group;
}

synth_groups synth_three_groups(int layers)
{
    synth_groups g = {.n = 2};
    g.hp[0] = (strata_group_hparams){.lr = 3e-3, .weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
    g.hp[1] = (strata_group_hparams){.lr = 2e-2, .weight_decay = 0, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6};
    for (int l = 0; l < layers; l++) {
        g.of_param[2 * l] = l == layers - 1 ? 0 : 1;
        g.of_param[2 * l + 1] = 2;
    }
    return g;
}

typedef struct flat flat;
static void place_module(const synth_opts *o, int l, flat *f);

struct flat {
    size_t n, at[2 * SYNTH_MAX_LAYERS], numel[2 * SYNTH_MAX_LAYERS];
    int order[2 * SYNTH_MAX_LAYERS], ntrained; /* the trained parameters in layout order */
    size_t trained_n;                          /* where the frozen modules start */
    float *master, *grad, *scale_m, *scale_v;
    uint8_t *m, *v; /* in the form: 4, 2 or 1 bytes an element */
};

static void place_module(const synth_opts *o, int l, flat *f)
{
    size_t sizes[2] = {(size_t)o->width[l + 1] * o->width[l], (size_t)o->width[l + 1]}, offs[2];
    uint32_t groups[2] = {(uint32_t)G(o)->of_param[2 * l], (uint32_t)G(o)->of_param[2 * l + 1]};
    size_t numel = plan_module_layout(sizes, groups, 2, offs, NULL);
    for (int j = 0; j < 2; j++) {
        f->at[2 * l + j] = f->n + offs[j];
        f->numel[2 * l + j] = sizes[j];
    }
    f->n += numel;
}

/* The engine's layout: module l = layer l's weight then bias, padded where their groups differ; the trained
 * modules first, the frozen ones after them. */
static void layout(const synth_opts *o, flat *f)
{
    f->n = 0;
    f->ntrained = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            f->trained_n = f->n;
        for (int l = 0; l < o->layers; l++) {
            if ((o->frozen_layers >> l & 1) != (uint32_t)pass)
                continue;
            if (pass == 0) {
                f->order[f->ntrained++] = 2 * l;
                f->order[f->ntrained++] = 2 * l + 1;
            }
            place_module(o, l, f);
        }
    }
}


static void flat_init(const synth_opts *o, strata_moments form, flat *f)
{
    layout(o, f);
    size_t eb = form == STRATA_MOMENTS_FP32 ? 4 : form == STRATA_MOMENTS_BF16 ? 2 : 1;
    f->master = calloc(f->n, 4);
    f->grad = calloc(f->n, 4);
    f->m = calloc(f->n, eb);
    f->v = calloc(f->n, eb);
    f->scale_m = calloc(f->n / MOMENTS_Q8_BLOCK + 1, 4);
    f->scale_v = calloc(f->n / MOMENTS_Q8_BLOCK + 1, 4);
    if (form == STRATA_MOMENTS_8BIT) {
        memset(f->m, moments_q8_signed()->zero, f->n);
        memset(f->v, moments_q8_unsigned()->zero, f->n);
    }
    for (int p = 0; p < 2 * o->layers; p++)
        for (size_t i = 0; i < f->numel[p]; i++)
            f->master[f->at[p] + i] = synth_init_value(o->seed, p, i);
}

/* The group constants of step s (from 0; the update's count s + 1): group 0 the config's, the others as given, each
 * lr on the schedule. */
static void group_consts(const synth_opts *o, const strata_config *c, int s, adam_consts *k)
{
    strata_adam_hparams base;
    T_OK(strata_config_adam_hparams(c, &base));
    double decay = o->lr_decay > 0 ? pow(o->lr_decay, s) : 1;
    for (int g = 0; g <= G(o)->n; g++) {
        strata_adam_hparams hp = base;
        hp.lr = (g == 0 ? (double)c->lr : G(o)->hp[g - 1].lr) * decay;
        if (g > 0) {
            const strata_group_hparams *gh = &G(o)->hp[g - 1];
            hp.weight_decay = gh->weight_decay;
            hp.beta1 = gh->beta1;
            hp.beta2 = gh->beta2;
            hp.eps = gh->eps;
        }
        adam_consts_init(&k[g], &hp, s + 1, 1.0);
    }
}

/* One kernel call per run of one group: [start of parameter p, start of the next parameter of another group). The
 * split does not change a bit (elementwise; bf16's rounding drawn by element index; 8-bit blocks inside a run). */
static void step_oracle(const synth_opts *o, const strata_config *c, strata_moments form, flat *f, int s)
{
    adam_consts k[SYNTH_MAX_GROUPS + 1];
    group_consts(o, c, s, k);
    int np = f->ntrained;
    for (int i = 0; i < np;) {
        int g = G(o)->of_param[f->order[i]], j = i + 1;
        while (j < np && G(o)->of_param[f->order[j]] == g)
            j++;
        size_t first = i == 0 ? 0 : f->at[f->order[i]], end = j < np ? f->at[f->order[j]] : f->trained_n;
        adam_arrays a = {.master = f->master, .grad = f->grad, .grad_dtype = STRATA_DTYPE_FP32,
                         .param_dtype = STRATA_DTYPE_NONE, .exp_avg = (float *)f->m, .exp_avg_sq = (float *)f->v};
        if (form == STRATA_MOMENTS_FP32) {
            adam_step_ref(&k[g], &a, first, end);
        } else if (form == STRATA_MOMENTS_BF16) {
            adam_bf16_moments mo = {(uint16_t *)f->m, (uint16_t *)f->v,
                                    step_moments_key(c->optimizer_moments_seed, 0, s + 1), 0};
            adam_step_bf16_ref(&k[g], &a, &mo, first, end);
        } else {
            adam_q8_moments mo = {f->m, f->v, f->scale_m, f->scale_v};
            adam_step_q8_ref(&k[g], &a, &mo, first, end);
        }
        i = j;
    }
}

typedef struct layer_scratch {
    float *act[SYNTH_MAX_LAYERS + 1], *target, *d0, *d1, *tw, *tb;
} layer_scratch;

/* Step s's gradients, summed over its micro-batches in fp32 as the engine's store sums them, into f->grad. */
static void gradients(const synth_opts *o, flat *f, layer_scratch *x, int s)
{
    int L = o->layers;
    for (int mb = 0; mb < o->micro_batches; mb++) {
        synth_batch(o, s, mb, x->act[0], x->target);
        for (int l = 0; l < L; l++)
            synth_layer_forward(o, l, f->master + f->at[2 * l], f->master + f->at[2 * l + 1], x->act[l],
                                x->act[l + 1]);
        float *dc = x->d0, *dn = x->d1;
        synth_loss_grad(o, x->act[L], x->target, 1.0f, dc);
        for (int l = L - 1; l >= 0; l--) {
            synth_layer_backward(o, l, f->master + f->at[2 * l], x->act[l], x->act[l + 1], dc, dn, x->tw, x->tb);
            const float *part[2] = {x->tw, x->tb};
            for (int j = 0; j < 2; j++) {
                float *g = f->grad + f->at[2 * l + j];
                for (size_t i = 0; i < f->numel[2 * l + j]; i++)
                    g[i] = mb == 0 ? part[j][i] : g[i] + part[j][i];
            }
            float *t = dc;
            dc = dn;
            dn = t;
        }
    }
}

float *synth_oracle(const synth_opts *o, const strata_config *c, strata_moments form, size_t *n_out)
{
    int L = o->layers, B = o->batch;
    flat f;
    flat_init(o, form, &f);
    size_t maxw = 0;
    for (int l = 0; l <= L; l++)
        maxw = (size_t)o->width[l] > maxw ? (size_t)o->width[l] : maxw;
    layer_scratch x = {.target = calloc((size_t)B * o->width[L], 4), .d0 = calloc((size_t)B * maxw, 4),
                       .d1 = calloc((size_t)B * maxw, 4), .tw = calloc(maxw * maxw, 4), .tb = calloc(maxw, 4)};
    for (int l = 0; l <= L; l++)
        x.act[l] = calloc((size_t)B * o->width[l], 4);
    for (int s = 0; s < o->steps; s++) {
        gradients(o, &f, &x, s);
        step_oracle(o, c, form, &f, s);
    }
    size_t total = 0;
    for (int p = 0; p < 2 * L; p++)
        total += f.numel[p];
    float *out = malloc(total * 4);
    for (int p = 0, pos = 0; p < 2 * L; pos += (int)f.numel[p], p++)
        memcpy(out + pos, f.master + f.at[p], f.numel[p] * 4);
    for (int l = 0; l <= L; l++)
        free(x.act[l]);
    void *bufs[] = {f.master, f.grad, f.m, f.v, f.scale_m, f.scale_v, x.target, x.d0, x.d1, x.tw, x.tb};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    *n_out = total;
    return out;
}

