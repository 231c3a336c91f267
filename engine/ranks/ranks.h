/*
 * The data-parallel world as the engine sees it: which view (full or this rank's shard) each state class
 * lives in for the ZeRO stage, and the collectives of a step (see registry.h, Ranks):
 *
 *   stage 0   gradients all-reduced before the step; everything replicated
 *   stage 1   gradients reduce-scattered to their owner before the step (from the full store into a shard
 *             store); the optimizer updates its shard; the updated parameters all-gathered after it
 *   stage 2   gradients reduce-scattered in strata_grads_ready (grads.c); the rest as stage 1
 *   stage 3   parameters all-gathered in strata_fetch (residency.c); the step is local
 *
 * Every collective is issued from the trainer's thread, in the order of the trainer's calls, which is the
 * same on every rank: MPI and NCCL need that, and it is why none is issued from the optimizer thread (the
 * delayed update's collectives run in strata_step, before it hands the update over and after it joins it).
 * Gradients move in fp32 (the sums are the ones one rank would accumulate, up to their order), parameters in
 * their device dtype. Private to ranks.c.
 */
#ifndef STRATA_ENGINE_RANKS_H
#define STRATA_ENGINE_RANKS_H

#include <stdbool.h>
#include <stdint.h>

#include "comm/comm.h"
#include "engine/registry.h"
#include "offload/tier_array.h"
#include "strata.h"

typedef struct rank_state rank_state;
struct strata_engine;

/* The views of a stage (with one rank both views coincide, so world 1 runs today's single-rank code). */
void ranks_views(int zero_stage, reg_view *param, reg_view *opt, reg_view *grad);
/* Whether a module's gradients are reduce-scattered as they are handed over (stage 2 and 3, world > 1). */
bool ranks_grads_sharded_at_handoff(const struct strata_engine *e);
/* Whether a fetch all-gathers the module from the ranks' shards (stage 3, world > 1). */
bool ranks_fetch_gathers(const struct strata_engine *e);

/* Built by finalize after the tiers and the gradient store: the shard arrays and buffers the stage needs. */
strata_status ranks_create(struct strata_engine *e, rank_state **out);
void ranks_destroy(struct strata_engine *e, rank_state *rs);

/* Before the optimizer consumes gradient store grad_index: every rank learns which modules got gradients on
 * any rank (and that every rank runs this step with lr as its step number `step`: rank_agree.h), then stage 0
 * all-reduces the gradients, stage 1 reduce-scatters them into this rank's shard store. Then ranks_step_grads is
 * what the optimizer reads. */
strata_status ranks_exchange_grads(struct strata_engine *e, int grad_index, double lr, uint64_t step);
/* The gradient store the optimizer reads after ranks_exchange_grads (in the optimizer's view). */
tier_array *ranks_step_grads(struct strata_engine *e, int grad_index);
/* Sums the local gradient statistics of every rank (the global norm and overflow). */
strata_status ranks_sum_gradstats(struct strata_engine *e, double *sumsq, bool *nonfinite);
/* The parameter array the optimizer writes: this rank's shard at stages 1 and 2 with several ranks (published
 * by ranks_publish_params), else the parameter copy param_out itself. */
tier_array *ranks_step_params(struct strata_engine *e, int param_out);
/* The view ranks_step_params lives in (the shard view when it is this rank's shard). */
reg_view ranks_step_params_view(const struct strata_engine *e);
/* Stages 1 and 2 with several ranks: all-gathers every module's updated shard into parameter copy param_out. */
strata_status ranks_publish_params(struct strata_engine *e, int param_out);
/* Reduce-scatters one module's fp32 gradients (full, host memory) into shard (its part). */
strata_status ranks_reduce_module(struct strata_engine *e, const reg_module *m, const float *full, float *shard);
/* As ranks_reduce_module, started on the comm's thread; both buffers stay untouched until comm_wait(*req). */
strata_status ranks_start_reduce(struct strata_engine *e, const reg_module *m, const float *full, float *shard,
                                 comm_req **req);
/* Stage 3: all-gathers a fetched module's device copy in place (this rank's shard is at its slot). */
strata_status ranks_gather_module(struct strata_engine *e, const reg_module *m, void *dev);
/* As ranks_gather_module, started on the comm's thread where the device copy is host memory (*req: wait for it
 * before the module is used or freed); elsewhere it gathers before returning and *req is NULL. */
strata_status ranks_start_gather(struct strata_engine *e, const reg_module *m, void *dev, comm_req **req);
/* With the master weights partitioned: elements [first, first + count) of the full view, all inside module m,
 * gathered from their owners into out. A collective: every rank reads the same range. */
strata_status ranks_read_master(struct strata_engine *e, const reg_module *m, size_t first, size_t count, float *out);
/* Module m's parameters (param_dtype, m->numel elements) into out, from this rank's shard and the others' (stage 3:
 * a collective every rank makes). */
strata_status ranks_read_params(struct strata_engine *e, const reg_module *m, void *out);
/* Payload bytes of the engine's data collectives so far (the stats' comm_bytes). */
uint64_t ranks_comm_bytes(const rank_state *rs);
/* A failure on this rank that the other ranks would otherwise wait for: tells them (no-op in world 1). */
void ranks_fail(struct strata_engine *e, strata_status st);

#endif
