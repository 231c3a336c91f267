/* The host kernels of the GPT model: the host gpt_ops table (gpt_ops.h). fp32, row-major (N rows of C channels). Matrix
 * products go to OpenBLAS; the rest are OpenMP loops whose reductions run in a fixed order, so results do not depend on
 * the thread count or on where the engine keeps the weights. Backward kernels add into their outputs.
 * The OpenMP team does all the threading: the first product sets openblas_set_num_threads(1) for the process, and
 * the kernels call OpenBLAS on fixed pieces of each product from inside the team (omp_set_num_threads sets the count).
 * ctx is the table's context, unused: the host kernels keep no state. */
#ifndef STRATA_MODEL_GPT_KERNELS_H
#define STRATA_MODEL_GPT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "model/gpt_ops.h" /* gpt_head_rows, GPT_HEAD_PIECE */

/* out[n] = wte[tok[n]] + wpe[n % T]. */
void k_embed_forward(void *ctx, float *out, const int32_t *tok, const float *wte, const float *wpe, int N, int T,
                     int C);
/* dwte may be NULL: only dwpe (the position embedding's share when wte is in tiles, k_embed_tile_backward). */
void k_embed_backward(void *ctx, float *dwte, float *dwpe, const float *dout, const int32_t *tok, int N, int T, int C);

void k_layernorm_forward(void *ctx, float *out, float *mean, float *rstd, const float *inp, const float *w,
                         const float *b, int N, int C);
void k_layernorm_backward(void *ctx, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                          const float *w, const float *mean, const float *rstd, int N, int C);

/* out (N x OC) = inp (N x C) W^T + bias; W is OC x C. */
void k_linear_forward(void *ctx, float *out, const float *inp, const float *W, const float *bias, int N, int C, int OC);
/* dinp += dout W; dW += dout^T inp; dbias += column sums of dout. dinp may be NULL. */
void k_linear_backward(void *ctx, float *dinp, float *dW, float *dbias, const float *dout, const float *inp,
                       const float *W, int N, int C, int OC);

/* Causal multi-head attention on qkv (B, T, 3C) into out (B, T, C); att (B, NH, T, T) keeps the probabilities. */
void k_attention_forward(void *ctx, float *out, float *att, const float *qkv, int B, int T, int C, int NH);
/* dqkv (overwritten) from dout; scratch holds B*NH*T*T floats (one T x T piece per head, all heads at once). */
void k_attention_backward(void *ctx, float *dqkv, float *scratch, const float *dout, const float *qkv, const float *att,
                          int B, int T, int C, int NH);

/* GELU, tanh approximation (GPT-2's). */
void k_gelu_forward(void *ctx, float *out, const float *inp, size_t n);
/* d (in place: gradient wrt the output on entry, wrt the input on return). */
void k_gelu_backward(void *ctx, float *d, const float *inp, size_t n);

/* out = a + b (elementwise). */
void k_residual_forward(void *ctx, float *out, const float *a, const float *b, size_t n);

/* Tied head and cross-entropy over rows [0, N) of x (N x C), chunk rows at a time (logits: chunk x V scratch).
 * Writes row n's loss into row_loss[n]; with dx != NULL writes dx (overwritten) and adds into dwte the gradient
 * of scale * sum(row_loss). */
void k_head_loss(void *ctx, float *dx, float *dwte, float *logits, double *row_loss, const float *x, const float *wte,
                 const int32_t *targets, int N, int C, int V, int chunk, float scale);

/* The same head with the vocabulary in tiles (rows [v0, v1) of wte at a time, v0 a multiple of GPT_HEAD_PIECE and v1
 * one too or V), in three passes over all the tiles in order: the rows' maximum logit, their sum of exponentials
 * and target logit (the loss: k_head_rows_loss), then the gradient. Each tile's pass makes the calls k_head_loss makes
 * for those pieces, and every sum adds in the same order, so the losses, dx and dwte are k_head_loss's bit for bit
 * (tests/t_head_tiles.c). The first tile's pass (v0 = 0) starts the rows' state (gpt_ops.h). */
/* One tile's pass: wte and dwte point at the tile's rows; logits is chunk x (v1 - v0) scratch; the gradient pass
 * writes dx at the vocabulary's first piece and adds to it after. */
void k_head_tile(void *ctx, gpt_head_pass pass, gpt_head_rows *st, float *dx, float *dwte, float *logits,
                 const float *x, const float *wte, const int32_t *targets, int N, int C, int v0, int v1, int chunk,
                 float scale);
void k_head_rows_loss(const gpt_head_rows *st, double *row_loss, int N);

/* The embeddings with wte in vocabulary tiles (wte and dwte point at rows [v0, v1)): the rows of out whose token lies
 * in the tile, and those tokens' gradient rows added in row order. Over all the tiles (and k_embed_backward with
 * dwte NULL for dwpe) they give k_embed_forward's out and k_embed_backward's gradients bit for bit. */
void k_embed_tile_forward(void *ctx, float *out, const int32_t *tok, const float *wte, const float *wpe, int N, int T,
                          int C, int v0, int v1);
void k_embed_tile_backward(void *ctx, float *dwte, const float *dout, const int32_t *tok, int N, int C, int v0, int v1);

#endif
