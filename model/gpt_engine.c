/* The GPT model as a strata trainer: registration, the engine-backed gpt_source and dtype conversion. */
#include "model/gpt_engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct param_ctx {
    const gpt_dims *d;
    uint64_t seed;
    int module, index;
    size_t first; /* a tile's first element of the whole parameter (gpt_init_fill numbers those) */
} param_ctx;

/* One engine module of the model, a module of the source's numbering (gpt_source): a module of gpt.h with its
 * parameters, or with the token embedding in tiles, module 0 with wpe alone and each tile (L + 2 + t) with its rows
 * of wte. Its parameters are slots slot0 .. slot0 + np - 1 of params[] / grads[]; the arrays are indexed by slot. */
typedef struct unit {
    strata_module_id mod;
    int module;                  /* its module in gpt.h's numbering (a tile's is 0) */
    int slot0, np;
    strata_param_id param[GPT_MAX_MODULE_PARAMS];
    size_t numel[GPT_MAX_MODULE_PARAMS];
    size_t flat[GPT_MAX_MODULE_PARAMS]; /* the parameter's first element in gpt_flat's layout */
    size_t conv;                 /* where its fp32 copies start in conv_w and conv_g: a tile's follow wpe's, whose
                                    module is held while the tiles' forward reads both */
    param_ctx ctx[GPT_MAX_MODULE_PARAMS];
} unit;

struct gpt_model {
    strata_engine *e;
    gpt_dims d;
    uint64_t seed;
    int nunits;                /* gpt_modules(d) + gpt_head_tiles(d) */
    unit *unit;
    strata_param_id *wte_parts; /* the token embedding's parameters in row order: the whole one, or each tile's */
    int nwte_parts;
    void *mem;                 /* strata_device_alloc'd: the pass's activations, then the fp32 conversion buffers */
    const gpt_ops *ops;        /* the kernels of the engine's backend */
    gpt_ops *cuda_ops;         /* owned when the backend is CUDA */
    gpt_pass *pass;            /* the nets of the micro-batches that go through the modules together */
    gpt_keeper keeper;         /* GPT_ACT_OFFLOAD: the block inputs go to strata_act_push */
    strata_dtype dtype;
    gpt_act_format acts; /* the kernels' format: their weights are gpt_act_weight_dtype(acts) */
    float *conv_w, *conv_g; /* fp32 copies of the weights of the units held (when the kernels read fp32 and
                               param_dtype is not) and of one unit's gradients (when param_dtype is not fp32) */
    float *capture;
    void *capture_raw;         /* host copies of one parameter's gradients for capture */
    float *capture_f32;
    const char *start_error;   /* why the kernels could not start (gpt_model_prepare), or NULL */
};

/* The units of a model of d, as gpt_model_register lays them out (without engine ids): the largest parameter and
 * the floats of conversion copies the most held at once need. */
static void unit_sizes(const gpt_dims *d, size_t *largest_param, size_t *conv_floats)
{
    *largest_param = 0, *conv_floats = 0;
    for (int m = 0; m < gpt_modules(d); m++) {
        size_t sizes[GPT_MAX_MODULE_PARAMS], sum = 0;
        int np = gpt_module_param_sizes(d, m, sizes);
        for (int k = m == 0 && d->head_rows ? GPT_WPE : 0; k < np; k++) {
            sum += sizes[k];
            *largest_param = sizes[k] > *largest_param ? sizes[k] : *largest_param;
        }
        *conv_floats = sum > *conv_floats ? sum : *conv_floats;
    }
    if (d->head_rows) {
        size_t tile = (size_t)d->head_rows * (size_t)d->hidden, wpe = (size_t)d->seq * (size_t)d->hidden;
        *largest_param = tile > *largest_param ? tile : *largest_param;
        *conv_floats = wpe + tile > *conv_floats ? wpe + tile : *conv_floats;
    }
}

strata_status gpt_engine_acts(strata_backend_kind backend, strata_dtype param_dtype, gpt_act_format *out,
                              const char **why)
{
    *out = GPT_ACTS_FP32;
    *why = "";
    const char *v = getenv("STRATA_MODEL_ACTS");
    if (!v || strcmp(v, "fp32") == 0)
        return STRATA_OK;
    if (strcmp(v, "bf16") != 0) {
        *why =
            "STRATA_MODEL_ACTS must be \"fp32\" (fp32 activations, the default) or \"bf16\" (bf16 activations end to "
            "end, CUDA only)";
        return STRATA_EINVAL;
    }
    if (backend != STRATA_BACKEND_CUDA) {
        *why = "STRATA_MODEL_ACTS=bf16 needs the CUDA backend (--device cuda); the host computes in fp32: unset it";
        return STRATA_EINVAL;
    }
    if (param_dtype != STRATA_DTYPE_BF16) {
        *why = "STRATA_MODEL_ACTS=bf16 reads the weights in place and needs bf16 parameters (param_dtype bf16, "
               "--dtype bf16)";
        return STRATA_EINVAL;
    }
    *out = GPT_ACTS_BF16;
    return STRATA_OK;
}

gpt_act_format gpt_engine_config_acts(const strata_config *cfg)
{
    gpt_act_format fmt;
    const char *why;
    return gpt_engine_acts(cfg->backend, cfg->param_dtype, &fmt, &why) == STRATA_OK ? fmt : GPT_ACTS_FP32;
}

/* The fp32 buffers the model converts through: the weights of the units held when the table reads another dtype
 * than the engine stores, and one unit's gradients when the engine stores them in another dtype than fp32. */
static size_t conversion_floats(const gpt_dims *d, gpt_act_format fmt, strata_dtype param_dtype)
{
    size_t largest, conv, n = 0;
    unit_sizes(d, &largest, &conv);
    if (param_dtype != gpt_act_weight_dtype(fmt))
        n += conv;
    if (param_dtype != STRATA_DTYPE_FP32)
        n += conv;
    return n;
}

size_t gpt_engine_activation_bytes(const gpt_dims *d, int batch, int seq, int micro_batches, gpt_act_mode mode,
                                   gpt_act_format fmt, strata_dtype param_dtype)
{
    return gpt_pass_bytes(d, batch, seq, micro_batches, mode, fmt).total +
           conversion_floats(d, fmt, param_dtype) * sizeof(float) + gpt_ops_workspace_bytes(fmt);
}

void gpt_engine_offload_bytes(const gpt_dims *d, int batch, int seq, int micro_batches, gpt_act_format fmt,
                              size_t *kept, size_t *largest)
{
    size_t one = gpt_block_input_bytes(d, batch, seq, fmt);
    *largest = one;
    *kept = (size_t)micro_batches * (size_t)d->layers * ((one + GPT_ACT_PAGE - 1) / GPT_ACT_PAGE * GPT_ACT_PAGE);
}

void gpt_engine_reserve(const gpt_dims *d, int batch, int seq, int micro_batches, gpt_act_mode mode,
                        strata_config *cfg)
{
    gpt_act_format fmt = gpt_engine_config_acts(cfg);
    size_t act = gpt_engine_activation_bytes(d, batch, seq, micro_batches, mode, fmt, cfg->param_dtype), kept, largest;
    cfg->activation_bytes = act > cfg->activation_bytes ? act : cfg->activation_bytes;
    if (mode != GPT_ACT_OFFLOAD)
        return;
    gpt_engine_offload_bytes(d, batch, seq, micro_batches, fmt, &kept, &largest);
    cfg->offloaded_activation_bytes = kept > cfg->offloaded_activation_bytes ? kept : cfg->offloaded_activation_bytes;
    cfg->offloaded_activation_max_bytes = largest > cfg->offloaded_activation_max_bytes
                                              ? largest
                                              : cfg->offloaded_activation_max_bytes;
}

/* The least device memory the plan gives a model whose largest module has big parameter bytes: that module in use
 * and the next one fetched ahead, and one module's gradient buffers (engine/plan/plan.c: "fetched modules + prefetch
 * window" is at least twice the largest), besides the activations. */
static size_t least_device_bytes(size_t big, size_t activations)
{
    return 3 * big + activations;
}

int gpt_engine_head_rows(const gpt_dims *d, int batch, int seq, gpt_act_mode mode, const strata_config *cfg,
                         gpt_head_need *need)
{
    gpt_dims t = *d;
    t.head_rows = 0;
    gpt_act_format fmt = gpt_engine_config_acts(cfg);
    size_t pb = strata_dtype_bytes(cfg->param_dtype), C = (size_t)d->hidden, block = 0;
    for (int m = 1; m < gpt_modules(d); m++)
        block = gpt_module_numel(d, m) > block ? gpt_module_numel(d, m) : block;
    size_t emb = gpt_module_numel(d, 0);
    need->whole = least_device_bytes((emb > block ? emb : block) * pb,
                                     gpt_engine_activation_bytes(&t, batch, seq, 1, mode, fmt, cfg->param_dtype));
    need->tiled = 0;
    size_t budget = cfg->device_budget_bytes;
    if (!budget || need->whole <= budget || emb <= block || d->vocab <= GPT_HEAD_PIECE)
        return 0; /* no budget given (all free device memory), or the embedding is not what does not fit */
    /* Tiles no larger than a block (smaller ones would not lower the plan's largest module), and as large as the
     * budget allows; one piece at the least (the plan then says what does not fit). */
    int pieces = (int)(block / C / GPT_HEAD_PIECE), most = (d->vocab - 1) / GPT_HEAD_PIECE;
    pieces = pieces < most ? pieces : most;
    for (;; pieces--) {
        t.head_rows = (pieces > 1 ? pieces : 1) * GPT_HEAD_PIECE;
        size_t tile = (size_t)t.head_rows * C;
        size_t acts = gpt_engine_activation_bytes(&t, batch, seq, 1, mode, fmt, cfg->param_dtype);
        need->tiled = least_device_bytes((tile > block ? tile : block) * pb, acts);
        if (pieces <= 1 || need->tiled <= budget)
            return t.head_rows;
    }
}

static strata_status keeper_push(void *ctx, const void *src, size_t bytes, uint64_t *handle)
{
    gpt_model *m = ctx;
    strata_act a;
    strata_status st = strata_act_push(m->e, src, bytes, &a);
    *handle = a;
    return st;
}

static strata_status keeper_pop(void *ctx, uint64_t handle, const void **out)
{
    gpt_model *m = ctx;
    return strata_act_pop(m->e, handle, out);
}

static strata_status keeper_drop(void *ctx, uint64_t handle)
{
    gpt_model *m = ctx;
    return strata_act_drop(m->e, handle);
}

static strata_status init_param(void *vctx, strata_param_id param, size_t offset, size_t count, float *out)
{
    (void)param;
    const param_ctx *c = vctx;
    /* Billions of elements at start-up for the large presets: worth the cores, in pieces of whole vector loops. */
    enum { PIECE = 16384 };
    long pieces = (long)((count + PIECE - 1) / PIECE);
#pragma omp parallel for schedule(static) if (pieces > 4)
    for (long k = 0; k < pieces; k++) {
        size_t at = (size_t)k * PIECE, n = count - at < PIECE ? count - at : PIECE;
        gpt_init_fill(c->d, c->seed, c->module, c->index, c->first + offset + at, n, out + at);
    }
    return STRATA_OK;
}

/* Adds parameter slot k of unit u (module u->module's parameter k, or its elements [first, first + numel)). */
static strata_status add_param(gpt_model *m, unit *u, int k, size_t first, size_t numel, size_t flat)
{
    strata_engine *e = m->e;
    u->ctx[k] = (param_ctx){&m->d, m->seed, u->module, k, first};
    u->numel[k] = numel;
    u->flat[k] = flat + first;
    strata_status st = strata_param_add(e, u->mod, gpt_param_name(&m->d, u->module, k), numel, init_param,
                                        &u->ctx[k], &u->param[k]);
    int64_t dims[2];
    int ndim = gpt_param_shape(&m->d, u->module, k, dims);
    if (st != STRATA_OK)
        return st;
    if (u->module == 0 && k == GPT_WTE && m->d.head_rows) {
        /* one tensor wherever strata names tensors: checkpoints, export, loads (the whole one's name) */
        char tensor[64];
        snprintf(tensor, sizeof tensor, "embeddings.%s", gpt_param_name(&m->d, 0, GPT_WTE));
        return strata_param_set_part(e, u->param[k], tensor, first, ndim, dims);
    }
    return strata_param_set_shape(e, u->param[k], ndim, dims); /* `strata ckpt export` writes it in its shape */
}

/* Module (gpt.h's numbering) as unit module, or its tiles: the token embedding's tiles come first, so the
 * parameters lie in the engine in the order they have whole (wte, then wpe). */
static strata_status add_module(gpt_model *m, int module, size_t flat)
{
    const gpt_dims *d = &m->d;
    size_t sizes[GPT_MAX_MODULE_PARAMS];
    int np = gpt_module_param_sizes(d, module, sizes), k0 = 0;
    strata_status st;
    if (module == 0 && d->head_rows) {
        for (int t = 0; t < gpt_head_tiles(d); t++) {
            unit *u = &m->unit[d->layers + 2 + t];
            char name[48];
            int v0, v1;
            gpt_head_tile_rows(d, t, &v0, &v1);
            snprintf(name, sizeof name, "embeddings.wte[%d:%d]", v0, v1);
            *u = (unit){.module = 0, .slot0 = GPT_WTE, .np = 1, .conv = sizes[GPT_WPE]};
            size_t C = (size_t)d->hidden;
            if ((st = strata_module_add(m->e, name, &u->mod)) != STRATA_OK ||
                (st = add_param(m, u, GPT_WTE, (size_t)v0 * C, (size_t)(v1 - v0) * C, flat)) != STRATA_OK)
                return st;
            m->wte_parts[t] = u->param[GPT_WTE];
        }
        k0 = GPT_WPE;
    }
    char name[32];
    if (module == 0)
        snprintf(name, sizeof name, "embeddings");
    else if (module == d->layers + 1)
        snprintf(name, sizeof name, "ln_f");
    else
        snprintf(name, sizeof name, "block%d", module - 1);
    unit *u = &m->unit[module];
    *u = (unit){.module = module, .slot0 = k0, .np = np - k0};
    if ((st = strata_module_add(m->e, name, &u->mod)) != STRATA_OK)
        return st;
    for (int k = 0; k < np; flat += sizes[k], k++)
        if (k >= k0 && (st = add_param(m, u, k, 0, sizes[k], flat)) != STRATA_OK)
            return st;
    if (module == 0 && !d->head_rows)
        m->wte_parts[0] = u->param[GPT_WTE];
    return STRATA_OK;
}

strata_status gpt_model_register(strata_engine *e, const gpt_dims *d, uint64_t seed, gpt_model **out)
{
    *out = NULL;
    if (gpt_dims_check(d))
        return STRATA_EINVAL;
    gpt_model *m = calloc(1, sizeof *m);
    if (!m)
        return STRATA_ENOMEM;
    m->e = e;
    m->d = *d;
    m->seed = seed;
    m->nunits = gpt_modules(d) + gpt_head_tiles(d);
    m->nwte_parts = d->head_rows ? gpt_head_tiles(d) : 1;
    m->unit = calloc((size_t)m->nunits, sizeof *m->unit);
    m->wte_parts = calloc((size_t)m->nwte_parts, sizeof *m->wte_parts);
    strata_status st = STRATA_ENOMEM;
    if (!m->unit || !m->wte_parts)
        goto fail;
    size_t flat = 0;
    for (int i = 0; i < gpt_modules(d); flat += gpt_module_numel(d, i), i++)
        if ((st = add_module(m, i, flat)) != STRATA_OK)
            goto fail;
    *out = m;
    return STRATA_OK;
fail:
    gpt_model_destroy(m);
    return st;
}

strata_param_id gpt_model_param(const gpt_model *m, int module, int index)
{
    if (module == 0 && index == GPT_WTE)
        return m->d.head_rows ? STRATA_INVALID_ID : m->wte_parts[0];
    return m->unit[module].param[index];
}

int gpt_model_param_parts(const gpt_model *m, int module, int index, const strata_param_id **parts)
{
    if (module == 0 && index == GPT_WTE) {
        *parts = m->wte_parts;
        return m->nwte_parts;
    }
    *parts = &m->unit[module].param[index];
    return 1;
}

strata_engine *gpt_model_engine(const gpt_model *m)
{
    return m->e;
}

const gpt_dims *gpt_model_dims(const gpt_model *m)
{
    return &m->d;
}

strata_status gpt_model_set_decay_groups(gpt_model *m, bool embeddings, strata_group_id decay,
                                         strata_group_id no_decay)
{
    strata_status st = STRATA_OK;
    for (int i = 0; i < m->nunits && st == STRATA_OK; i++) {
        const unit *u = &m->unit[i];
        for (int k = u->slot0; k < u->slot0 + u->np && st == STRATA_OK; k++)
            st = strata_param_set_group(m->e, u->param[k],
                                        gpt_param_decays(&m->d, u->module, k, embeddings) ? decay : no_decay);
    }
    return st;
}

/* The fetches of the token embedding's tiles in order, repeated reps times, at order + *k. */
static void order_tiles(const gpt_model *m, strata_module_id *order, size_t *k, int reps)
{
    int L = m->d.layers, tiles = gpt_head_tiles(&m->d);
    for (int r = 0; r < reps; r++)
        for (int t = 0; t < tiles; t++)
            order[(*k)++] = m->unit[L + 2 + t].mod;
}

strata_status gpt_model_declare_order(gpt_model *m)
{
    int n = gpt_modules(&m->d); /* L + 2 */
    /* The passes (gpt_pass.c): forward 0..n-1 (with tiles, each tile inside module 0's), the head (module 0, or the
     * tiles three times: max, sum, gradient), backward n-1..0 (with tiles, each tile after module 0's). */
    strata_module_id *order = malloc((size_t)(2 * n + 1 + 5 * gpt_head_tiles(&m->d)) * sizeof *order);
    if (!order)
        return STRATA_ENOMEM;
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        order[k++] = m->unit[i].mod;
        if (i == 0)
            order_tiles(m, order, &k, 1);
    }
    if (m->d.head_rows)
        order_tiles(m, order, &k, 3);
    else
        order[k++] = m->unit[0].mod;
    for (int i = n - 1; i >= 0; i--)
        order[k++] = m->unit[i].mod;
    order_tiles(m, order, &k, 1);
    strata_status st = strata_module_order(m->e, order, k);
    free(order);
    return st;
}

/* ---------------------------------------------------------------- the engine source */

/* Points grads[k] at unit module's gradient buffers for the network: strata's own when param_dtype is fp32, else the
 * fp32 conversion buffers, zeroed as strata zeroes its own (the kernels' gradients are fp32 in every format). */
static strata_status take_grads(gpt_model *m, int module, float **grads)
{
    const unit *u = &m->unit[module];
    size_t pos = 0;
    for (int k = u->slot0; k < u->slot0 + u->np; pos += u->numel[k], k++) {
        void *g = strata_grad_data(m->e, u->param[k]);
        if (!g)
            return STRATA_ESTATE; /* strata_last_error(engine) has the reason */
        if (m->dtype == STRATA_DTYPE_FP32) {
            grads[k] = g;
        } else {
            grads[k] = m->conv_g + pos;
            m->ops->zero(m->ops->ctx, grads[k], u->numel[k] * sizeof(float));
        }
    }
    return STRATA_OK;
}

static strata_status engine_acquire(void *vm, int module, bool backward, void **params, float **grads)
{
    gpt_model *m = vm;
    const unit *u = &m->unit[module];
    strata_status st = strata_fetch(m->e, u->mod);
    if (st != STRATA_OK)
        return st;
    size_t pos = u->conv;
    for (int k = u->slot0; k < u->slot0 + u->np; pos += u->numel[k], k++) {
        void *p = strata_param_data(m->e, u->param[k]);
        if (!p)
            return STRATA_ESTATE;
        if (m->dtype == gpt_act_weight_dtype(m->acts)) {
            params[k] = p; /* the kernels read the engine's copy in place */
        } else {
            params[k] = m->conv_w + pos;
            m->ops->to_f32(m->ops->ctx, m->conv_w + pos, p, u->numel[k], m->dtype);
        }
    }
    return backward ? take_grads(m, module, grads) : STRATA_OK;
}

/* Adds the gradient g (param_dtype, device) as the engine will receive it into cap (fp32, host). */
static strata_status capture_add(gpt_model *m, float *cap, const void *g, size_t n)
{
    size_t esize = strata_dtype_bytes(m->dtype);
    strata_status st = m->ops->to_host(m->ops->ctx, m->capture_raw, g, n * esize);
    if (st != STRATA_OK)
        return st;
    gpt_ops_host()->to_f32(NULL, m->capture_f32, m->capture_raw, n, m->dtype);
    for (size_t i = 0; i < n; i++)
        cap[i] += m->capture_f32[i];
    return STRATA_OK;
}

/* Hands the gradients written since take_grads to strata as one contribution (converted to param_dtype first, and
 * added into the capture when a test asked for it). strata frees the buffers; the module stays held. */
static strata_status give_grads(gpt_model *m, int module)
{
    const unit *u = &m->unit[module];
    size_t pos = 0;
    for (int k = u->slot0; k < u->slot0 + u->np; pos += u->numel[k], k++) {
        void *g = strata_grad_data(m->e, u->param[k]);
        if (!g)
            return STRATA_ESTATE;
        if (m->dtype != STRATA_DTYPE_FP32)
            m->ops->from_f32(m->ops->ctx, g, m->conv_g + pos, u->numel[k], m->dtype);
        if (m->capture) {
            strata_status st = capture_add(m, m->capture + u->flat[k], g, u->numel[k]);
            if (st != STRATA_OK)
                return st;
        }
    }
    return strata_grads_ready(m->e, u->mod);
}

/* strata_grads_ready frees the module's gradient buffers and the next strata_grad_data, while the module is still
 * held, hands out new zeroed ones: each hand-over is accumulated on its own, as a fetch of its own would be. */
static strata_status engine_hand_over(void *vm, int module, float **grads)
{
    gpt_model *m = vm;
    strata_status st = give_grads(m, module);
    return st == STRATA_OK ? take_grads(m, module, grads) : st;
}

static strata_status engine_finish(void *vm, int module, bool backward)
{
    gpt_model *m = vm;
    if (backward) {
        strata_status st = give_grads(m, module);
        if (st != STRATA_OK)
            return st;
    }
    return strata_release(m->e, m->unit[module].mod);
}

/* The kernel table of the engine's backend, in the activation format m->acts, working in workspace. */
static strata_status choose_ops(gpt_model *m, strata_dtype dtype, void *workspace)
{
    if (strata_engine_backend(m->e) == STRATA_BACKEND_HOST) {
        m->ops = gpt_ops_host();
        return STRATA_OK;
    }
#ifdef STRATA_MODEL_CUDA
    const char *why = "";
    strata_status st = gpt_ops_cuda_create(strata_compute_stream(m->e), m->acts, dtype, workspace, &m->cuda_ops, &why);
    if (st != STRATA_OK) {
        m->start_error = why;
        return st;
    }
    m->ops = m->cuda_ops;
    return STRATA_OK;
#else
    (void)dtype;
    (void)workspace;
    return STRATA_EUNSUPPORTED; /* this build has no CUDA kernels */
#endif
}

strata_status gpt_model_prepare(gpt_model *m, int batch, int seq, int micro_batches, gpt_act_mode mode,
                                strata_dtype dtype)
{
    if (micro_batches < 1)
        return STRATA_EINVAL;
    strata_status st = gpt_engine_acts(strata_engine_backend(m->e), dtype, &m->acts, &m->start_error);
    if (st != STRATA_OK)
        return st;
    m->start_error = NULL;
    /* The block: the pass's activations (a multiple of 4 KiB), the kernels' workspace, the conversion buffers. */
    size_t act = gpt_pass_bytes(&m->d, batch, seq, micro_batches, mode, m->acts).total;
    size_t bytes = gpt_engine_activation_bytes(&m->d, batch, seq, micro_batches, mode, m->acts, dtype);
    if ((st = strata_device_alloc(m->e, bytes, &m->mem)) != STRATA_OK)
        return st;
    m->dtype = dtype;
    void *workspace = gpt_ops_workspace_bytes(m->acts) ? (char *)m->mem + act : NULL;
    float *conv = (float *)((char *)m->mem + act + gpt_ops_workspace_bytes(m->acts));
    size_t largest, conv_floats;
    unit_sizes(&m->d, &largest, &conv_floats);
    if (dtype != gpt_act_weight_dtype(m->acts)) {
        m->conv_w = conv;
        conv += conv_floats;
    }
    if (dtype != STRATA_DTYPE_FP32) {
        m->conv_g = conv;
        conv += conv_floats;
    }
    if ((st = choose_ops(m, dtype, workspace)) != STRATA_OK)
        return st;
    if (m->d.head_rows && !m->ops->head_tile) {
        m->start_error = "the token embedding in vocabulary tiles has no kernels in this table (the CUDA ones compute it "
                         "whole): give the device budget room for the whole embedding";
        return STRATA_EINVAL;
    }
    if (m->d.head_rows && micro_batches > 1) {
        m->start_error = "the token embedding in vocabulary tiles goes through a pass one micro-batch at a time: use "
                         "the ordinary schedule";
        return STRATA_EINVAL;
    }
    m->keeper = (gpt_keeper){.push = keeper_push, .pop = keeper_pop, .drop = keeper_drop, .ctx = m};
    return gpt_pass_create(&m->d, batch, seq, micro_batches, mode, mode == GPT_ACT_OFFLOAD ? &m->keeper : NULL,
                           m->ops, m->mem, act, &m->pass);
}

strata_status gpt_model_micro_step(gpt_model *m, const int32_t *tokens, const int32_t *targets, bool backward,
                                   float grad_scale, double *loss)
{
    return gpt_model_pass(m, 1, tokens, targets, backward, grad_scale, loss);
}

strata_status gpt_model_pass(gpt_model *m, int count, const int32_t *tokens, const int32_t *targets, bool backward,
                             float grad_scale, double *losses)
{
    gpt_source src = {.acquire = engine_acquire, .hand_over = engine_hand_over, .finish = engine_finish, .ctx = m};
    return gpt_pass_step(m->pass, count, &src, tokens, targets, backward, grad_scale, losses);
}

const char *gpt_model_error(gpt_model *m)
{
    if (m->start_error)
        return m->start_error;
    return m->ops ? m->ops->error(m->ops->ctx) : "";
}

strata_status gpt_model_capture_grads(gpt_model *m, float *capture)
{
    if (capture && !m->capture_raw) {
        size_t n, conv_floats;
        unit_sizes(&m->d, &n, &conv_floats);
        m->capture_raw = malloc(n * sizeof(float));
        m->capture_f32 = malloc(n * sizeof(float));
        if (!m->capture_raw || !m->capture_f32)
            return STRATA_ENOMEM;
    }
    m->capture = capture;
    return STRATA_OK;
}

strata_status gpt_model_read_weights(gpt_model *m, float *out)
{
    strata_status st = strata_sync(m->e);
    for (int i = 0; i < m->nunits && st == STRATA_OK; i++) {
        const unit *u = &m->unit[i];
        for (int k = u->slot0; k < u->slot0 + u->np && st == STRATA_OK; k++)
            st = strata_param_read_master(m->e, u->param[k], 0, u->numel[k], out + u->flat[k]);
    }
    return st;
}

void gpt_model_destroy(gpt_model *m)
{
    if (!m)
        return;
    gpt_pass_destroy(m->pass);
#ifdef STRATA_MODEL_CUDA
    gpt_ops_cuda_destroy(m->cuda_ops); /* first: it drains the stream that still uses the workspace in mem */
#endif
    if (m->mem)
        strata_device_free(m->e, m->mem);
    free(m->capture_raw);
    free(m->capture_f32);
    free(m->unit);
    free(m->wte_parts);
    free(m);
}
