/* The GPT model's parameters loaded from strata's export or Hugging Face GPT-2 safetensors. */
#include "model/gpt_weights.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "model/gpt.h"

/* Hugging Face GPT-2's name of each block parameter, and whether its Conv1D stores it transposed. */
static const struct {
    const char *name;
    bool conv1d;
} hf_block[GPT_BLOCK_PARAMS] = {
    [GPT_LN1_W] = {"ln_1.weight", false},         [GPT_LN1_B] = {"ln_1.bias", false},
    [GPT_QKV_W] = {"attn.c_attn.weight", true},   [GPT_QKV_B] = {"attn.c_attn.bias", false},
    [GPT_PROJ_W] = {"attn.c_proj.weight", true},  [GPT_PROJ_B] = {"attn.c_proj.bias", false},
    [GPT_LN2_W] = {"ln_2.weight", false},         [GPT_LN2_B] = {"ln_2.bias", false},
    [GPT_FC_W] = {"mlp.c_fc.weight", true},       [GPT_FC_B] = {"mlp.c_fc.bias", false},
    [GPT_FCPROJ_W] = {"mlp.c_proj.weight", true}, [GPT_FCPROJ_B] = {"mlp.c_proj.bias", false},
};
static const char *const hf_embed[GPT_EMBED_PARAMS] = {[GPT_WTE] = "wte.weight", [GPT_WPE] = "wpe.weight"};
static const char *const hf_final[GPT_FINAL_PARAMS] = {[GPT_LNF_W] = "ln_f.weight", [GPT_LNF_B] = "ln_f.bias"};

const char *gpt_weights_layout_name(gpt_weights_layout layout)
{
    return layout == GPT_WEIGHTS_HF ? "Hugging Face GPT-2" : "strata export";
}

static strata_status say(gpt_weights_report *rep, strata_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static strata_status say(gpt_weights_report *rep, strata_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rep->why, sizeof rep->why, fmt, ap);
    va_end(ap);
    return st;
}

/* The module names gpt_model_register gives (embeddings, block<i>, ln_f). */
static void module_name(const gpt_dims *d, int module, char *out, size_t len)
{
    if (module == 0)
        snprintf(out, len, "embeddings");
    else if (module == d->layers + 1)
        snprintf(out, len, "ln_f");
    else
        snprintf(out, len, "block%d", module - 1);
}

/* The file's name of a parameter, and whether it is stored transposed. */
static void file_name(const gpt_dims *d, const gpt_weights_report *rep, int module, int index, char *out, size_t len,
                      bool *transposed)
{
    *transposed = false;
    if (rep->layout == GPT_WEIGHTS_STRATA) {
        char mod[32];
        module_name(d, module, mod, sizeof mod);
        snprintf(out, len, "%s.%s", mod, gpt_param_name(d, module, index));
    } else if (module == 0) {
        snprintf(out, len, "%s%s", rep->prefix, hf_embed[index]);
    } else if (module == d->layers + 1) {
        snprintf(out, len, "%s%s", rep->prefix, hf_final[index]);
    } else {
        snprintf(out, len, "%sh.%d.%s", rep->prefix, module - 1, hf_block[index].name);
        *transposed = hf_block[index].conv1d;
    }
}

static void shape_str(int ndim, const int64_t *dims, char *out, size_t len)
{
    size_t at = (size_t)snprintf(out, len, "[");
    for (int i = 0; i < ndim && at < len; i++)
        at += (size_t)snprintf(out + at, len - at, "%s%lld", i ? ", " : "", (long long)dims[i]);
    if (at < len)
        snprintf(out + at, len - at, "]");
}

static bool has(strata_engine *e, strata_weights_id w, const char *name, strata_weights_tensor *t)
{
    strata_weights_tensor scratch;
    return strata_weights_find(e, w, name, t ? t : &scratch) == STRATA_OK;
}

/* Which layout the file has, from its token embedding. */
static strata_status detect(strata_engine *e, strata_weights_id w, const char *path, gpt_weights_report *rep,
                            strata_weights_tensor *wte)
{
    if (has(e, w, "embeddings.wte", wte)) {
        rep->layout = GPT_WEIGHTS_STRATA;
        rep->prefix = "";
    } else if (has(e, w, "transformer.wte.weight", wte)) {
        rep->layout = GPT_WEIGHTS_HF;
        rep->prefix = "transformer.";
    } else if (has(e, w, "wte.weight", wte)) {
        rep->layout = GPT_WEIGHTS_HF;
        rep->prefix = "";
    } else {
        return say(rep, STRATA_EINVAL, "\"%s\" holds no GPT-2 token embedding (embeddings.wte as `strata ckpt "
                   "export` writes it, or Hugging Face's transformer.wte.weight / wte.weight): not GPT-2 weights",
                   path);
    }
    return STRATA_OK;
}

/* The number of blocks the file holds: the first i without block i's first LayerNorm. */
static long file_layers(strata_engine *e, strata_weights_id w, const gpt_weights_report *rep)
{
    char name[128];
    long i = 0;
    for (;; i++) {
        if (rep->layout == GPT_WEIGHTS_STRATA)
            snprintf(name, sizeof name, "block%ld.ln1.weight", i);
        else
            snprintf(name, sizeof name, "%sh.%ld.ln_1.weight", rep->prefix, i);
        if (!has(e, w, name, NULL))
            return i;
    }
}

static strata_status dim_mismatch(gpt_weights_report *rep, gpt_weights_dim dim, long file, long model,
                                  const char *what, const char *tensor)
{
    rep->dim = dim;
    rep->file_value = file;
    return say(rep, STRATA_EINVAL, "the weights have %s %ld (%s), the model %ld", what, file, tensor, model);
}

/* The model's dimensions against the file's, named one by one. */
static strata_status check_dims(strata_engine *e, strata_weights_id w, const gpt_dims *d, gpt_weights_report *rep,
                                const strata_weights_tensor *wte)
{
    char wpe_name[64];
    snprintf(wpe_name, sizeof wpe_name, "%s%s", rep->prefix, rep->layout == GPT_WEIGHTS_STRATA ? "embeddings.wpe"
                                                                                                : "wpe.weight");
    strata_weights_tensor wpe;
    char what[160];
    if (wte->ndim != 2)
        return say(rep, STRATA_EINVAL, "tensor \"%s\" of \"%s\" has %d dimensions; a token embedding has 2 "
                   "[vocab, hidden]", wte->name, wte->file, wte->ndim);
    snprintf(what, sizeof what, "tensor \"%s\" is [%lld, %lld]", wte->name, (long long)wte->dims[0],
             (long long)wte->dims[1]);
    if (wte->dims[1] != d->hidden)
        return dim_mismatch(rep, GPT_DIM_HIDDEN, (long)wte->dims[1], d->hidden, "hidden size", what);
    if (wte->dims[0] != d->vocab)
        return dim_mismatch(rep, GPT_DIM_VOCAB, (long)wte->dims[0], d->vocab, "vocabulary", what);
    if (has(e, w, wpe_name, &wpe) && wpe.ndim == 2 && wpe.dims[0] != d->seq) {
        snprintf(what, sizeof what, "tensor \"%s\" is [%lld, %lld]", wpe.name, (long long)wpe.dims[0],
                 (long long)wpe.dims[1]);
        return dim_mismatch(rep, GPT_DIM_CONTEXT, (long)wpe.dims[0], d->seq, "context", what);
    }
    long layers = file_layers(e, w, rep);
    if (layers != d->layers) {
        snprintf(what, sizeof what, "blocks 0..%ld", layers - 1);
        return dim_mismatch(rep, GPT_DIM_LAYERS, layers, d->layers, "layers", layers ? what : "no blocks");
    }
    return STRATA_OK;
}

strata_status gpt_model_load_weights(gpt_model *m, const char *path, gpt_weights_report *rep)
{
    memset(rep, 0, sizeof *rep);
    strata_engine *e = gpt_model_engine(m);
    const gpt_dims *d = gpt_model_dims(m);
    strata_weights_id w;
    strata_status st = strata_weights_open(e, path, &w);
    if (st != STRATA_OK)
        return say(rep, st, "%s", strata_last_error(e));
    strata_weights_count(e, w, &rep->tensors);
    strata_weights_tensor wte;
    if ((st = detect(e, w, path, rep, &wte)) != STRATA_OK || (st = check_dims(e, w, d, rep, &wte)) != STRATA_OK)
        return st;
    for (int module = 0; module < gpt_modules(d); module++) {
        size_t sizes[GPT_MAX_MODULE_PARAMS];
        int np = gpt_module_param_sizes(d, module, sizes);
        for (int k = 0; k < np; k++) {
            char name[160], want[96], got[96];
            bool transposed;
            file_name(d, rep, module, k, name, sizeof name, &transposed);
            int64_t dims[2], expect[2];
            int ndim = gpt_param_shape(d, module, k, dims);
            expect[0] = transposed ? dims[1] : dims[0];
            expect[1] = transposed ? dims[0] : dims[1];
            strata_weights_tensor t;
            if ((st = strata_weights_find(e, w, name, &t)) != STRATA_OK)
                return say(rep, st, "%s", strata_last_error(e));
            bool same = t.ndim == ndim;
            for (int i = 0; same && i < ndim; i++)
                same = t.dims[i] == expect[i];
            if (!same) {
                shape_str(t.ndim, t.dims, got, sizeof got);
                shape_str(ndim, expect, want, sizeof want);
                char mod[32];
                module_name(d, module, mod, sizeof mod);
                return say(rep, STRATA_EINVAL, "tensor \"%s\" of \"%s\" has shape %s, the model's %s.%s needs %s%s",
                           name, t.file, got, mod, gpt_param_name(d, module, k), want,
                           transposed ? " (Conv1D's [in, out])" : "");
            }
            const strata_param_id *parts; /* the token embedding's tiles each read their rows of the tensor */
            int nparts = gpt_model_param_parts(m, module, k, &parts);
            for (int i = 0; i < nparts; i++)
                if ((st = strata_param_load(e, parts[i], w, name, transposed ? STRATA_LOAD_TRANSPOSE : 0)) != STRATA_OK)
                    return say(rep, st, "%s", strata_last_error(e));
            rep->loaded++;
        }
    }
    return STRATA_OK;
}
