/* The model's parameter layout and initial values: one description shared by the network, the engine
 * registration, `strata estimate` and the tests. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gpt.h"

_Static_assert(GPT_EMBED_PARAMS <= GPT_MAX_MODULE_PARAMS && GPT_FINAL_PARAMS <= GPT_MAX_MODULE_PARAMS,
               "GPT_MAX_MODULE_PARAMS must hold every module's parameters");

static const char *const embed_names[GPT_EMBED_PARAMS] = {[GPT_WTE] = "wte", [GPT_WPE] = "wpe"};

static const char *const block_names[GPT_BLOCK_PARAMS] = {
    [GPT_LN1_W] = "ln1.weight",
    [GPT_LN1_B] = "ln1.bias",
    [GPT_QKV_W] = "attn.qkv.weight",
    [GPT_QKV_B] = "attn.qkv.bias",
    [GPT_PROJ_W] = "attn.proj.weight",
    [GPT_PROJ_B] = "attn.proj.bias",
    [GPT_LN2_W] = "ln2.weight",
    [GPT_LN2_B] = "ln2.bias",
    [GPT_FC_W] = "mlp.fc.weight",
    [GPT_FC_B] = "mlp.fc.bias",
    [GPT_FCPROJ_W] = "mlp.proj.weight",
    [GPT_FCPROJ_B] = "mlp.proj.bias",
};

static const char *const final_names[GPT_FINAL_PARAMS] = {[GPT_LNF_W] = "ln_f.weight", [GPT_LNF_B] = "ln_f.bias"};

int gpt_modules(const gpt_dims *d)
{
    return d->layers + 2;
}

int gpt_module_param_sizes(const gpt_dims *d, int module, size_t *sizes)
{
    size_t h = (size_t)d->hidden;
    if (module == 0) {
        sizes[GPT_WTE] = (size_t)d->vocab * h;
        sizes[GPT_WPE] = (size_t)d->seq * h;
        return GPT_EMBED_PARAMS;
    }
    if (module == d->layers + 1) {
        sizes[GPT_LNF_W] = h;
        sizes[GPT_LNF_B] = h;
        return GPT_FINAL_PARAMS;
    }
    sizes[GPT_LN1_W] = h, sizes[GPT_LN1_B] = h;
    sizes[GPT_QKV_W] = 3 * h * h, sizes[GPT_QKV_B] = 3 * h;
    sizes[GPT_PROJ_W] = h * h, sizes[GPT_PROJ_B] = h;
    sizes[GPT_LN2_W] = h, sizes[GPT_LN2_B] = h;
    sizes[GPT_FC_W] = 4 * h * h, sizes[GPT_FC_B] = 4 * h;
    sizes[GPT_FCPROJ_W] = 4 * h * h, sizes[GPT_FCPROJ_B] = h;
    return GPT_BLOCK_PARAMS;
}

int gpt_param_shape(const gpt_dims *d, int module, int index, int64_t *dims)
{
    int64_t h = d->hidden, rows = 0, cols = h;
    if (module == 0)
        rows = index == GPT_WTE ? d->vocab : d->seq;
    else if (module != d->layers + 1 && index == GPT_QKV_W)
        rows = 3 * h;
    else if (module != d->layers + 1 && index == GPT_PROJ_W)
        rows = h;
    else if (module != d->layers + 1 && index == GPT_FC_W)
        rows = 4 * h;
    else if (module != d->layers + 1 && index == GPT_FCPROJ_W)
        rows = h, cols = 4 * h;
    if (rows) {
        dims[0] = rows, dims[1] = cols;
        return 2;
    }
    size_t sizes[GPT_MAX_MODULE_PARAMS];
    gpt_module_param_sizes(d, module, sizes);
    dims[0] = (int64_t)sizes[index];
    return 1;
}

const char *gpt_param_name(const gpt_dims *d, int module, int index)
{
    if (module == 0)
        return embed_names[index];
    if (module == d->layers + 1)
        return final_names[index];
    return block_names[index];
}

bool gpt_param_decays(const gpt_dims *d, int module, int index, bool embeddings)
{
    int64_t dims[2];
    return gpt_param_shape(d, module, index, dims) == 2 && (module != 0 || embeddings);
}

size_t gpt_module_numel(const gpt_dims *d, int module)
{
    size_t sizes[GPT_MAX_MODULE_PARAMS], total = 0;
    int n = gpt_module_param_sizes(d, module, sizes);
    for (int k = 0; k < n; k++)
        total += sizes[k];
    return total;
}

size_t gpt_numel(const gpt_dims *d)
{
    size_t total = 0;
    for (int m = 0; m < gpt_modules(d); m++)
        total += gpt_module_numel(d, m);
    return total;
}

int gpt_head_tiles(const gpt_dims *d)
{
    return d->head_rows ? (d->vocab + d->head_rows - 1) / d->head_rows : 0;
}

void gpt_head_tile_rows(const gpt_dims *d, int tile, int *v0, int *v1)
{
    *v0 = tile * d->head_rows;
    *v1 = *v0 + d->head_rows < d->vocab ? *v0 + d->head_rows : d->vocab;
}

const char *gpt_dims_check(const gpt_dims *d)
{
    static _Thread_local char msg[160];
    if (d->layers < 1 || d->heads < 1 || d->hidden < 1 || d->vocab < 1 || d->seq < 1)
        snprintf(msg, sizeof msg, "layers %d, heads %d, hidden %d, vocab %d and seq %d must all be at least 1",
                 d->layers, d->heads, d->hidden, d->vocab, d->seq);
    else if (d->hidden % d->heads != 0)
        snprintf(msg, sizeof msg, "hidden %d is not a multiple of heads %d", d->hidden, d->heads);
    else if (d->vocab < 256)
        snprintf(msg, sizeof msg, "vocab %d is smaller than 256, the byte-level tokens of the data", d->vocab);
    else if (d->head_rows < 0 || d->head_rows % GPT_HEAD_PIECE != 0 || (d->head_rows && d->head_rows >= d->vocab))
        snprintf(msg, sizeof msg, "head_rows %d is not 0 (wte whole) or a multiple of %d below vocab %d",
                 d->head_rows, GPT_HEAD_PIECE, d->vocab);
    else
        return NULL;
    return msg;
}

/* ---------------------------------------------------------------- the flat source */

strata_status gpt_flat_create(const gpt_dims *d, uint64_t seed, gpt_flat **out)
{
    *out = NULL;
    int nm = gpt_modules(d);
    gpt_flat *f = calloc(1, sizeof *f);
    if (!f)
        return STRATA_ENOMEM;
    f->dims = *d;
    size_t n = gpt_numel(d);
    f->params = malloc(n * sizeof(float));
    f->grads = calloc(n, sizeof(float));
    f->module_offset = calloc((size_t)nm + 1, sizeof(size_t));
    size_t biggest = 0;
    for (int m = 0; m < nm; m++)
        biggest = gpt_module_numel(d, m) > biggest ? gpt_module_numel(d, m) : biggest;
    f->scratch = malloc(biggest * sizeof(float));
    if (!f->params || !f->grads || !f->module_offset || !f->scratch) {
        gpt_flat_destroy(f);
        return STRATA_ENOMEM;
    }
    size_t pos = 0;
    for (int m = 0; m < nm; m++) {
        f->module_offset[m] = pos;
        size_t sizes[GPT_MAX_MODULE_PARAMS];
        int np = gpt_module_param_sizes(d, m, sizes);
        for (int k = 0; k < np; k++) {
            gpt_init_fill(d, seed, m, k, 0, sizes[k], f->params + pos);
            pos += sizes[k];
        }
    }
    f->module_offset[nm] = pos;
    *out = f;
    return STRATA_OK;
}

void gpt_flat_destroy(gpt_flat *f)
{
    if (!f)
        return;
    free(f->params);
    free(f->grads);
    free(f->module_offset);
    free(f->scratch);
    free(f);
}

/* The elements [*lo, *hi) of the flat arrays that module holds as a source hands it out (gpt_source): with the
 * token embedding in tiles, module 0 only wpe, and each tile its rows of wte. Returns its first slot. */
static int flat_range(const gpt_flat *f, int module, size_t *lo, size_t *hi)
{
    const gpt_dims *d = &f->dims;
    size_t C = (size_t)d->hidden, wte0 = f->module_offset[0];
    int L = d->layers, v0, v1;
    if (module > L + 1) {
        gpt_head_tile_rows(d, module - L - 2, &v0, &v1);
        *lo = wte0 + (size_t)v0 * C, *hi = wte0 + (size_t)v1 * C;
        return GPT_WTE;
    }
    *lo = f->module_offset[module], *hi = f->module_offset[module + 1];
    if (module == 0 && d->head_rows) {
        *lo += (size_t)d->vocab * C;
        return GPT_WPE;
    }
    return 0;
}

/* Like strata's grad_data / grads_ready: each backward use of a module writes into zeroed buffers that are then
 * added to the accumulated gradients, so the sums are grouped exactly as the engine groups them. */
static void zero_scratch(gpt_flat *f, int module)
{
    size_t lo, hi;
    flat_range(f, module, &lo, &hi);
    memset(f->scratch, 0, (hi - lo) * sizeof(float));
}

static void add_scratch(gpt_flat *f, int module)
{
    size_t lo, hi;
    flat_range(f, module, &lo, &hi);
    for (size_t i = lo; i < hi; i++)
        f->grads[i] += f->scratch[i - lo];
}

static strata_status flat_acquire(void *ctx, int module, bool backward, void **params, float **grads)
{
    gpt_flat *f = ctx;
    size_t sizes[GPT_MAX_MODULE_PARAMS], lo, hi;
    bool tiled = module > f->dims.layers + 1 || (module == 0 && f->dims.head_rows);
    int first = flat_range(f, module, &lo, &hi), np = gpt_module_param_sizes(&f->dims, module, sizes);
    if (tiled) /* one parameter: a tile, or wpe alone */
        np = first + 1, sizes[first] = hi - lo;
    for (size_t k = (size_t)first, pos = lo; k < (size_t)np; pos += sizes[k], k++) {
        params[k] = f->params + pos;
        if (backward)
            grads[k] = f->scratch + (pos - lo);
    }
    if (backward)
        zero_scratch(f, module);
    return STRATA_OK;
}

/* The buffers stay where they are: the scratch is added, then zeroed. */
static strata_status flat_hand_over(void *ctx, int module, float **grads)
{
    (void)grads;
    add_scratch(ctx, module);
    zero_scratch(ctx, module);
    return STRATA_OK;
}

static strata_status flat_finish(void *ctx, int module, bool backward)
{
    if (backward)
        add_scratch(ctx, module);
    return STRATA_OK;
}

gpt_source gpt_flat_source(gpt_flat *f)
{
    return (gpt_source){.acquire = flat_acquire, .hand_over = flat_hand_over, .finish = flat_finish, .ctx = f};
}

double gpt_flops_per_token(const gpt_dims *d, int seq)
{
    return 6.0 * (double)gpt_numel(d) + 12.0 * d->layers * (double)seq * d->hidden;
}
