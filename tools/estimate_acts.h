/* `strata estimate` for activations: the options that describe them (--batch, --seq-len,
 * --activation-checkpointing, --offload-activations) and what they cost: the model's activation memory for a
 * micro-batch of batch x seq-len tokens kept three ways (every activation; checkpointing; checkpointing with the
 * block inputs offloaded), put into the plan as `strata train` would reserve it, and the largest batch that fits
 * the device budget each way, so a user sees what limits the batch size. */
#ifndef STRATA_TOOLS_ESTIMATE_ACTS_H
#define STRATA_TOOLS_ESTIMATE_ACTS_H

#include <stdbool.h>

#include "engine/plan_auto.h"
#include "model/gpt.h"
#include "strata.h"

typedef struct estimate_acts {
    bool active;          /* any of the options below was given: the plan holds the model's activations */
    int batch;            /* sequences per micro-batch (the same --batch as the world's options) */
    int seq_len;          /* tokens per sequence; 0 = the model's context */
    gpt_act_mode mode;    /* --activation-checkpointing, --offload-activations */
    strata_config base;   /* the config before estimate_acts_apply sized the activations in it */
} estimate_acts;

#define ESTIMATE_ACTS_INIT {.batch = 1}

extern const char estimate_acts_usage[];

/* Takes flag (and its value: *used says whether it consumed it) when it is one of these options: 1 taken, 0 not
 * one of them (--batch is read and left for the world's options too), -1 a bad value (the message is on stderr). */
int estimate_acts_option(estimate_acts *a, const char *flag, const char *value, bool *used);

/* The activations of dims for a's micro-batch into cfg (strata.activation_bytes and, offloaded,
 * strata.offload_activations), as strata train sets them; false with a message when seq-len is beyond the context. */
bool estimate_acts_apply(estimate_acts *a, const gpt_dims *dims, strata_config *cfg);

/* Prints the activations block: the three ways for a's micro-batch, and the largest batch that fits the device
 * budget each way, placing each as finalize would (plan_place over in, a copy per try). */
void estimate_acts_print(const estimate_acts *a, const gpt_dims *dims, const strata_config *cfg, const plan_input *in,
                         bool opt_on_device);

#endif
