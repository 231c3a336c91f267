/* `strata estimate` for activations: the options that describe them (--batch, --seq-len,
 * --activation-checkpointing, --offload-activations) and what they cost: the model's activation memory for a
 * micro-batch of batch x seq-len tokens kept three ways (every activation; checkpointing; checkpointing with the
 * block inputs offloaded), put into the plan as `strata train` would reserve it, and the largest batch that fits
 * the device budget each way, so a user sees what limits the batch size. */
#ifndef STRATA_TOOLS_ESTIMATE_ACTS_H
#define STRATA_TOOLS_ESTIMATE_ACTS_H

#include <stdbool.h>

#include "engine/plan/plan_auto.h"
#include "model/gpt.h"
#include "strata.h"
#include "tools/options.h"

typedef struct estimate_acts {
    bool active;          /* any of the options below, or --batch, was given: the plan holds the model's activations */
    int batch;            /* sequences per micro-batch (the same --batch as the world's options) */
    int seq_len;          /* tokens per sequence; 0 = the model's context */
    bool checkpointing;   /* --activation-checkpointing */
    int offload;          /* --offload-activations: the index of host|nvme|auto, -1 = not given */
    gpt_act_mode mode;    /* what the two above come to, set by estimate_acts_apply */
    strata_config base;   /* the config before estimate_acts_apply sized the activations in it */
} estimate_acts;

#define ESTIMATE_ACTS_INIT {.batch = 1, .offload = -1}

/* These options (--batch, shared with the world's options, is the command's), into an estimate_acts at base in the
 * command's arguments; any of them given sets its active. */
#define ESTIMATE_ACTS_NOPTS 3
extern const cli_opt estimate_acts_opts[ESTIMATE_ACTS_NOPTS];
#define ESTIMATE_ACTS_GROUP(base)                                                                                   \
    {estimate_acts_opts, ESTIMATE_ACTS_NOPTS, (base), true, (base) + offsetof(estimate_acts, active),               \
     "Activations (the plan then holds them as strata train reserves them, and a table shows what limits the "   \
     "batch):"}

/* The activations of dims for a's micro-batch into cfg (strata.activation_bytes and, offloaded,
 * strata.offload_activations), as strata train sets them; false with a message when seq-len is beyond the context. */
bool estimate_acts_apply(estimate_acts *a, const gpt_dims *dims, strata_config *cfg);

/* Prints the activations block: the three ways for a's micro-batch, and the largest batch that fits the device
 * budget each way, placing each as finalize would (plan_place over in, a copy per try). */
void estimate_acts_print(const estimate_acts *a, const gpt_dims *dims, const strata_config *cfg, const plan_input *in,
                         bool opt_on_device);

#endif
