/* `strata estimate`'s advice for a plan that does not fit: the moves of state classes to a slower tier that make it
 * fit, cheapest first. The cheapest is the class touched least often: the optimizer state (12 of the 16 bytes per
 * parameter, read and written once per step), then the gradients (written once per micro-batch), then the parameters
 * (fetched at every forward and backward); and host memory before NVMe. This is ZeRO-Offload's order before
 * ZeRO-Infinity's: the optimizer to the host while the bf16 parameters stay on the GPU. */
#ifndef STRATA_TOOLS_ESTIMATE_MOVES_H
#define STRATA_TOOLS_ESTIMATE_MOVES_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "engine/plan/plan.h"
#include "strata.h"

#define ESTIMATE_MAX_MOVES 5

/* One move, taken after the ones before it, and the plan it leaves. */
typedef struct estimate_move {
    const char *what;    /* "the optimizer state to host memory" */
    const char *setting; /* the config key and value that make it ("strata.gradients_on_nvme = true") */
    const char *needs;   /* what else it needs ("an nvme_path"), or NULL */
    strata_tier param_tier, opt_tier, grad_tier; /* the placement after it */
    size_t device_bytes, host_bytes;             /* the plan after it */
    bool fits;
} estimate_move;

/* From the placement in in (as plan_place left it, for cfg, the device able to hold the optimizer state or not) while
 * its plan overflows the budgets: each time, the first move in the order above whose class sits in a tier that
 * overflows, until the plan fits or nothing is left to move (parameters move only at ZeRO stage 3). Returns how many
 * moves were written to moves. */
int estimate_moves_find(const strata_config *cfg, const plan_input *in, bool opt_on_device, size_t device_budget,
                        size_t host_budget, estimate_move moves[ESTIMATE_MAX_MOVES]);

/* Prints the moves under the tier table ("moves   cheapest first: ..."), or that none is left. */
void estimate_moves_print(const estimate_move *moves, int n, size_t device_budget, size_t host_budget);

/* The moves as a JSON array (a new reference). */
json_t *estimate_moves_json(const estimate_move *moves, int n);

#endif
