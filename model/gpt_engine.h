/*
 * The GPT model on a strata engine, through include/strata.h only: each module of the model (embeddings,
 * each block, the final LayerNorm) is a strata module; the network fetches a module before using it,
 * releases it after, and in backward hands its gradients over with strata_grads_ready. Activations live in
 * device memory taken with strata_device_alloc (reserve gpt_engine_activation_bytes in
 * strata_config.activation_bytes). The kernels are the engine's backend's (gpt_ops.h): on the host in fp32 from
 * parameters of any param_dtype; on CUDA in the activation format that STRATA_MODEL_ACTS names (gpt_engine_acts).
 */
#ifndef STRATA_MODEL_GPT_ENGINE_H
#define STRATA_MODEL_GPT_ENGINE_H

#include "model/gpt.h"
#include "model/gpt_pass.h"

typedef struct gpt_model gpt_model;

/* The activation format the model computes in on backend with param_dtype parameters. The host computes in fp32.
 * On CUDA the environment variable STRATA_MODEL_ACTS chooses: "fp32" (the default until the bf16 format has passed
 * on a GPU: fp32 activations, products in the param_dtype's tensor-core math) or "bf16" (bf16 activations end to
 * end; needs param_dtype bf16, whose weights the kernels then read in place). STRATA_EINVAL with the reason in *why
 * (a static string) for another value, bf16 on the host, or bf16 with other parameters. */
strata_status gpt_engine_acts(strata_backend_kind backend, strata_dtype param_dtype, gpt_act_format *out,
                              const char **why);

/* The format a model on an engine of cfg computes in: gpt_engine_acts's, or fp32 (the larger) where it refuses
 * (gpt_model_prepare then reports why). For sizing: gpt_engine_reserve, strata estimate, strata train's summary. */
gpt_act_format gpt_engine_config_acts(const strata_config *cfg);

/* Device bytes the model takes with strata_device_alloc for micro-batches of batch x seq tokens, micro_batches of
 * them held at once (1 for the ordinary schedule; k for the layer-wise one, see gpt_pass.h), keeping activations
 * as mode says (gpt.h), in format fmt, with param_dtype parameters (whose fp32 conversion buffers it counts). */
size_t gpt_engine_activation_bytes(const gpt_dims *d, int batch, int seq, int micro_batches, gpt_act_mode mode,
                                   gpt_act_format fmt, strata_dtype param_dtype);

/* With GPT_ACT_OFFLOAD: what the model keeps through strata_act_push at once (strata.offload_activations.bytes:
 * every block input of micro_batches micro-batches, each rounded up to GPT_ACT_PAGE as strata keeps it) and the
 * largest one (strata.offload_activations.max_bytes). */
#define GPT_ACT_PAGE ((size_t)4096)
void gpt_engine_offload_bytes(const gpt_dims *d, int batch, int seq, int micro_batches, gpt_act_format fmt,
                              size_t *kept, size_t *largest);

/* What the model needs of cfg for those micro-batches in mode, at least (a config's larger sizes stand):
 * strata.activation_bytes (gpt_engine_activation_bytes in cfg's backend and param_dtype; where gpt_engine_acts
 * refuses them, the fp32 format's, the larger, and gpt_model_prepare reports the refusal) and, with GPT_ACT_OFFLOAD,
 * strata.offload_activations.bytes and max_bytes (gpt_engine_offload_bytes). strata train and strata estimate size
 * a config with it. */
void gpt_engine_reserve(const gpt_dims *d, int batch, int seq, int micro_batches, gpt_act_mode mode,
                        strata_config *cfg);

/* The least device memory the plan needs for a model (the largest module's parameters twice, in use and fetched
 * ahead, its gradients, and the activations): with the token embedding whole, and in the chosen tiles (0: whole). */
typedef struct {
    size_t whole, tiled;
} gpt_head_need;

/* The token embedding's tiles (gpt_dims.head_rows) for a model of d (its head_rows ignored) trained in micro-batches
 * of batch x seq one at a time in mode on an engine of cfg: 0 (whole) when it fits cfg's device budget, when no
 * budget is set (all free device memory) or when it is not the largest module; else tiles of whole GPT_HEAD_PIECEs,
 * at most a block's size, as large as the budget holds. */
int gpt_engine_head_rows(const gpt_dims *d, int batch, int seq, gpt_act_mode mode, const strata_config *cfg,
                         gpt_head_need *need);

/* Adds the model's modules and parameters (with GPT-2 initial values from seed) to an engine that is not
 * finalized yet: a strata module per module of gpt.h, and with d->head_rows the token embedding's tiles each a module
 * of its own ("embeddings.wte[v0:v1]", registered before "embeddings", which then holds wpe alone), declared parts of
 * the tensor "embeddings.wte" (strata_param_set_part), so checkpoints, exports and loads see one tensor whatever the
 * tiling. STRATA_EINVAL for dims gpt_dims_check refuses; on another failure strata_last_error(engine) says why. *out
 * is NULL on failure. */
strata_status gpt_model_register(strata_engine *engine, const gpt_dims *d, uint64_t seed, gpt_model **out);

/* The engine's id of parameter index of module (gpt.h's numbering: 0 = embeddings, 1..L = blocks, L + 1 = ln_f),
 * for a trainer that gives parameters other initial values (gpt_weights.h); STRATA_INVALID_ID for the token embedding
 * in tiles. gpt_model_param_parts gives every parameter that holds it, in element order (one, or the tiles'), in
 * *parts (the model's), and returns how many. */
strata_param_id gpt_model_param(const gpt_model *m, int module, int index);
int gpt_model_param_parts(const gpt_model *m, int module, int index, const strata_param_id **parts);
strata_engine *gpt_model_engine(const gpt_model *m);
const gpt_dims *gpt_model_dims(const gpt_model *m);

/* Puts each parameter in optimizer group decay or no_decay as gpt_param_decays(embeddings) says
 * (strata_param_set_group; before strata_engine_finalize). strata_last_error(engine) says why it failed. */
strata_status gpt_model_set_decay_groups(gpt_model *m, bool embeddings, strata_group_id decay,
                                         strata_group_id no_decay);

/* Declares the order in which one pass fetches the modules (strata_module_order): forward 0..L+1, the head (the
 * embeddings again, tied), backward L+1..0; both schedules fetch so (with the token embedding in tiles, each tile
 * during module 0's forward, three times for the head and once after module 0's backward). strata.step_in_backward needs it from the
 * first step, to know that the head's hand-over of the embeddings is not their last. */
strata_status gpt_model_declare_order(gpt_model *m);

/* After strata_engine_finalize: takes the activation memory for up to micro_batches micro-batches of batch x seq
 * tokens at once, keeping activations as mode says (GPT_ACT_OFFLOAD needs strata.offload_activations sized by
 * gpt_engine_offload_bytes). STRATA_EUNSUPPORTED on the CUDA backend in a build without CUDA kernels; STRATA_EBUDGET
 * when the reserve is too small. */
strata_status gpt_model_prepare(gpt_model *m, int batch, int seq, int micro_batches, gpt_act_mode mode,
                                strata_dtype param_dtype);

/* One micro-batch (see gpt_net_step): tokens/targets are batch*seq host tokens. */
strata_status gpt_model_micro_step(gpt_model *m, const int32_t *tokens, const int32_t *targets, bool backward,
                                   float grad_scale, double *loss);

/* count micro-batches (at most gpt_model_prepare's micro_batches) layer by layer, each module fetched once for all
 * of them (see gpt_pass_step): tokens/targets are count x batch*seq host tokens, losses[j] micro-batch j's loss.
 * The engine accumulates the same gradients in the same order as count gpt_model_micro_step calls. */
strata_status gpt_model_pass(gpt_model *m, int count, const int32_t *tokens, const int32_t *targets, bool backward,
                             float grad_scale, double *losses);

/* Why the model's kernels last failed or could not start (a cuBLAS or CUDA error), or "" when the failure, if
 * any, was strata's (strata_last_error then says why). */
const char *gpt_model_error(gpt_model *m);

/* For tests: every gradient handed to strata is also added (fp32) into capture (host memory), laid out as gpt_flat.
 * NULL stops. STRATA_ENOMEM when the host copies cannot be allocated. */
strata_status gpt_model_capture_grads(gpt_model *m, float *capture);

/* The fp32 master weights of the whole model in gpt_flat's layout into out (gpt_numel elements). */
strata_status gpt_model_read_weights(gpt_model *m, float *out);

/* Frees the activation memory (through the engine, which must still exist) and the model. NULL is a no-op. */
void gpt_model_destroy(gpt_model *m);

#endif
