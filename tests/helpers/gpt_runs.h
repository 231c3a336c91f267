/*
 * The GPT model tests' two ways to the same loss and gradients: the oracle, the network on flat arrays (model/gpt.h's
 * gpt_flat) through the host ops, and the model on a strata engine (model/gpt_engine.h), which must match it.
 * Both run `micro` micro-batches of batch x seq tokens (micro-batch mb at tok/tgt + mb * batch * seq) forward and
 * backward, each loss scaled by `scale`, write the accumulated gradients to grads (gpt_numel floats) and return the
 * mean of the micro-batches' losses. An error fails the test.
 */
#ifndef STRATA_TEST_GPT_RUNS_H
#define STRATA_TEST_GPT_RUNS_H

#include <stdint.h>

#include "model/gpt.h"
#include "model/gpt_engine.h"

/* The oracle, on the flat network of seed with activations kept as mode says. */
double gpt_ref_grads(const gpt_dims *d, int batch, int seq, gpt_act_mode mode, uint64_t seed, const int32_t *tok,
                     const int32_t *tgt, int micro, float scale, float *grads);

/* A model of seed on an engine of cfg. */
typedef struct gpt_engine_run {
    strata_engine *e;
    gpt_model *m;
} gpt_engine_run;

/* The model registered on a new engine of cfg, finalized and prepared for batch x seq micro-batches in mode with
 * dt parameters, its gradients captured into grads (zeroed first), then the micro-batches; `what` names the run in
 * a failure. The engine and the model stay in *run for the test to go on with; gpt_engine_run_end destroys them. */
double gpt_engine_grads(const char *what, const strata_config *cfg, const gpt_dims *d, int batch, int seq,
                        gpt_act_mode mode, strata_dtype dt, uint64_t seed, const int32_t *tok, const int32_t *tgt,
                        int micro, float scale, float *grads, gpt_engine_run *run);
void gpt_engine_run_end(gpt_engine_run *run);

#endif
