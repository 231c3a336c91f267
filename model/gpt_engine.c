/* The GPT model as a strata trainer: registration, the engine-backed gpt_source and dtype conversion. */
#include "model/gpt_engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct param_ctx {
    const gpt_dims *d;
    uint64_t seed;
    int module, index;
} param_ctx;

struct gpt_model {
    strata_engine *e;
    gpt_dims d;
    uint64_t seed;
    int nmodules;
    strata_module_id *mod;
    strata_param_id (*param)[GPT_MAX_MODULE_PARAMS];
    param_ctx (*ctx)[GPT_MAX_MODULE_PARAMS];
    size_t *flat_offset;       /* the module's first element in gpt_flat's layout */
    void *mem;                 /* strata_device_alloc'd: the pass's activations, then the fp32 conversion buffers */
    const gpt_ops *ops;        /* the kernels of the engine's backend */
    gpt_ops *cuda_ops;         /* owned when the backend is CUDA */
    gpt_pass *pass;            /* the nets of the micro-batches that go through the modules together */
    gpt_keeper keeper;         /* GPT_ACT_OFFLOAD: the block inputs go to strata_act_push */
    strata_dtype dtype;
    gpt_act_format acts; /* the kernels' format: their weights are gpt_act_weight_dtype(acts) */
    float *conv_w, *conv_g; /* fp32 copies of one module's weights (when the kernels read fp32 and param_dtype is
                               not) and gradients (when param_dtype is not fp32) */
    float *capture;
    void *capture_raw;         /* host copies of one module's gradients for capture */
    float *capture_f32;
    const char *start_error;   /* why the kernels could not start (gpt_model_prepare), or NULL */
};

static size_t max_module_numel(const gpt_dims *d)
{
    size_t best = 0;
    for (int m = 0; m < gpt_modules(d); m++) {
        size_t n = gpt_module_numel(d, m);
        best = n > best ? n : best;
    }
    return best;
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

/* The fp32 buffers of one module that the model converts through: its weights when the table reads another dtype
 * than the engine stores, and its gradients when the engine stores them in another dtype than fp32. */
static size_t conversion_floats(const gpt_dims *d, gpt_act_format fmt, strata_dtype param_dtype)
{
    size_t n = 0;
    if (param_dtype != gpt_act_weight_dtype(fmt))
        n += max_module_numel(d);
    if (param_dtype != STRATA_DTYPE_FP32)
        n += max_module_numel(d);
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
        gpt_init_fill(c->d, c->seed, c->module, c->index, offset + at, n, out + at);
    }
    return STRATA_OK;
}

strata_status gpt_model_register(strata_engine *e, const gpt_dims *d, uint64_t seed, gpt_model **out)
{
    *out = NULL;
    gpt_model *m = calloc(1, sizeof *m);
    if (!m)
        return STRATA_ENOMEM;
    m->e = e;
    m->d = *d;
    m->seed = seed;
    m->nmodules = gpt_modules(d);
    m->mod = calloc((size_t)m->nmodules, sizeof *m->mod);
    m->param = calloc((size_t)m->nmodules, sizeof *m->param);
    m->ctx = calloc((size_t)m->nmodules, sizeof *m->ctx);
    m->flat_offset = calloc((size_t)m->nmodules, sizeof *m->flat_offset);
    strata_status st = STRATA_ENOMEM;
    if (!m->mod || !m->param || !m->ctx || !m->flat_offset)
        goto fail;
    size_t pos = 0;
    for (int i = 0; i < m->nmodules; i++) {
        char name[32];
        if (i == 0)
            snprintf(name, sizeof name, "embeddings");
        else if (i == d->layers + 1)
            snprintf(name, sizeof name, "ln_f");
        else
            snprintf(name, sizeof name, "block%d", i - 1);
        if ((st = strata_module_add(e, name, &m->mod[i])) != STRATA_OK)
            goto fail;
        m->flat_offset[i] = pos;
        size_t sizes[GPT_MAX_MODULE_PARAMS];
        int np = gpt_module_param_sizes(d, i, sizes);
        for (int k = 0; k < np; k++) {
            m->ctx[i][k] = (param_ctx){&m->d, seed, i, k};
            st = strata_param_add(e, m->mod[i], gpt_param_name(d, i, k), sizes[k], init_param, &m->ctx[i][k],
                                  &m->param[i][k]);
            int64_t dims[2];
            int ndim = gpt_param_shape(d, i, k, dims);
            if (st == STRATA_OK) /* checkpoints record it: `strata ckpt export` writes each tensor in its shape */
                st = strata_param_set_shape(e, m->param[i][k], ndim, dims);
            if (st != STRATA_OK)
                goto fail;
            pos += sizes[k];
        }
    }
    *out = m;
    return STRATA_OK;
fail:
    gpt_model_destroy(m);
    return st;
}

strata_param_id gpt_model_param(const gpt_model *m, int module, int index)
{
    return m->param[module][index];
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
    for (int i = 0; i < m->nmodules && st == STRATA_OK; i++) {
        size_t sizes[GPT_MAX_MODULE_PARAMS];
        int np = gpt_module_param_sizes(&m->d, i, sizes);
        for (int k = 0; k < np && st == STRATA_OK; k++)
            st = strata_param_set_group(m->e, m->param[i][k],
                                        gpt_param_decays(&m->d, i, k, embeddings) ? decay : no_decay);
    }
    return st;
}

strata_status gpt_model_declare_order(gpt_model *m)
{
    int n = m->nmodules; /* L + 2 */
    strata_module_id *order = malloc((size_t)(2 * n + 1) * sizeof *order);
    if (!order)
        return STRATA_ENOMEM;
    size_t k = 0;
    for (int i = 0; i < n; i++)
        order[k++] = m->mod[i];
    order[k++] = m->mod[0];
    for (int i = n - 1; i >= 0; i--)
        order[k++] = m->mod[i];
    strata_status st = strata_module_order(m->e, order, k);
    free(order);
    return st;
}

/* ---------------------------------------------------------------- the engine source */

/* Points grads[k] at module's gradient buffers for the network: strata's own when param_dtype is fp32, else the
 * fp32 conversion buffers, zeroed as strata zeroes its own (the kernels' gradients are fp32 in every format). */
static strata_status take_grads(gpt_model *m, int module, float **grads)
{
    size_t sizes[GPT_MAX_MODULE_PARAMS], pos = 0;
    int np = gpt_module_param_sizes(&m->d, module, sizes);
    for (int k = 0; k < np; k++) {
        void *g = strata_grad_data(m->e, m->param[module][k]);
        if (!g)
            return STRATA_ESTATE; /* strata_last_error(engine) has the reason */
        if (m->dtype == STRATA_DTYPE_FP32) {
            grads[k] = g;
        } else {
            grads[k] = m->conv_g + pos;
            m->ops->zero(m->ops->ctx, grads[k], sizes[k] * sizeof(float));
        }
        pos += sizes[k];
    }
    return STRATA_OK;
}

static strata_status engine_acquire(void *vm, int module, bool backward, void **params, float **grads)
{
    gpt_model *m = vm;
    strata_status st = strata_fetch(m->e, m->mod[module]);
    if (st != STRATA_OK)
        return st;
    size_t sizes[GPT_MAX_MODULE_PARAMS], pos = 0;
    int np = gpt_module_param_sizes(&m->d, module, sizes);
    for (int k = 0; k < np; k++) {
        void *p = strata_param_data(m->e, m->param[module][k]);
        if (!p)
            return STRATA_ESTATE;
        if (m->dtype == gpt_act_weight_dtype(m->acts)) {
            params[k] = p; /* the kernels read the engine's copy in place */
        } else {
            params[k] = m->conv_w + pos;
            m->ops->to_f32(m->ops->ctx, m->conv_w + pos, p, sizes[k], m->dtype);
        }
        pos += sizes[k];
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
    size_t sizes[GPT_MAX_MODULE_PARAMS], pos = 0;
    int np = gpt_module_param_sizes(&m->d, module, sizes);
    for (int k = 0; k < np; k++) {
        void *g = strata_grad_data(m->e, m->param[module][k]);
        if (!g)
            return STRATA_ESTATE;
        if (m->dtype != STRATA_DTYPE_FP32)
            m->ops->from_f32(m->ops->ctx, g, m->conv_g + pos, sizes[k], m->dtype);
        if (m->capture) {
            strata_status st = capture_add(m, m->capture + m->flat_offset[module] + pos, g, sizes[k]);
            if (st != STRATA_OK)
                return st;
        }
        pos += sizes[k];
    }
    return strata_grads_ready(m->e, m->mod[module]);
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
    return strata_release(m->e, m->mod[module]);
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
    if (dtype != gpt_act_weight_dtype(m->acts)) {
        m->conv_w = conv;
        conv += max_module_numel(&m->d);
    }
    if (dtype != STRATA_DTYPE_FP32) {
        m->conv_g = conv;
        conv += max_module_numel(&m->d);
    }
    if ((st = choose_ops(m, dtype, workspace)) != STRATA_OK)
        return st;
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
        size_t n = max_module_numel(&m->d);
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
    for (int i = 0; i < m->nmodules && st == STRATA_OK; i++) {
        size_t sizes[GPT_MAX_MODULE_PARAMS], pos = m->flat_offset[i];
        int np = gpt_module_param_sizes(&m->d, i, sizes);
        for (int k = 0; k < np && st == STRATA_OK; k++) {
            st = strata_param_read_master(m->e, m->param[i][k], 0, sizes[k], out + pos);
            pos += sizes[k];
        }
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
    free(m->mod);
    free(m->param);
    free(m->ctx);
    free(m->flat_offset);
    free(m);
}
