/*
 * Passes: several micro-batches through the GPT network together, each module acquired once for all of them
 * (GreedySnake's "vertical" schedule, `strata train --schedule layerwise`); a pass of one micro-batch is the
 * ordinary schedule (gpt_net_step). With gradient accumulation k, a step then fetches every module once forward,
 * once for the tied head and once backward instead of k times each, for k times the activation memory.
 */
#ifndef STRATA_MODEL_GPT_PASS_H
#define STRATA_MODEL_GPT_PASS_H

#include "model/gpt.h"

/* A pass holds a net per micro-batch, so it needs the activations of all of them at once, plus the head's gradient
 * of every micro-batch but the first, kept until the embeddings' backward (see gpt_pass_step). Its memory is one
 * block of gpt_pass_bytes(...).total bytes. */
typedef struct gpt_pass gpt_pass;

typedef struct gpt_pass_size {
    size_t per_micro_batch; /* one net's activations (gpt_activation_bytes, rounded up to 4 KiB) */
    size_t head_grad;       /* one kept head gradient: vocab x hidden fp32, rounded up to 4 KiB */
    size_t total;           /* count x per_micro_batch + (count - 1) x head_grad; 0 for a count below 1 */
} gpt_pass_size;

/* For a table of activation format fmt (gpt_ops.h); the kept head gradients are fp32 in every format. */
gpt_pass_size gpt_pass_bytes(const gpt_dims *d, int batch, int seq, int count, gpt_act_mode mode, gpt_act_format fmt);

/* A pass of count micro-batches of batch x seq tokens, each net in mode (with keeper: gpt_net_create), in the caller's
 * block mem (device memory of ops's backend, at least gpt_pass_bytes(...).total; the pass does not free it). ops must
 * outlive the pass. With the token embedding in tiles (d->head_rows) count must be 1: the head gradients a pass
 * keeps would each be the whole of wte. */
strata_status gpt_pass_create(const gpt_dims *d, int batch, int seq, int count, gpt_act_mode mode,
                              const gpt_keeper *keeper, const gpt_ops *ops, void *mem, size_t mem_bytes,
                              gpt_pass **out);
void gpt_pass_destroy(gpt_pass *p);

/* count (1 to the pass's count) micro-batches, micro-batch j at tokens/targets + j * batch * seq, its mean loss
 * into losses[j]. Module order as in gpt_net_step, every module acquired once for all count micro-batches. The
 * gradients reach the source exactly as count gpt_net_step calls hand them over: per module, one contribution per
 * micro-batch in micro-batch order, and for the embeddings the head's and then the embeddings' own, micro-batch by
 * micro-batch: the head's gradients of every micro-batch but the first wait in the pass for the embeddings'
 * backward. So the engine's fp32 sums are the ordinary schedule's, bit for bit. */
strata_status gpt_pass_step(gpt_pass *p, int count, const gpt_source *src, const int32_t *tokens,
                            const int32_t *targets, bool backward, float grad_scale, double *losses);

#endif
