/*
 * Optimizer parameter groups in the engine against a scalar oracle: the synthetic model trained with three groups
 * (their own lr, weight decay, betas and eps, and an lr schedule that moves each from its own base) must end with the
 * master weights of plain arrays trained with the same layer math and the reference kernels, each parameter updated
 * with its group's constants (adam_consts_init, the specification), over the engine's layout with groups (a group
 * boundary inside a module padded to PLAN_GROUP_ALIGN). Bit for bit, on every placement, with fp32, bf16 and 8-bit
 * moments. The step variants that must not change a bit (the step in backward, with clipping speculating or the
 * norm pass, Twin-Flow's device share) are compared with the ordinary step on the same groups; a checkpoint resumes
 * exactly and refuses other groups; and every misuse names what was wrong.
 */
#include <math.h>
#include <string.h>

#include <jansson.h>

#include "cpu_adam/adam_moments.h"
#include "cpu_adam/adam_scalar.h"
#include "engine/plan/plan.h"
#include "engine/step/step.h"
#include "synth.h"
#include "synth_oracle.h"
#include "testlib.h"

/* ---------------------------------------------------------------- the runs */

static void expect_same(const char *what, const float *ref, size_t n_ref, const float *w, size_t n)
{
    T_CHECK(w && n == n_ref, "%s: %zu weights, the reference has %zu", what, n, n_ref);
    if (!w || n != n_ref)
        return;
    size_t first, d = synth_count_diff(ref, w, n, &first);
    T_CHECK(d == 0, "%s: %zu of %zu weights differ from the reference; first at %zu: %.9g vs %.9g", what, d, n, first,
            first < n ? (double)ref[first] : 0.0, first < n ? (double)w[first] : 0.0);
}

static float *train(const synth_opts *o, const strata_config *c, const char *what, size_t *n)
{
    float *w = NULL;
    strata_status st = synth_train(o, c, &w, n, NULL, NULL);
    T_CHECK(st == STRATA_OK, "%s: training failed: %s", what, strata_last_error(NULL));
    return w;
}

/* o->steps steps = half of them, saved into dir, loaded, the other half: bit for bit. */
static void resumes_exactly(const char *what, const synth_opts *o, const strata_config *c, const char *dir)
{
    char label[160];
    size_t n_ref, n;
    float *ref = train(o, c, what, &n_ref);
    synth_opts first = *o;
    first.steps = o->steps / 2;
    first.save_dir = dir;
    first.save_after = first.steps;
    snprintf(label, sizeof label, "%s: %d steps, saved", what, first.steps);
    free(train(&first, c, label, &n));
    synth_opts second = *o;
    second.first_step = first.steps;
    second.steps = o->steps - first.steps;
    second.load_dir = dir;
    snprintf(label, sizeof label, "%s: loaded, %d more", what, second.steps);
    float *w = train(&second, c, label, &n);
    snprintf(label, sizeof label, "%s: resumed vs uninterrupted", what);
    expect_same(label, ref, n_ref, w, n);
    free(w);
    free(ref);
}

static synth_opts base_opts(void)
{
    synth_opts o;
    synth_defaults(&o, t_rand_u64());
    o.steps = 5;
    o.lr_decay = 0.8;
    return o;
}

/* Every placement with the moments in `form` against the oracle; the frozen layers' weights keep their initial
 * values exactly. */
static void sweep(const char *label, const synth_opts *o, strata_moments form, const char *scratch)
{
    static const char *const names[] = {"fp32", "bf16", "8bit"};
    strata_config c = synth_config(STRATA_DTYPE_FP32);
    c.optimizer_moments = form;
    c.optimizer_moments_seed = 5;
    size_t n_ref;
    float *ref = synth_oracle(o, &c, form, &n_ref);
    for (size_t p = 0; p < synth_placement_count; p++) {
        strata_config pc = c;
        synth_placements[p].apply(&pc, scratch);
        char what[160];
        snprintf(what, sizeof what, "%s, %s moments, %s", label, names[form], synth_placements[p].name);
        size_t n;
        float *w = train(o, &pc, what, &n);
        expect_same(what, ref, n_ref, w, n);
        for (int l = 0, at = 0; w && l < o->layers; at += o->width[l + 1] * (o->width[l] + 1), l++)
            if (o->frozen_layers >> l & 1)
                T_CHECK(w[at] == synth_init_value(o->seed, 2 * l, 0) &&
                            w[at + 1] == synth_init_value(o->seed, 2 * l, 1),
                        "%s: frozen layer %d's weight kept its initial values", what, l);
        free(w);
    }
    free(ref);
}

/* Every placement and moments form against the oracle. */
static void against_oracle(const char *scratch)
{
    synth_opts o = base_opts();
    synth_groups g = synth_three_groups(o.layers);
    o.groups = &g;
    sweep("3 groups", &o, STRATA_MOMENTS_FP32, scratch);
    sweep("3 groups", &o, STRATA_MOMENTS_BF16, scratch);
    sweep("3 groups", &o, STRATA_MOMENTS_8BIT, scratch);
    /* The oracle itself tells groups apart: one group's values, everywhere, would give other weights. */
    strata_config c = synth_config(STRATA_DTYPE_FP32);
    synth_groups same = g;
    for (int i = 0; i < same.n; i++)
        same.hp[i] = (strata_group_hparams){.lr = c.lr, .weight_decay = c.weight_decay, .beta1 = c.beta1,
                                            .beta2 = c.beta2, .eps = c.eps};
    synth_opts os = o;
    os.groups = &same;
    size_t n1, n2;
    float *a = synth_oracle(&o, &c, STRATA_MOMENTS_FP32, &n1), *b = synth_oracle(&os, &c, STRATA_MOMENTS_FP32, &n2);
    size_t first;
    T_CHECK(synth_count_diff(a, b, n1, &first) > n1 / 2, "the groups' values change most weights in the oracle");
    free(a);
    free(b);
}

/* Frozen modules: the middle layer frozen (backward passes through it) and the groups of the others, against the
 * oracle that never updates it, on every placement and moments form; its optimizer state does not exist (the host
 * tier holds less than with it trained); misuse of it is refused. */
static void frozen(const char *scratch)
{
    synth_opts o = base_opts();
    synth_groups g = synth_three_groups(o.layers);
    o.groups = &g;
    o.frozen_layers = 1u << 1 | 1u << 2;
    sweep("layers 1, 2 frozen", &o, STRATA_MOMENTS_FP32, scratch);
    sweep("layers 1, 2 frozen", &o, STRATA_MOMENTS_8BIT, scratch);
    /* The optimizer state and gradients of the frozen modules are not allocated: the host holds less. */
    strata_config c = synth_config(STRATA_DTYPE_FP32);
    c.offload_optimizer.device = STRATA_TIER_HOST;
    synth_opts trained = o;
    trained.frozen_layers = 0;
    strata_stats sf, st;
    float *w = NULL;
    size_t n;
    T_OK(synth_train(&o, &c, &w, &n, NULL, &sf));
    free(w);
    T_OK(synth_train(&trained, &c, &w, &n, NULL, &st));
    free(w);
    size_t frozen_numel = 0; /* layers 1 and 2, padded as the layout pads them */
    for (int l = 1; l <= 2; l++) {
        size_t sizes[2] = {(size_t)o.width[l + 1] * o.width[l], (size_t)o.width[l + 1]};
        uint32_t gr[2] = {(uint32_t)g.of_param[2 * l], (uint32_t)g.of_param[2 * l + 1]};
        frozen_numel += plan_module_layout(sizes, gr, 2, NULL, NULL);
    }
    /* At least master + m + v (12 bytes) and the gradient store (4) per frozen element; the step's pinned slots,
     * sized by the optimizer's partition where it is smaller than a sub-group, shrink too. */
    T_CHECK(sf.host_peak_bytes + frozen_numel * 16 <= st.host_peak_bytes,
            "host peak with layers 1, 2 frozen %zu, trained %zu: the difference %zd holds at least their optimizer "
            "state and gradient store, %zu", sf.host_peak_bytes, st.host_peak_bytes,
            (ssize_t)(st.host_peak_bytes - sf.host_peak_bytes), frozen_numel * 16);

    /* Misuse. */
    strata_engine *e = NULL;
    T_OK(synth_engine(&o, &c, &e));
    T_CHECK(strata_module_frozen(e, 1) && !strata_module_frozen(e, 0), "layer 1 frozen, layer 0 not");
    T_CHECK(strata_module_freeze(e, 0) == STRATA_ESTATE, "freezing after finalize refused");
    T_OK(strata_fetch(e, 1));
    T_CHECK(strata_grad_data(e, 2) == NULL && strstr(strata_last_error(e), "frozen"),
            "no gradient buffer for a frozen parameter: %s", strata_last_error(e));
    T_CHECK(strata_grads_ready(e, 1) == STRATA_ESTATE && strstr(strata_last_error(e), "layer1") &&
                strstr(strata_last_error(e), "frozen"),
            "grads_ready of a frozen module refused: %s", strata_last_error(e));
    T_OK(strata_release(e, 1));
    float v;
    T_OK(strata_param_read_master(e, 2, 5, 1, &v));
    T_CHECK(v == synth_init_value(o.seed, 2, 5), "a frozen parameter reads as its values: %g vs %g", (double)v,
            (double)synth_init_value(o.seed, 2, 5));
    strata_engine_destroy(e);

    /* A checkpoint holds the frozen modules (in params.safetensors) and resumes exactly. */
    synth_use_nvme(&c, scratch, true, true);
    o.steps = 4;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ckpt-frozen", scratch);
    resumes_exactly("layers 1, 2 frozen", &o, &c, dir);
}

/* The step variants on the same groups, with or without a frozen layer: each must give the ordinary step's weights.
 * bf16 parameters, accumulation 1 (the step in backward needs it), gradient clipping. */
static void variants(const char *scratch, uint32_t frozen_layers)
{
    synth_opts o = base_opts();
    o.micro_batches = 1;
    o.frozen_layers = frozen_layers;
    synth_groups g = synth_three_groups(o.layers);
    o.groups = &g;
    strata_config c = synth_config(STRATA_DTYPE_BF16);
    c.gradient_clipping = 0.05;
    size_t n_ref;
    float *ref = train(&o, &c, "ordinary step, clipping", &n_ref);

    strata_config v = c;
    v.step_in_backward = true;
    size_t n;
    float *w = train(&o, &v, "step in backward, clipping speculating", &n);
    expect_same("step in backward (speculating) vs the ordinary step", ref, n_ref, w, n);
    free(w);

    v.norm_pass = true;
    w = train(&o, &v, "step in backward with the norm pass", &n);
    expect_same("norm pass vs the ordinary step", ref, n_ref, w, n);
    free(w);

    v = c;
    v.offload_optimizer_ratio = 0.5; /* the device's Adam (the host backend's stream) takes half of the groups' runs */
    w = train(&o, &v, "Twin-Flow ratio 0.5", &n);
    expect_same("offload_optimizer.ratio 0.5 vs 1", ref, n_ref, w, n);
    free(w);

    v = c;
    synth_use_nvme(&v, scratch, true, true);
    v.step_in_backward = true;
    w = train(&o, &v, "step in backward on NVMe", &n);
    expect_same("step in backward on NVMe vs the ordinary step", ref, n_ref, w, n);
    free(w);
    free(ref);
}

/* Makes dir's manifest one saved before groups existed: without "param_groups" and its checksum. */
static void strip_groups(const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    json_t *root = json_load_file(path, JSON_PRESERVE_ORDER, NULL);
    T_CHECK(root && json_object_get(root, "param_groups"), "the manifest records the groups");
    if (!root)
        return;
    json_object_del(root, "param_groups");
    json_object_del(json_object_get(root, "field_crc32c"), "param_groups");
    T_CHECK(json_dump_file(root, path, JSON_INDENT(1) | JSON_PRESERVE_ORDER) == 0, "rewriting %s", path);
    json_decref(root);
}

/* 2N steps = N, save, load, N more, with the groups' lrs on their schedules; the checkpoint restores the groups'
 * values and refuses an engine whose groups differ. */
static void checkpoints(const char *scratch)
{
    synth_opts o = base_opts();
    o.steps = 6;
    synth_groups g = synth_three_groups(o.layers);
    o.groups = &g;
    strata_config c = synth_config(STRATA_DTYPE_FP32);
    synth_use_nvme(&c, scratch, true, true);
    size_t n;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ckpt-groups", scratch);
    resumes_exactly("3 groups", &o, &c, dir); /* dir keeps the checkpoint after 3 of the 6 steps */

    /* The saved values come back: a fresh engine with other group values takes the checkpoint's. */
    synth_opts other = o;
    synth_groups og = g;
    og.hp[0].weight_decay = 0.3;
    other.groups = &og;
    strata_engine *e = NULL;
    T_OK(synth_engine(&other, &c, &e));
    T_OK(strata_load(e, dir));
    strata_group_hparams hp;
    T_OK(strata_group_get(e, 1, &hp));
    T_CHECK(hp.weight_decay == 0.1 && hp.lr == g.hp[0].lr * pow(o.lr_decay, 2),
            "group 1 after the load: weight_decay %g (saved 0.1), lr %.17g (saved %.17g)", hp.weight_decay, hp.lr,
            g.hp[0].lr * pow(o.lr_decay, 2));
    strata_engine_destroy(e);

    /* Other members: refused, naming the parameter and both groups. */
    synth_groups moved = g;
    moved.of_param[1] = 1;
    other.groups = &moved;
    T_OK(synth_engine(&other, &c, &e));
    T_CHECK(strata_load(e, dir) == STRATA_ECONFIG, "a load into other groups' members is refused");
    T_CHECK(strstr(strata_last_error(e), "layer0.bias") && strstr(strata_last_error(e), "group2") &&
                strstr(strata_last_error(e), "group1"),
            "the refusal names the parameter and both groups: %s", strata_last_error(e));
    strata_engine_destroy(e);

    /* A checkpoint of one group into three: refused, as torch's load_state_dict refuses other param_groups. */
    synth_opts one = o;
    one.groups = NULL;
    one.steps = 2;
    one.save_dir = dir;
    one.save_after = 2;
    free(train(&one, &c, "one group, saved", &n));
    T_OK(synth_engine(&o, &c, &e));
    T_CHECK(strata_load(e, dir) == STRATA_ECONFIG && strstr(strata_last_error(e), "1 parameter groups, this engine 3"),
            "a checkpoint of one group into three refused: %s", strata_last_error(e));
    strata_engine_destroy(e);

    /* A checkpoint saved before groups existed (its manifest has no "param_groups") loads into an engine with groups;
     * their own values stay. */
    strip_groups(dir);
    T_OK(synth_engine(&o, &c, &e));
    T_OK(strata_load(e, dir));
    T_OK(strata_group_get(e, 2, &hp));
    T_CHECK(hp.lr == g.hp[1].lr && hp.eps == g.hp[1].eps, "group 2 keeps its values after loading a checkpoint of one "
            "group: lr %g eps %g", hp.lr, hp.eps);
    strata_engine_destroy(e);
}

/* Misuse: each refused, naming what was wrong. */
static void misuse(void)
{
    synth_opts o = base_opts();
    strata_config c = synth_config(STRATA_DTYPE_FP32);
    strata_engine *e = NULL;
    T_OK(strata_engine_create(&c, &e));
    strata_module_id m;
    strata_param_id p, q;
    T_OK(strata_module_add(e, "block", &m));
    T_OK(strata_param_add(e, m, "w", 4096, NULL, NULL, &p));
    T_OK(strata_param_add(e, m, "b", 64, NULL, NULL, &q));
    strata_group_hparams ok = {.lr = 1e-3, .weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    struct {
        const char *field;
        strata_group_hparams hp;
    } bad[] = {
        {"lr", {.lr = -1, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8}},
        {"lr", {.lr = NAN, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8}},
        {"weight_decay", {.lr = 1e-3, .weight_decay = -0.1, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8}},
        {"beta1", {.lr = 1e-3, .beta1 = 1.0, .beta2 = 0.999, .eps = 1e-8}},
        {"beta2", {.lr = 1e-3, .beta1 = 0.9, .beta2 = -0.5, .eps = 1e-8}},
        {"eps", {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 0}},
    };
    strata_group_id g;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        T_CHECK(strata_group_add(e, "bad", &bad[i].hp, &g) == STRATA_EINVAL && g == STRATA_INVALID_ID,
                "group %zu (%s out of range) refused", i, bad[i].field);
        T_CHECK(strstr(strata_last_error(e), bad[i].field) && strstr(strata_last_error(e), "\"bad\""),
                "the refusal names the group and %s: %s", bad[i].field, strata_last_error(e));
    }
    strata_group_id decay, other;
    T_OK(strata_group_add(e, "decay", &ok, &decay));
    T_CHECK(strata_group_add(e, "decay", &ok, &g) == STRATA_EINVAL && strstr(strata_last_error(e), "already exists"),
            "a duplicate name refused: %s", strata_last_error(e));
    T_OK(strata_group_add(e, "other", &ok, &other));
    T_CHECK(strata_param_set_group(e, p, 7) == STRATA_EINVAL && strstr(strata_last_error(e), "group 7 is unknown"),
            "an unknown group refused: %s", strata_last_error(e));
    T_OK(strata_param_set_group(e, p, decay));
    T_OK(strata_param_set_group(e, p, decay)); /* again, the same: a no-op */
    T_CHECK(strata_param_set_group(e, p, other) == STRATA_EINVAL && strstr(strata_last_error(e), "block.w") &&
                strstr(strata_last_error(e), "\"decay\"") && strstr(strata_last_error(e), "\"other\""),
            "a parameter in two groups refused, naming it and both groups: %s", strata_last_error(e));
    T_CHECK(strata_param_group(e, p) == decay && strata_param_group(e, q) == 0 && strata_group_count(e) == 3,
            "groups of p %u and q %u, %zu groups", strata_param_group(e, p), strata_param_group(e, q),
            strata_group_count(e));
    T_OK(strata_engine_finalize(e));
    T_CHECK(strata_group_add(e, "late", &ok, &g) == STRATA_ESTATE, "strata_group_add after finalize refused");
    T_CHECK(strata_param_set_group(e, q, decay) == STRATA_ESTATE, "strata_param_set_group after finalize refused");
    T_CHECK(strata_step(e, &(strata_step_args){.lr = 1e-3}, NULL) == STRATA_EINVAL &&
                strstr(strata_last_error(e), "3 parameter groups"),
            "a step's lr with several groups refused: %s", strata_last_error(e));
    T_OK(strata_group_set(e, decay, &ok));
    T_CHECK(strata_group_set(e, 9, &ok) == STRATA_EINVAL, "strata_group_set of an unknown group refused");
    strata_engine_destroy(e);

    /* With the step in backward, a group's values are fixed from strata_step_begin to strata_step. */
    c.step_in_backward = true;
    synth_groups sg = synth_three_groups(o.layers);
    o.groups = &sg;
    o.micro_batches = 1;
    T_OK(synth_engine(&o, &c, &e));
    T_OK(strata_step_begin(e, NULL));
    T_CHECK(strata_group_set(e, 1, &ok) == STRATA_ESTATE && strstr(strata_last_error(e), "strata_step_begin"),
            "strata_group_set while a step is begun refused: %s", strata_last_error(e));
    strata_engine_destroy(e);
}

int main(void)
{
    t_rng_seed();
    const char *scratch = t_scratch_dir("t_engine_groups");
    against_oracle(scratch);
    frozen(scratch);
    variants(scratch, 0);
    variants(scratch, 1u << 1);
    checkpoints(scratch);
    misuse();
    return t_done();
}
