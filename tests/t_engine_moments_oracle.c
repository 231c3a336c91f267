/*
 * Compressed Adam moments in the engine against a scalar oracle: the synthetic model trained by the engine (every
 * placement it runs, fp32 parameters) must end with the master weights of plain arrays trained with the same layer
 * math and the reference kernels (adam_step_bf16_ref / adam_step_q8_ref) over the engine's flat partition: modules
 * padded to PLAN_MODULE_ALIGN, parameters on PLAN_PARAM_ALIGN, sub-groups of sub_group_size elements, each one
 * kernel call with the rounding key step_moments_key gives it, drawn by element index (bf16) and the block scales from its first element
 * (8-bit). Bit for bit: the SIMD kernels, their tiles and threads, the tiers and slots must not change a bit.
 */
#include <string.h>

#include "cpu_adam/adam_moments.h"
#include "engine/plan/plan.h"
#include "engine/step/step.h"
#include "synth.h"
#include "testlib.h"

typedef struct flat {
    size_t n, w_at[SYNTH_MAX_LAYERS], b_at[SYNTH_MAX_LAYERS];
    float *master, *grad, *scale_m, *scale_v;
    uint8_t *m, *v; /* in the form: 2 or 1 bytes an element */
} flat;

/* The engine's layout: module l = layer l's weight then bias. */
static void layout(const synth_opts *o, flat *f)
{
    f->n = 0;
    for (int l = 0; l < o->layers; l++) {
        size_t sizes[2] = {(size_t)o->width[l + 1] * o->width[l], (size_t)o->width[l + 1]}, offs[2];
        size_t numel = plan_module_layout(sizes, NULL, 2, offs, NULL);
        f->w_at[l] = f->n + offs[0];
        f->b_at[l] = f->n + offs[1];
        f->n += numel;
    }
}

static void step_oracle(const strata_config *c, strata_moments form, flat *f, int64_t step)
{
    strata_adam_hparams hp;
    T_OK(strata_config_adam_hparams(c, &hp));
    adam_consts k;
    adam_consts_init(&k, &hp, step, 1.0);
    size_t sg = c->sub_group_size;
    for (size_t first = 0; first < f->n; first += sg) {
        size_t n = f->n - first < sg ? f->n - first : sg;
        adam_arrays a = {.master = f->master + first, .grad = f->grad + first, .grad_dtype = STRATA_DTYPE_FP32,
                         .param_dtype = STRATA_DTYPE_NONE};
        if (form == STRATA_MOMENTS_BF16) {
            adam_bf16_moments mo = {(uint16_t *)f->m + first, (uint16_t *)f->v + first,
                                    step_moments_key(c->optimizer_moments_seed, 0, step), first};
            adam_step_bf16_ref(&k, &a, &mo, 0, n);
        } else {
            adam_q8_moments mo = {f->m + first, f->v + first, f->scale_m + first / MOMENTS_Q8_BLOCK,
                                  f->scale_v + first / MOMENTS_Q8_BLOCK};
            adam_step_q8_ref(&k, &a, &mo, 0, n);
        }
    }
}

/* The initial state: synth's initial weights in the layout, zero moments as the engine writes them (what quantizing
 * zeros gives: the maps' zero codes, scale 0). */
static void flat_init(const synth_opts *o, strata_moments form, flat *f)
{
    layout(o, f);
    f->master = calloc(f->n, 4);
    f->grad = calloc(f->n, 4);
    f->m = calloc(f->n, 2);
    f->v = calloc(f->n, 2);
    f->scale_m = calloc(f->n / MOMENTS_Q8_BLOCK + 1, 4);
    f->scale_v = calloc(f->n / MOMENTS_Q8_BLOCK + 1, 4);
    if (form == STRATA_MOMENTS_8BIT) {
        memset(f->m, moments_q8_signed()->zero, f->n);
        memset(f->v, moments_q8_unsigned()->zero, f->n);
    }
    for (int l = 0; l < o->layers; l++) {
        for (size_t i = 0; i < (size_t)o->width[l + 1] * o->width[l]; i++)
            f->master[f->w_at[l] + i] = synth_init_value(o->seed, 2 * l, i);
        for (size_t i = 0; i < (size_t)o->width[l + 1]; i++)
            f->master[f->b_at[l] + i] = synth_init_value(o->seed, 2 * l + 1, i);
    }
}

/* Scratch of the layer math: activations, the two deltas, one layer's gradients. */
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
            synth_layer_forward(o, l, f->master + f->w_at[l], f->master + f->b_at[l], x->act[l], x->act[l + 1]);
        float *dc = x->d0, *dn = x->d1;
        synth_loss_grad(o, x->act[L], x->target, 1.0f, dc);
        for (int l = L - 1; l >= 0; l--) {
            size_t nw = (size_t)o->width[l + 1] * o->width[l], nb = (size_t)o->width[l + 1];
            synth_layer_backward(o, l, f->master + f->w_at[l], x->act[l], x->act[l + 1], dc, dn, x->tw, x->tb);
            float *gw = f->grad + f->w_at[l], *gb = f->grad + f->b_at[l];
            for (size_t i = 0; i < nw; i++)
                gw[i] = mb == 0 ? x->tw[i] : gw[i] + x->tw[i];
            for (size_t i = 0; i < nb; i++)
                gb[i] = mb == 0 ? x->tb[i] : gb[i] + x->tb[i];
            float *t = dc;
            dc = dn;
            dn = t;
        }
    }
}

static float *oracle(const synth_opts *o, const strata_config *c, strata_moments form, size_t *n_out)
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
        step_oracle(c, form, &f, s + 1);
    }
    size_t total = 0;
    for (int l = 0; l < L; l++)
        total += (size_t)o->width[l + 1] * o->width[l] + o->width[l + 1];
    float *out = malloc(total * 4);
    size_t pos = 0;
    for (int l = 0; l < L; l++) {
        size_t nw = (size_t)o->width[l + 1] * o->width[l], nb = (size_t)o->width[l + 1];
        memcpy(out + pos, f.master + f.w_at[l], nw * 4);
        memcpy(out + pos + nw, f.master + f.b_at[l], nb * 4);
        pos += nw + nb;
    }
    for (int l = 0; l <= L; l++)
        free(x.act[l]);
    void *bufs[] = {f.master, f.grad, f.m, f.v, f.scale_m, f.scale_v, x.target, x.d0, x.d1, x.tw, x.tb};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    *n_out = total;
    return out;
}

static void run(strata_moments form, const char *scratch)
{
    synth_opts o;
    synth_defaults(&o, t_rand_u64());
    o.steps = 6;
    strata_config c = synth_config(STRATA_DTYPE_FP32);
    c.optimizer_moments = form;
    c.optimizer_moments_seed = 9;
    size_t n_ref = 0;
    float *ref = oracle(&o, &c, form, &n_ref);
    for (size_t p = 0; p < synth_placement_count; p++) {
        strata_config pc = c;
        synth_placements[p].apply(&pc, scratch);
        float *w = NULL;
        size_t n = 0;
        strata_status st = synth_train(&o, &pc, &w, &n, NULL, NULL);
        T_CHECK(st == STRATA_OK, "%s: training failed: %s", synth_placements[p].name, strata_last_error(NULL));
        if (w && n == n_ref) {
            size_t first, d = synth_count_diff(ref, w, n, &first);
            T_CHECK(d == 0, "%s moments / %s: %zu of %zu weights differ from the oracle; first at %zu: %.9g vs %.9g",
                    form == STRATA_MOMENTS_BF16 ? "bf16" : "8bit", synth_placements[p].name, d, n, first,
                    first < n ? (double)ref[first] : 0.0, first < n ? (double)w[first] : 0.0);
        }
        free(w);
    }
    free(ref);
}

int main(void)
{
    t_rng_seed();
    const char *scratch = t_scratch_dir("t_engine_moments_oracle");
    run(STRATA_MOMENTS_BF16, scratch);
    run(STRATA_MOMENTS_8BIT, scratch);
    return t_done();
}
