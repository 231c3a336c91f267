/*
 * A GPT-2 style decoder: token and position embeddings, pre-LayerNorm blocks with causal multi-head
 * self-attention and a GELU MLP, a final LayerNorm, a head tied to the token embedding and the
 * cross-entropy loss. Forward and backward through a kernel table (gpt_ops.h): on the host in fp32 (OpenBLAS sgemm +
 * OpenMP) or on a CUDA stream (cuBLAS, bf16/fp16 tensor-core math with fp32 accumulation; fp32 or bf16 activations).
 *
 * The network never owns its parameters: it asks a gpt_source for each module's parameters in the table's weight
 * dtype (and, in backward, fp32 gradient buffers) right before it uses them and tells the source when it is done.
 * gpt_engine.h implements the source on a strata engine (fetch / grads_ready / release); gpt_flat_source
 * below keeps everything in two flat host arrays (the oracle for the tests and the PyTorch check).
 */
#ifndef STRATA_MODEL_GPT_H
#define STRATA_MODEL_GPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/gpt_ops.h"
#include "strata.h"

typedef struct gpt_dims {
    int layers, heads, hidden, vocab, seq;
    /* Not the shape but how it is computed: 0, the token embedding whole (module 0 holds wte and wpe); else wte in
     * vocabulary tiles of head_rows rows (a multiple of GPT_HEAD_PIECE below vocab, the last tile the rest), each a
     * module of its own (gpt_source), for a budget that cannot hold wte at once. The same model either way: the same
     * initial values, losses and gradients bit for bit. */
    int head_rows;
} gpt_dims;

/* The token embedding's vocabulary tiles (0 when whole), and tile t's rows [*v0, *v1). */
int gpt_head_tiles(const gpt_dims *d);
void gpt_head_tile_rows(const gpt_dims *d, int tile, int *v0, int *v1);

/* The parameter slots of each kind of module: the index k of params[k] / grads[k] (gpt_source), of the sizes and
 * names below, and the order of registration, of the flat arrays and of a checkpoint's tensors. The initial values
 * hash the slot number, so renumbering changes every model: append, never reorder. */
typedef enum gpt_embed_param {
    GPT_WTE, /* token embedding, vocab x hidden, tied to the head */
    GPT_WPE, /* position embedding, seq x hidden */
    GPT_EMBED_PARAMS
} gpt_embed_param;

typedef enum gpt_block_param {
    GPT_LN1_W, /* LayerNorm before attention (weight, bias) */
    GPT_LN1_B,
    GPT_QKV_W, /* hidden -> 3 x hidden: queries, keys and values */
    GPT_QKV_B,
    GPT_PROJ_W, /* attention output, hidden -> hidden */
    GPT_PROJ_B,
    GPT_LN2_W, /* LayerNorm before the MLP */
    GPT_LN2_B,
    GPT_FC_W, /* hidden -> 4 x hidden */
    GPT_FC_B,
    GPT_FCPROJ_W, /* 4 x hidden -> hidden */
    GPT_FCPROJ_B,
    GPT_BLOCK_PARAMS
} gpt_block_param;

typedef enum gpt_final_param {
    GPT_LNF_W, /* the final LayerNorm (weight, bias) */
    GPT_LNF_B,
    GPT_FINAL_PARAMS
} gpt_final_param;

#define GPT_MAX_MODULE_PARAMS ((int)GPT_BLOCK_PARAMS)

/* Modules: 0 = embeddings (gpt_embed_param), 1..layers = blocks (gpt_block_param), layers + 1 = final LayerNorm
 * (gpt_final_param). */
int gpt_modules(const gpt_dims *d);
/* The element counts of module i's parameters into sizes (at most GPT_MAX_MODULE_PARAMS), indexed by its slots;
 * returns how many. */
int gpt_module_param_sizes(const gpt_dims *d, int module, size_t *sizes);
/* The shape of parameter (module, index) into dims (at most 2), as the kernels lay it out: a weight of a linear map
 * is out x in (PyTorch's nn.Linear), an embedding rows x hidden, a LayerNorm weight and every bias 1-D. Returns the
 * number of dims; their product is the size gpt_module_param_sizes gives. */
int gpt_param_shape(const gpt_dims *d, int module, int index, int64_t *dims);
/* The names matching gpt_module_param_sizes (static strings). */
const char *gpt_param_name(const gpt_dims *d, int module, int index);
/* The GPT-2 weight-decay rule (minGPT's, and nanoGPT's with embeddings true): true for the 2-D weight of each linear
 * map of a block (attention qkv and proj, MLP fc and proj), false for every bias and LayerNorm weight, and for the
 * embeddings (the token embedding, tied to the head, and the position embedding) unless embeddings is true. */
bool gpt_param_decays(const gpt_dims *d, int module, int index, bool embeddings);
/* Elements of module i, and of the whole model. */
size_t gpt_module_numel(const gpt_dims *d, int module);
size_t gpt_numel(const gpt_dims *d);
/* Forward + backward FLOPs per token of sequences of seq tokens, the usual estimate: 6 per parameter (the matrix
 * products, the tied head included) plus 12 * layers * seq * hidden for attention's two T x T products. */
double gpt_flops_per_token(const gpt_dims *d, int seq);
/* A readable error for dims that cannot work ("hidden 30 is not a multiple of heads 4"), or NULL. */
const char *gpt_dims_check(const gpt_dims *d);

/* The deterministic initial values (GPT-2's: normal(0, 0.02), residual projections scaled by 1/sqrt(2 * layers),
 * LayerNorm weights 1, biases 0) of elements [first, first + count) of parameter (module, index), into out; and
 * element i alone. Independent of chunking, threads and CPU (model/gpt_init.c), so a model larger than RAM initialises
 * chunk by chunk, and ranks on different machines make the same model. */
void gpt_init_fill(const gpt_dims *d, uint64_t seed, int module, int index, size_t first, size_t count, float *out);
float gpt_init_value(const gpt_dims *d, uint64_t seed, int module, int index, size_t i);

/* SplitMix64's finaliser: the counter-based hash behind the initial values and the data order. */
static inline uint64_t gpt_mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Where the network gets a module's parameters. acquire fills params[k] with parameter k in the weight dtype of the
 * net's kernel table (gpt_act_weight_dtype: fp32, or bf16 for GPT_ACTS_BF16) and grads[k] (fp32) when backward is true;
 * the network adds its gradient into them, for every parameter k of module; finish says the network is done
 * with them (in backward: the gradients are complete). hand_over, only between a backward acquire and its finish,
 * hands the gradients written into grads so far over as one contribution and points grads[k] at fresh zeroed
 * buffers: one acquisition then serves several micro-batches (the layer-wise schedule, gpt_pass.h) whose
 * gradients reach the source one contribution at a time, exactly as separate acquisitions would hand them over.
 * With the token embedding in tiles (d->head_rows), module layers + 2 + t is its tile t: params[GPT_WTE] and
 * grads[GPT_WTE] are the tile's rows (gpt_head_tile_rows), and the network reads only params[GPT_WPE] of module 0. */
typedef struct gpt_source {
    strata_status (*acquire)(void *ctx, int module, bool backward, void **params, float **grads);
    strata_status (*hand_over)(void *ctx, int module, float **grads);
    strata_status (*finish)(void *ctx, int module, bool backward);
    void *ctx;
} gpt_source;

typedef struct gpt_net gpt_net;

/* What a net keeps from forward to backward. */
typedef enum gpt_act_mode {
    GPT_ACT_KEEP = 0,   /* every block's internals: the least compute */
    GPT_ACT_CHECKPOINT, /* activation checkpointing: each block keeps only its input, and backward runs the block's
                           forward again first, but for its output (2/3 of a block forward more; the same bits) */
    GPT_ACT_OFFLOAD,    /* checkpointing, the block inputs handed to a gpt_keeper until backward */
} gpt_act_mode;

/* Where GPT_ACT_OFFLOAD's block inputs go (gpt_engine.c: strata_act_push / pop / drop). push keeps bytes of device
 * memory at src (which stays the keeper's to read until the next push or pop); pop gives back a device copy, valid
 * until drop. */
typedef struct gpt_keeper {
    strata_status (*push)(void *ctx, const void *src, size_t bytes, uint64_t *handle);
    strata_status (*pop)(void *ctx, uint64_t handle, const void **out);
    strata_status (*drop)(void *ctx, uint64_t handle);
    void *ctx;
} gpt_keeper;

/* Device memory of a net for micro-batches of batch sequences of seq tokens (seq <= d->seq) in a mode, for a table of
 * activation format fmt (gpt_ops.h). */
size_t gpt_activation_bytes(const gpt_dims *d, int batch, int seq, gpt_act_mode mode, gpt_act_format fmt);
/* One block's input: what GPT_ACT_OFFLOAD pushes per block (layers of them per micro-batch). */
size_t gpt_block_input_bytes(const gpt_dims *d, int batch, int seq, gpt_act_format fmt);

/* Creates a network that runs ops's kernels in the caller's memory block of gpt_activation_bytes (device memory of
 * ops's backend that the trainer owns; the net does not free it). ops (and keeper, which GPT_ACT_OFFLOAD needs and
 * the other modes refuse) must outlive the net. */
strata_status gpt_net_create(const gpt_dims *d, int batch, int seq, gpt_act_mode mode, const gpt_keeper *keeper,
                             const gpt_ops *ops, void *mem, size_t mem_bytes, gpt_net **out);
void gpt_net_destroy(gpt_net *net);
/* The net's model shape, and its tokens per micro-batch (batch x seq). */
const gpt_dims *gpt_net_dims(const gpt_net *net);
size_t gpt_net_tokens(const gpt_net *net);

/* One micro-batch: tokens and targets are batch*seq byte tokens (host memory). Computes the mean cross-entropy
 * into *loss; with backward, adds grad_scale * d(mean loss)/d(param) into the source's gradient buffers.
 * Module order: forward 0..L+1, the head (module 0 again, forward and backward), then L+1..0 backward.
 * (A pass of one micro-batch, gpt_pass_step.) */
strata_status gpt_net_step(gpt_net *net, const gpt_source *src, const int32_t *tokens, const int32_t *targets,
                           bool backward, float grad_scale, double *loss);

/* The network's pieces for one micro-batch, which a schedule (gpt_pass.h) calls in module order while it holds
 * the module's parameters w (and, in backward, gradient buffers g):
 *   gpt_net_load      checks and uploads the micro-batch (STRATA_EINVAL for a token or target out of the vocabulary);
 *                     backward says whether its backward follows (only then does forward keep block inputs);
 *   gpt_net_forward   module 0 (the embeddings), 1..layers (the blocks) or layers + 1 (the final LayerNorm);
 *   gpt_net_head      the tied head and the loss; with dwte != NULL also its backward, adding grad_scale times the
 *                     mean loss's gradient into dwte (w are the embeddings' parameters);
 *   gpt_net_backward  module layers + 1 down to 0, adding into g; needs the head's backward first;
 * and with the token embedding in tiles (d->head_rows; w and g then hold the tile's rows, see gpt_source):
 *   gpt_net_embed_tile  the embeddings' forward (backward false; w[GPT_WPE] is module 0's) or backward of one tile,
 *                       within module 0's forward or after its backward (gpt_net_backward of module 0 gives dwpe);
 *   gpt_net_head_tile   one tile's share of one pass of the head (gpt_head_pass: every tile's GPT_HEAD_MAX pass,
 *                       then every tile's GPT_HEAD_SUM; then, for backward, every tile's GPT_HEAD_GRAD with dwte);
 *   gpt_net_head_end    the loss from the passes (after the last tile's GPT_HEAD_SUM or GPT_HEAD_GRAD);
 *   gpt_net_loss      waits for the queued work and reads the micro-batch's mean loss. */
strata_status gpt_net_load(gpt_net *net, const int32_t *tokens, const int32_t *targets, bool backward);
strata_status gpt_net_forward(gpt_net *net, int module, void **w);
void gpt_net_head(gpt_net *net, void **w, float *dwte, float grad_scale);
strata_status gpt_net_backward(gpt_net *net, int module, void **w, float **g);
void gpt_net_embed_tile(gpt_net *net, int tile, bool backward, void **w, float **g);
void gpt_net_head_tile(gpt_net *net, int tile, gpt_head_pass pass, void **w, float *dwte, float grad_scale);
void gpt_net_head_end(gpt_net *net);
strata_status gpt_net_loss(gpt_net *net, double *loss);

/* Every parameter in one flat fp32 array, in module order, with a flat gradient array of the same layout that
 * accumulates across steps (zero it to start over). */
typedef struct gpt_flat {
    gpt_dims dims;
    float *params, *grads;
    size_t *module_offset; /* gpt_modules + 1 entries */
    float *scratch;        /* one module's gradients while it is in backward */
} gpt_flat;

strata_status gpt_flat_create(const gpt_dims *d, uint64_t seed, gpt_flat **out);
void gpt_flat_destroy(gpt_flat *f);
/* Its parameters are fp32: a source for nets of GPT_ACTS_FP32 tables (the host's). */
gpt_source gpt_flat_source(gpt_flat *f);

#endif
