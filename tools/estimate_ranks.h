/* `strata estimate` for a data-parallel world: the options that describe it (--world-size, --stage,
 * --params, --grad-accum, and the rates of the bandwidth analysis) and what it prints per rank: the ZeRO
 * paper's model-state accounting, strata's own plan, the communication and offload traffic per step, and
 * ZeRO-Infinity's step-time bound. No ranks are started. */
#ifndef STRATA_TOOLS_ESTIMATE_RANKS_H
#define STRATA_TOOLS_ESTIMATE_RANKS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "engine/plan/plan.h"
#include "strata.h"
#include "tools/options.h"

typedef struct estimate_ranks {
    bool active;          /* any of the options below was given: print the world's blocks */
    bool json;
    int world_size;       /* 1 unless --world-size */
    int zero_stage;       /* -1 until --stage; then the config's zero_optimization.stage */
    int grad_accum;       /* micro-batches per optimizer step */
    size_t params;        /* --params: a bare parameter count, 0 = the model shape's */
    size_t module_params; /* --module-params: the size of the equal modules a bare count is cut into; 0 = default */
    size_t trainable;     /* --trainable-params: of a bare count, the trained ones (an adapter); 0 = all */
    int batch;            /* sequences per rank per micro-batch */
    size_t tokens;        /* --tokens per rank per micro-batch; 0 = batch x the shape's seq */
    double tflops;        /* achieved compute per rank, TFLOP/s: 70 unless --tflops (the speed block's option) */
    double link_gbps, nvme_gbps, pcie_gbps; /* Gbit/s (10^9 bits per second); 0 = not given */
} estimate_ranks;

#define ESTIMATE_RANKS_INIT {.world_size = 1, .zero_stage = -1, .grad_accum = 1, .batch = 1, .tflops = 70}

/* These options (all but --batch, which the command shares with the activations), into an estimate_ranks at base in
 * the command's arguments; any of them given sets its active. */
#define ESTIMATE_RANKS_NOPTS 11
extern const cli_opt estimate_ranks_opts[ESTIMATE_RANKS_NOPTS];
#define ESTIMATE_RANKS_GROUP(base)                                                                                  \
    {estimate_ranks_opts, ESTIMATE_RANKS_NOPTS, (base), true, (base) + offsetof(estimate_ranks, active),            \
     "A data-parallel world (per-rank numbers; no ranks are started):"}

/* Fills what the config leaves to the world (the stage) and checks the two agree; false with a message. */
bool estimate_ranks_settle(estimate_ranks *r, const strata_config *cfg);

/* A bare count (--params) is planned as modules of this many parameters unless --module-params says otherwise: a
 * transformer layer's order of size. It is never planned as one module: the plan holds a whole module on the device
 * and in the collectives' scratch, so one module of the whole model would ask for the model several times over. */
#define ESTIMATE_MODULE_PARAMS_DEFAULT ((size_t)100000000)

/* The module size a bare count is cut into: --module-params, else the default, at most the count. */
size_t estimate_ranks_module_params(const estimate_ranks *r);

/* Prints the world's blocks after the plan of input in (already per rank); numel is Ψ, the unpadded parameter count;
 * seq the shape's sequence length; tied_numel the padded elements of a module the trainer fetches and hands over
 * once more per micro-batch (the GPT's embeddings, tied to its head; 0 for a bare count). */
void estimate_ranks_print(const estimate_ranks *r, const strata_config *cfg, const plan_input *in, size_t numel,
                          int seq, size_t tied_numel);

/* The same numbers, with the plan p's lines and tier totals, as one JSON object for --json (a new reference: the
 * command adds its own members and prints it). */
json_t *estimate_ranks_json(const estimate_ranks *r, const plan_input *in, const plan *p, size_t numel, int seq,
                            size_t tied_numel);

#endif
