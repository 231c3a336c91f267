/*
 * The GPT model tests' oracle: the network on flat arrays (model/gpt.h's gpt_flat) through the host ops, what a
 * model on a strata engine must match.
 */
#ifndef STRATA_TEST_GPT_REF_H
#define STRATA_TEST_GPT_REF_H

#include <stdint.h>

#include "model/gpt.h"

/* Runs `micro` micro-batches of batch x seq tokens (micro-batch mb at tok/tgt + mb * batch * seq) forward and
 * backward in mode, each loss scaled by `scale`, on the flat network of seed; writes the accumulated gradients to
 * grads (gpt_numel floats) and returns the mean of the micro-batches' losses. Fails the test on an error. */
double gpt_ref_grads(const gpt_dims *d, int batch, int seq, gpt_act_mode mode, uint64_t seed, const int32_t *tok,
                     const int32_t *tgt, int micro, float scale, float *grads);

#endif
