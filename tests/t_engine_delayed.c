/*
 * The delayed update (ZeRO-Offload's one-step delay) against an independent reference of the
 * recurrence: plain arrays, the same layer math, and the standalone strata_adam_step — no engine.
 *   steps 1..warmup:  the update of step s is visible from iteration s+1 (ordinary training)
 *   later steps:      the update of step s is visible from iteration s+2; iteration s+1 still
 *                     computes with the parameters that were visible before step s
 * The master weights must be bit-identical, on every placement, and must differ from the undelayed run.
 */
#include <math.h>

#include "synth.h"
#include "testlib.h"

typedef struct ref_layer {
    float *W, *b, *mW, *vW, *mb, *vb;   /* master weights and moments */
    float *visW, *visb;                 /* what the trainer computes with */
    float *pendW, *pendb;               /* an update computed but not yet visible */
    float *gW, *gb, *tW, *tb;           /* accumulated and per-micro-batch gradients */
} ref_layer;

static void adam(const strata_config *c, int64_t step, float *w, float *m, float *v, const float *g, size_t n)
{
    strata_adam_hparams hp;
    T_OK(strata_config_adam_hparams(c, &hp)); /* what the engine runs with */
    strata_adam_tensors t = {w, m, v, g, STRATA_DTYPE_FP32, NULL, STRATA_DTYPE_NONE, n};
    strata_adam_step_args a = {.step = step, .threads = 1};
    T_OK(strata_adam_step(&hp, &t, &a, NULL));
}

static float *reference(const synth_opts *o, const strata_config *c, int warmup, size_t *n_out)
{
    int L = o->layers, B = o->batch;
    ref_layer ly[SYNTH_MAX_LAYERS];
    size_t maxw = 0;
    for (int l = 0; l <= L; l++)
        maxw = (size_t)o->width[l] > maxw ? (size_t)o->width[l] : maxw;
    for (int l = 0; l < L; l++) {
        size_t nw = (size_t)o->width[l + 1] * o->width[l], nb = (size_t)o->width[l + 1];
        float **wa[] = {&ly[l].W, &ly[l].mW, &ly[l].vW, &ly[l].visW, &ly[l].pendW, &ly[l].gW, &ly[l].tW};
        float **ba[] = {&ly[l].b, &ly[l].mb, &ly[l].vb, &ly[l].visb, &ly[l].pendb, &ly[l].gb, &ly[l].tb};
        for (size_t i = 0; i < 7; i++) {
            *wa[i] = calloc(nw, 4);
            *ba[i] = calloc(nb, 4);
        }
        for (size_t i = 0; i < nw; i++)
            ly[l].W[i] = ly[l].visW[i] = synth_init_value(o->seed, 2 * l, i);
        for (size_t i = 0; i < nb; i++)
            ly[l].b[i] = ly[l].visb[i] = synth_init_value(o->seed, 2 * l + 1, i);
    }
    float *act[SYNTH_MAX_LAYERS + 1], *target = calloc((size_t)B * o->width[L], 4);
    float *d0 = calloc((size_t)B * maxw, 4), *d1 = calloc((size_t)B * maxw, 4);
    for (int l = 0; l <= L; l++)
        act[l] = calloc((size_t)B * o->width[l], 4);
    bool pending = false;
    for (int s = 0; s < o->steps; s++) {
        for (int mb = 0; mb < o->micro_batches; mb++) {
            synth_batch(o, s, mb, act[0], target);
            for (int l = 0; l < L; l++)
                synth_layer_forward(o, l, ly[l].visW, ly[l].visb, act[l], act[l + 1]);
            float *dc = d0, *dn = d1;
            synth_loss_grad(o, act[L], target, 1.0f, dc);
            for (int l = L - 1; l >= 0; l--) {
                size_t nw = (size_t)o->width[l + 1] * o->width[l], nb = (size_t)o->width[l + 1];
                synth_layer_backward(o, l, ly[l].visW, act[l], act[l + 1], dc, dn, ly[l].tW, ly[l].tb);
                for (size_t i = 0; i < nw; i++)
                    ly[l].gW[i] = mb == 0 ? ly[l].tW[i] : ly[l].gW[i] + ly[l].tW[i];
                for (size_t i = 0; i < nb; i++)
                    ly[l].gb[i] = mb == 0 ? ly[l].tb[i] : ly[l].gb[i] + ly[l].tb[i];
                float *t = dc;
                dc = dn;
                dn = t;
            }
        }
        int step_no = s + 1;
        for (int l = 0; l < L; l++) {
            size_t nw = (size_t)o->width[l + 1] * o->width[l], nb = (size_t)o->width[l + 1];
            if (pending) { /* the previous delayed update becomes visible now */
                memcpy(ly[l].visW, ly[l].pendW, nw * 4);
                memcpy(ly[l].visb, ly[l].pendb, nb * 4);
            }
            adam(c, step_no, ly[l].W, ly[l].mW, ly[l].vW, ly[l].gW, nw);
            adam(c, step_no, ly[l].b, ly[l].mb, ly[l].vb, ly[l].gb, nb);
            memcpy(step_no <= warmup ? ly[l].visW : ly[l].pendW, ly[l].W, nw * 4);
            memcpy(step_no <= warmup ? ly[l].visb : ly[l].pendb, ly[l].b, nb * 4);
        }
        pending = step_no > warmup;
    }
    size_t total = 0, pos = 0;
    for (int l = 0; l < L; l++)
        total += (size_t)o->width[l + 1] * o->width[l] + o->width[l + 1];
    float *out = malloc(total * 4);
    for (int l = 0; l < L; l++) {
        size_t nw = (size_t)o->width[l + 1] * o->width[l], nb = (size_t)o->width[l + 1];
        memcpy(out + pos, ly[l].W, nw * 4);
        pos += nw;
        memcpy(out + pos, ly[l].b, nb * 4);
        pos += nb;
        float *all[] = {ly[l].W, ly[l].b, ly[l].mW, ly[l].vW, ly[l].mb, ly[l].vb, ly[l].visW, ly[l].visb,
                        ly[l].pendW, ly[l].pendb, ly[l].gW, ly[l].gb, ly[l].tW, ly[l].tb};
        for (size_t i = 0; i < 14; i++)
            free(all[i]);
    }
    for (int l = 0; l <= L; l++)
        free(act[l]);
    free(target);
    free(d0);
    free(d1);
    *n_out = total;
    return out;
}

static void run(const char *label, bool nvme, const char *dir)
{
    synth_opts o;
    synth_defaults(&o, t_rand_u64());
    o.steps = 7;
    strata_config c;
    strata_config_init(&c);
    c.backend = STRATA_BACKEND_HOST;
    c.device_budget_bytes = 64u << 20;
    c.host_budget_bytes = 1u << 30;
    c.sub_group_size = 12288;
    c.lr = 2e-2f;
    c.delayed_update = true;
    c.delayed_warmup_steps = 2;
    c.aio.block_size = 64 << 10;
    if (nvme)
        synth_offload(&c, STRATA_TIER_NVME, dir, true, true);
    else
        c.offload_optimizer.device = STRATA_TIER_HOST;
    float *w = NULL, *plain = NULL;
    size_t n = 0, nplain = 0, nref = 0, first;
    T_OK(synth_train(&o, &c, &w, &n, NULL, NULL));
    float *ref = reference(&o, &c, c.delayed_warmup_steps, &nref);
    T_EQ_INT(n, nref);
    if (w && n == nref) {
        size_t d = synth_count_diff(w, ref, n, &first);
        T_CHECK(d == 0, "%s: %zu of %zu master weights differ from the reference recurrence; first at %zu: "
                "engine %.9g, reference %.9g", label, d, n, first, first < n ? (double)w[first] : 0.0,
                first < n ? (double)ref[first] : 0.0);
    }
    /* The same run without the delay must differ: the test would prove nothing otherwise. */
    c.delayed_warmup_steps = o.steps;
    T_OK(synth_train(&o, &c, &plain, &nplain, NULL, NULL));
    if (w && plain && nplain == n) {
        size_t d = synth_count_diff(w, plain, n, &first);
        T_CHECK(d > n / 2, "%s: the delayed run matches the undelayed one in %zu of %zu weights", label, n - d, n);
    }
    free(w);
    free(plain);
    free(ref);
}

int main(void)
{
    t_rng_seed();
    const char *dir = t_scratch_dir("t_engine_delayed");
    run("optimizer on host", false, dir);
    run("parameters and optimizer on NVMe", true, dir);
    return t_done();
}
