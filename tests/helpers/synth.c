#include "synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

/* Reading and writing device buffers of the parameter dtype. On the host backend device memory is
 * host memory; a GPU test would copy instead. */
static float load_elem(const void *p, strata_dtype dt, size_t i)
{
    if (dt == STRATA_DTYPE_FP32)
        return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    if (dt == STRATA_DTYPE_BF16) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    /* fp16 (normal and subnormal; inputs here are small finite values) */
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    float f;
    if (exp == 0)
        f = (float)mant * 0x1p-24f;
    else if (exp == 31)
        f = mant ? NAN : INFINITY;
    else {
        uint32_t u = ((exp + 112) << 23) | (mant << 13);
        memcpy(&f, &u, 4);
    }
    return sign ? -f : f;
}

static uint16_t to_half(float f, strata_dtype dt)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if (dt == STRATA_DTYPE_BF16) {
        if ((x & 0x7fffffff) > 0x7f800000)
            return (uint16_t)((x >> 16) | 0x40);
        return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
    }
    /* fp16 by way of the compiler's conversion (round to nearest even) */
    _Float16 h = (_Float16)f;
    uint16_t b;
    memcpy(&b, &h, 2);
    return b;
}

static void store_elem(void *p, strata_dtype dt, size_t i, float v)
{
    if (dt == STRATA_DTYPE_FP32)
        ((float *)p)[i] = v;
    else
        ((uint16_t *)p)[i] = to_half(v, dt);
}

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float uniform(uint64_t key)
{
    return (float)((double)(mix(key) >> 11) * 0x1.0p-53) * 2.0f - 1.0f;
}

float synth_init_value(uint64_t seed, int index, size_t i)
{
    return 0.3f * uniform(seed ^ mix((uint64_t)index * 1000003u + i));
}

typedef struct init_ctx {
    uint64_t seed;
    int index;
} init_ctx;

static strata_status init_param(void *ctx, strata_param_id param, size_t offset, size_t count, float *out)
{
    (void)param;
    init_ctx *c = ctx;
    for (size_t i = 0; i < count; i++)
        out[i] = synth_init_value(c->seed, c->index, offset + i);
    return STRATA_OK;
}

void synth_defaults(synth_opts *o, uint64_t seed)
{
    memset(o, 0, sizeof *o);
    o->layers = 4;
    int w[] = {24, 80, 48, 64, 16};
    memcpy(o->width, w, sizeof w);
    o->batch = 6;
    o->micro_batches = 2;
    o->steps = 4;
    o->seed = seed;
}

strata_config synth_config(strata_dtype dtype)
{
    strata_config c;
    strata_config_init(&c);
    c.backend = STRATA_BACKEND_HOST;
    c.device_budget_bytes = 64u << 20;
    c.host_budget_bytes = 1u << 30;
    c.param_dtype = dtype;
    c.sub_group_size = 12288;
    c.cpu_threads = 2;
    c.lr = 1e-2f;
    c.weight_decay = 0.05f;
    c.aio.block_size = 64 << 10;
    return c;
}

void synth_nvme_path(strata_config *c, const char *dir, bool params, bool optimizer)
{
    strata_offload_config *blocks[] = {params ? &c->offload_param : NULL, optimizer ? &c->offload_optimizer : NULL};
    for (int i = 0; i < 2; i++) {
        if (!blocks[i])
            continue;
        snprintf(blocks[i]->nvme_path[0], STRATA_PATH_BYTES, "%s", dir);
        blocks[i]->nvme_path_count = 1;
    }
}

void synth_offload(strata_config *c, strata_tier tier, const char *dir, bool params, bool optimizer)
{
    if (params)
        c->offload_param.device = tier;
    if (optimizer)
        c->offload_optimizer.device = tier;
    synth_nvme_path(c, dir, params, optimizer);
}

void synth_use_nvme(strata_config *c, const char *dir, bool params, bool optimizer)
{
    synth_offload(c, STRATA_TIER_NVME, dir, params, optimizer);
    /* The fault and integrity tests that use this mean every swapped state class, the gradient store included,
     * read from the drive: no host cache in front of it. */
    if (optimizer)
        c->gradients_on_nvme = STRATA_SWITCH_ON;
    c->host_cache = false;
}

static void all_device(strata_config *c, const char *dir) { (void)c, (void)dir; }
static void opt_host(strata_config *c, const char *dir)
{
    (void)dir;
    c->offload_optimizer.device = STRATA_TIER_HOST;
}
static void param_host(strata_config *c, const char *dir)
{
    (void)dir;
    c->offload_optimizer.device = STRATA_TIER_HOST;
    c->offload_param.device = STRATA_TIER_HOST;
}
static void all_nvme(strata_config *c, const char *dir)
{
    synth_use_nvme(c, dir, true, true);
    c->gradients_on_nvme = STRATA_SWITCH_AUTO; /* the gradient store fits the host: it stays there */
}
static void all_nvme_cached(strata_config *c, const char *dir)
{
    all_nvme(c, dir);
    c->host_cache = true; /* the host budget holds it all: every read is the mirror's */
}
static void all_nvme_part_cached(strata_config *c, const char *dir)
{
    all_nvme_cached(c, dir);
    c->param_max_in_cpu = 12288; /* some modules mirrored, the rest read from the drive */
}
static void nvme_tiny_budget(strata_config *c, const char *dir)
{
    synth_use_nvme(c, dir, true, true); /* the gradient store on NVMe too */
    /* Room for two of the largest default module (80*48 + 48 elements, padded to 4096-element blocks) and
     * one gradient buffer. */
    size_t big = 8192 * (c->param_dtype == STRATA_DTYPE_FP32 ? 4 : 2);
    c->prefetch_bytes = 1;
    c->max_live_bytes = 2 * big;
    c->device_budget_bytes = 3 * big;
}

const synth_placement synth_placements[] = {
    {"all on the device tier", all_device},
    {"optimizer on host", opt_host},
    {"parameters and optimizer on host", param_host},
    {"parameters and optimizer on NVMe", all_nvme},
    {"NVMe, all of it mirrored by the host cache", all_nvme_cached},
    {"NVMe, the host cache mirroring some parameter modules", all_nvme_part_cached},
    {"NVMe with a device budget of two modules", nvme_tiny_budget},
};
const size_t synth_placement_count = sizeof synth_placements / sizeof synth_placements[0];

void synth_rand_tokens(int32_t *tokens, int32_t *targets, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        tokens[i] = (int32_t)t_rand_range(0, 255);
        targets[i] = (int32_t)t_rand_range(0, 255);
    }
}

size_t synth_count_diff(const float *a, const float *b, size_t n, size_t *first)
{
    size_t d = 0;
    *first = n;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], 4) != 0) {
            if (*first == n)
                *first = i;
            d++;
        }
    return d;
}

/* ---------------------------------------------------------------- the math, shared with the reference */

void synth_batch(const synth_opts *o, int step, int mb, float *input, float *target)
{
    uint64_t key = mix(o->seed ^ ((uint64_t)step << 20) ^ ((uint64_t)mb << 8));
    for (int i = 0; i < o->batch * o->width[0]; i++)
        input[i] = uniform(key + (uint64_t)i);
    for (int i = 0; i < o->batch * o->width[o->layers]; i++)
        target[i] = 0.5f * uniform(~key + (uint64_t)i);
}

void synth_layer_forward(const synth_opts *o, int l, const float *W, const float *b, const float *in, float *out)
{
    int nin = o->width[l], nout = o->width[l + 1];
    for (int r = 0; r < o->batch; r++)
        for (int j = 0; j < nout; j++) {
            float z = b[j];
            for (int k = 0; k < nin; k++)
                z += W[(size_t)j * nin + k] * in[r * nin + k];
            out[r * nout + j] = tanhf(z);
        }
}

double synth_loss_grad(const synth_opts *o, const float *y, const float *target, float scale, float *dy)
{
    double loss = 0;
    int n = o->batch * o->width[o->layers];
    for (int i = 0; i < n; i++) {
        float d = y[i] - target[i];
        loss += 0.5 * d * d / o->batch;
        dy[i] = d / o->batch * scale;
    }
    return loss;
}

void synth_layer_backward(const synth_opts *o, int l, const float *W, const float *in, const float *out, float *dout,
                          float *din, float *gW, float *gb)
{
    int nin = o->width[l], nout = o->width[l + 1], B = o->batch;
    for (int r = 0; r < B; r++)
        for (int j = 0; j < nout; j++) {
            float y = out[r * nout + j];
            dout[r * nout + j] *= 1.0f - y * y; /* through tanh */
        }
    for (int j = 0; j < nout; j++) {
        float sb = 0;
        for (int r = 0; r < B; r++)
            sb += dout[r * nout + j];
        gb[j] = sb;
        for (int k = 0; k < nin; k++) {
            float sw = 0;
            for (int r = 0; r < B; r++)
                sw += dout[r * nout + j] * in[r * nin + k];
            gW[(size_t)j * nin + k] = sw;
        }
    }
    for (int r = 0; r < B; r++)
        for (int k = 0; k < nin; k++) {
            float sum = 0;
            for (int j = 0; j < nout; j++)
                sum += W[(size_t)j * nin + k] * dout[r * nout + j];
            din[r * nin + k] = sum;
        }
}

static void load_all(const void *src, strata_dtype dt, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = load_elem(src, dt, i);
}

static void store_all(void *dst, strata_dtype dt, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        store_elem(dst, dt, i, src[i]);
}

/* Rounds gradients to multiples of 2^-26 within [-2^-6, 2^-6]: sums of up to 16 such values are exact in fp32
 * whatever their order (every partial sum is a multiple of 2^-26 below 2^-2 = 2^24 grid steps). */
static void exact_grid(float *g, size_t n)
{
    const float step = 0x1p-26f, limit = 0x1p-6f;
    for (size_t i = 0; i < n; i++) {
        float v = g[i] > limit ? limit : g[i] < -limit ? -limit : g[i];
        g[i] = nearbyintf(v / step) * step;
    }
}

/* Creates and finalizes the engine with the model's modules: "layer<l>" holding "weight" and "bias". */
static strata_status build(const synth_opts *o, const strata_config *cfg, strata_engine **out, strata_module_id *mod,
                           strata_param_id *W, strata_param_id *b)
{
    init_ctx ictx[2 * SYNTH_MAX_LAYERS];
    strata_engine *e = NULL;
    strata_status st = strata_engine_create_ranked(cfg, o->comm, NULL, &e);
    for (int l = 0; l < o->layers && st == STRATA_OK; l++) {
        char name[32];
        snprintf(name, sizeof name, "layer%d", l);
        st = strata_module_add(e, name, &mod[l]);
        ictx[2 * l] = (init_ctx){o->seed, 2 * l};
        ictx[2 * l + 1] = (init_ctx){o->seed, 2 * l + 1};
        if (st == STRATA_OK)
            st = strata_param_add(e, mod[l], "weight", (size_t)o->width[l + 1] * o->width[l], init_param,
                                  &ictx[2 * l], &W[l]);
        if (st == STRATA_OK)
            st = strata_param_add(e, mod[l], "bias", (size_t)o->width[l + 1], init_param, &ictx[2 * l + 1], &b[l]);
    }
    for (int l = 0; l < o->layers && st == STRATA_OK; l++)
        if (o->frozen_layers >> l & 1)
            st = strata_module_freeze(e, mod[l]);
    const synth_groups *g = o->groups;
    strata_group_id ids[SYNTH_MAX_GROUPS + 1] = {0};
    for (int i = 0; g && i < g->n && st == STRATA_OK; i++) {
        char name[32];
        snprintf(name, sizeof name, "group%d", i + 1);
        st = strata_group_add(e, name, &g->hp[i], &ids[i + 1]);
    }
    for (int l = 0; g && l < o->layers && st == STRATA_OK; l++) {
        st = strata_param_set_group(e, W[l], ids[g->of_param[2 * l]]);
        if (st == STRATA_OK)
            st = strata_param_set_group(e, b[l], ids[g->of_param[2 * l + 1]]);
    }
    if (st == STRATA_OK)
        st = strata_engine_finalize(e);
    if (st != STRATA_OK && e) {
        fprintf(stderr, "synth: building the engine: %s: %s\n", strata_status_name(st), strata_last_error(e));
        strata_engine_destroy(e);
        e = NULL;
    }
    *out = e;
    return st;
}

strata_status synth_engine(const synth_opts *o, const strata_config *cfg, strata_engine **out)
{
    strata_module_id mod[SYNTH_MAX_LAYERS];
    strata_param_id W[SYNTH_MAX_LAYERS], b[SYNTH_MAX_LAYERS];
    return build(o, cfg, out, mod, W, b);
}

#define CHECK(call)                          \
    do {                                     \
        st = (call);                         \
        if (st != STRATA_OK)                 \
            goto out;                        \
    } while (0)

/* A hand-over call of the step whose second backward differs (norm_pass_differ_at): the update that meets the
 * difference fails, and a later hand-over waiting for staging may report it first. A trainer that goes on with the
 * step must still see strata_step fail; the first failure is noted, not returned. */
#define HAND_OVER(call)                                                     \
    do {                                                                    \
        if (!differ) {                                                      \
            CHECK(call);                                                    \
        } else if ((call) != STRATA_OK && !*met) {                          \
            snprintf(met, sizeof met, "%s", strata_last_error(e));          \
        }                                                                   \
    } while (0)

strata_status synth_train(const synth_opts *o, const strata_config *cfg, float **weights, size_t *n_out,
                          double *losses, strata_stats *stats)
{
    strata_engine *e = NULL;
    strata_status st;
    int L = o->layers, B = o->batch;
    strata_module_id mod[SYNTH_MAX_LAYERS];
    strata_param_id W[SYNTH_MAX_LAYERS], b[SYNTH_MAX_LAYERS];
    float *act[SYNTH_MAX_LAYERS + 1] = {0}, *delta = NULL, *target = NULL;
    float *wf = NULL, *bf = NULL, *gwf = NULL, *gbf = NULL; /* one layer in fp32 */
    size_t maxw = 0;
    *weights = NULL;
    strata_dtype dt = cfg->param_dtype;

    CHECK(build(o, cfg, &e, mod, W, b));
    if (o->declare_order) {
        strata_module_id order[2 * SYNTH_MAX_LAYERS];
        for (int l = 0; l < L; l++) {
            order[l] = mod[l];
            order[L + l] = mod[L - 1 - l];
        }
        CHECK(strata_module_order(e, order, (size_t)(2 * L)));
    }
    for (int l = 0; l <= L; l++)
        maxw = o->width[l] > (int)maxw ? (size_t)o->width[l] : maxw;
    for (int l = 0; l <= L; l++)
        act[l] = calloc((size_t)B * o->width[l], sizeof(float));
    delta = calloc((size_t)B * maxw * 2, sizeof(float));
    wf = calloc(maxw * maxw, sizeof(float));
    bf = calloc(maxw, sizeof(float));
    gwf = calloc(maxw * maxw, sizeof(float));
    gbf = calloc(maxw, sizeof(float));
    target = calloc((size_t)B * o->width[L], sizeof(float));

    if (o->load_dir)
        CHECK(strata_load(e, o->load_dir));
    bool differed = false;
    char met[1024] = ""; /* a hand-over's failure in the step that differs */
    for (int s = o->first_step; s < o->first_step + o->steps; s++) {
        double loss = 0;
        int world = o->comm ? strata_comm_size(o->comm) : 1, rank = o->comm ? strata_comm_rank(o->comm) : 0;
        strata_step_args args = {.lr = o->lr_decay > 0 ? cfg->lr * pow(o->lr_decay, s) : 0};
        if (o->groups && o->lr_decay > 0) { /* each group's lr follows the schedule from its own */
            args.lr = 0;
            for (int g = 0; g <= o->groups->n; g++) {
                strata_group_hparams hp;
                CHECK(strata_group_get(e, (strata_group_id)g, &hp));
                hp.lr = (g == 0 ? (double)cfg->lr : o->groups->hp[g - 1].lr) * pow(o->lr_decay, s);
                CHECK(strata_group_set(e, (strata_group_id)g, &hp));
            }
        }
        bool differ = cfg->norm_pass && !differed && o->norm_pass_differ_at == s - o->first_step + 1;
        /* Required with strata.step_in_backward (the updates run during backward), a no-op otherwise. */
        CHECK(strata_step_begin(e, &args));
        /* With strata.norm_pass, pass 0 only measures the gradient norm. */
        for (int pass = cfg->norm_pass ? 0 : 1; pass < 2; pass++) {
            if (pass == 1 && cfg->norm_pass)
                CHECK(strata_norm_pass_end(e, NULL));
            loss = 0;
            for (int mb = 0; mb < o->micro_batches; mb++) {
                synth_batch(o, s, mb * world + rank, act[0], target);
                float scale = (float)strata_loss_scale(e);
                if (o->diverge_at_step == s + 1 && mb == 0 && L > 1) {
                    /* Touch the last layer first: the recorded order no longer holds. */
                    CHECK(strata_fetch(e, mod[L - 1]));
                    CHECK(strata_release(e, mod[L - 1]));
                }
                for (int l = 0; l < L; l++) {
                    size_t nw = (size_t)o->width[l + 1] * o->width[l], nb = (size_t)o->width[l + 1];
                    CHECK(strata_fetch(e, mod[l]));
                    const void *w = strata_param_data(e, W[l]), *bb = strata_param_data(e, b[l]);
                    if (!w || !bb) {
                        st = STRATA_ESTATE;
                        goto out;
                    }
                    load_all(w, dt, wf, nw);
                    load_all(bb, dt, bf, nb);
                    synth_layer_forward(o, l, wf, bf, act[l], act[l + 1]);
                    CHECK(strata_release(e, mod[l]));
                }
                float *dcur = delta, *dnext = delta + (size_t)B * maxw;
                loss += synth_loss_grad(o, act[L], target, scale, dcur);
                for (int l = L - 1; l >= 0; l--) {
                    size_t nw = (size_t)o->width[l + 1] * o->width[l], nb = (size_t)o->width[l + 1];
                    CHECK(strata_fetch(e, mod[l]));
                    const void *w = strata_param_data(e, W[l]);
                    bool frozen = o->frozen_layers >> l & 1;
                    void *gw = frozen ? NULL : strata_grad_data(e, W[l]), *gb = frozen ? NULL : strata_grad_data(e, b[l]);
                    if (!w || (!frozen && (!gw || !gb))) {
                        st = STRATA_ESTATE;
                        goto out;
                    }
                    load_all(w, dt, wf, nw);
                    synth_layer_backward(o, l, wf, act[l], act[l + 1], dcur, dnext, gwf, gbf);
                    if (frozen) { /* the input's gradient only */
                        float *t = dcur;
                        dcur = dnext;
                        dnext = t;
                        CHECK(strata_release(e, mod[l]));
                        continue;
                    }
                    if (o->exact_sums) {
                        exact_grid(gwf, nw);
                        exact_grid(gbf, nb);
                    }
                    if (differ && pass == 1 && l == L - 1)
                        gbf[0] = gbf[0] * 2 + 0.25f;
                    store_all(gw, dt, gwf, nw);
                    store_all(gb, dt, gbf, nb);
                    float *t = dcur;
                    dcur = dnext;
                    dnext = t;
                    HAND_OVER(strata_grads_ready(e, mod[l]));
                    HAND_OVER(strata_release(e, mod[l]));
                }
            }
        }
        strata_step_result res;
        if (differ) {
            st = strata_step(e, &args, &res);
            if (o->norm_pass_error)
                snprintf(o->norm_pass_error, 1024, "strata_step: %s; the hand-overs: %s",
                         st == STRATA_OK ? "succeeded" : strata_last_error(e), *met ? met : "all succeeded");
            differed = true;
            s--; /* again, unchanged */
            continue;
        }
        CHECK(strata_step(e, &args, &res));
        if (o->grad_norms)
            o->grad_norms[s - o->first_step] = res.grad_norm;
        if (o->save_dir && s + 1 == o->save_after)
            CHECK(strata_save(e, o->save_dir));
        if (losses)
            losses[s - o->first_step] = loss / o->micro_batches;
    }
    if (stats) { /* the training's counters, its last (delayed) update published: reading the weights back below
                  * is the test's, not training */
        CHECK(strata_sync(e));
        CHECK(strata_stats_get(e, stats));
    }
    size_t total = 0;
    for (int l = 0; l < L; l++)
        total += (size_t)o->width[l + 1] * o->width[l] + o->width[l + 1];
    float *wout = malloc(total * sizeof(float));
    *weights = wout; /* owned by the caller from here on, freed below on failure */
    size_t pos = 0;
    for (int l = 0; l < L && wout; l++) {
        size_t nw = (size_t)o->width[l + 1] * o->width[l], nb = (size_t)o->width[l + 1];
        CHECK(strata_param_read_master(e, W[l], 0, nw, wout + pos));
        pos += nw;
        CHECK(strata_param_read_master(e, b[l], 0, nb, wout + pos));
        pos += nb;
    }
    *n_out = total;
    if (o->final_loss_scale)
        *o->final_loss_scale = strata_loss_scale(e);

out:
    if (st != STRATA_OK) {
        fprintf(stderr, "synth_train: %s: %s\n", strata_status_name(st), e ? strata_last_error(e) : strata_last_error(NULL));
        if (*weights) {
            free(*weights);
            *weights = NULL;
        }
    }
    for (int l = 0; l <= L; l++)
        free(act[l]);
    free(delta);
    free(target);
    free(wf);
    free(bf);
    free(gwf);
    free(gbf);
    strata_engine_destroy(e);
    return st;
}
