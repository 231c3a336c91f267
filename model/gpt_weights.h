/*
 * The GPT model's initial weights from safetensors (strata_weights_open / strata_param_load): strata's own export
 * (`strata ckpt export`: "<module>.<param>" in the model's shapes) or Hugging Face GPT-2 (GPT2LMHeadModel's
 * save_pretrained: "h.0.attn.c_attn.weight", with or without "transformer."; its Conv1D weights stored [in, out] and
 * loaded transposed into the model's [out, in]; lm_head.weight, tied to wte, and the attention buffers attn.bias /
 * attn.masked_bias ignored). The file's shape must be the model's: the layers, hidden size, vocabulary and context
 * are read from its tensors first, so a mismatch names the dimension rather than the first tensor that differs.
 */
#ifndef STRATA_MODEL_GPT_WEIGHTS_H
#define STRATA_MODEL_GPT_WEIGHTS_H

#include <stddef.h>

#include "model/gpt_engine.h"

typedef enum gpt_weights_layout { GPT_WEIGHTS_STRATA, GPT_WEIGHTS_HF } gpt_weights_layout;

/* A model dimension the file disagrees on. */
typedef enum gpt_weights_dim {
    GPT_DIM_NONE = 0, GPT_DIM_LAYERS, GPT_DIM_HIDDEN, GPT_DIM_VOCAB, GPT_DIM_CONTEXT
} gpt_weights_dim;

typedef struct gpt_weights_report {
    gpt_weights_layout layout;
    const char *prefix;          /* HF: "transformer." or "" */
    size_t tensors;              /* the file's tensors */
    size_t loaded;               /* the model's parameters loaded from them */
    gpt_weights_dim dim;         /* on a shape mismatch: the dimension that differs (GPT_DIM_NONE: another) */
    long file_value;             /* and the file's value of it */
    char why[1024];              /* on failure: what was wrong (tensor, file, both shapes) */
} gpt_weights_report;

/* Opens the weights at path on m's engine (not finalized yet) and loads every parameter of m from them. On failure
 * rep->why says what (rep->dim and rep->file_value which model dimension differs, for the caller to name its flag);
 * the status is strata_weights_open's or strata_param_load's, or STRATA_EINVAL for a shape mismatch. */
strata_status gpt_model_load_weights(gpt_model *m, const char *path, gpt_weights_report *rep);

const char *gpt_weights_layout_name(gpt_weights_layout layout);

#endif
