/*
 * Placement: the home tier of each state class. A config names it (offload_param.device,
 * offload_optimizer.device) or says "auto", and then the planner tries placements fastest first and keeps
 * the first whose plan fits the budgets. strata_engine_finalize() and `strata estimate` both place through
 * plan_place, so the estimate says what training will do.
 *
 * The order "auto" tries, fastest first (a class the config fixes stays where it is):
 *   1. parameters device, optimizer state device   (only where the optimizer may keep its state on the
 *                                                    device: the host backend, whose device memory is RAM)
 *   2. parameters device, optimizer state host
 *   3. parameters host,   optimizer state host
 *   4. parameters device, optimizer state NVMe
 *   5. parameters host,   optimizer state NVMe
 *   6. parameters NVMe,   optimizer state NVMe     (the host cache mirrors what the host budget leaves)
 * The optimizer state never sits in a faster tier than the parameters: it is touched once per step, the
 * parameters at every fetch. 3 comes before 4 because a step with the optimizer state on NVMe reads and
 * writes 12 bytes per element there (24 in all, on the step's path unless the delayed update hides it),
 * while parameters on the host cost 2 x param bytes per element per micro-batch over PCIe, a link several
 * times faster than a drive, behind compute (the prefetcher); 4 before 5 because both move the same NVMe
 * bytes and 4 fetches nothing. NVMe is a candidate for a class only when its block has an nvme_path, and
 * parameters leave the device only at ZeRO stage 3.
 *
 * Twin-Flow (offload_optimizer.ratio: part of the optimizer state on the device, the rest on the host) is a
 * placement between 1 and 2; when it is built, it belongs in the candidate table of plan_auto.c there.
 */
#ifndef STRATA_ENGINE_PLAN_AUTO_H
#define STRATA_ENGINE_PLAN_AUTO_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/plan/plan.h"
#include "strata.h"

#define PLAN_REASON_BYTES 1024

typedef struct plan_placement {
    bool placed;                         /* plan_place succeeded and filled the rest */
    strata_tier asked_param, asked_opt;  /* from the config: may be STRATA_TIER_AUTO */
    strata_tier param_tier, opt_tier, grad_tier; /* the homes: never STRATA_TIER_AUTO */
    strata_tier asked_act, act_tier;     /* offloaded activations: asked, and placed: DEVICE (none), HOST or NVMe */
    /* One line for a person when a device was "auto": what was chosen and why each faster placement was
     * not; "" otherwise. */
    char reason[PLAN_REASON_BYTES];
} plan_placement;

/* Places every state class of cfg and computes the plan: in carries the model's sizes and windows (its tiers and
 * activation fields are ignored: they come from cfg). strata.offload_activations "auto" keeps them in host memory
 * when the plan fits there, else (with an nvme_path) on NVMe; on return in holds the chosen tiers (the gradient tier settled by plan_choose_grad_tier) and
 * *p the plan with its host cache. opt_on_device says whether the backend can keep the optimizer state on the
 * device (the optimizer runs on the CPU: only the host backend's device memory is RAM).
 * Returns STRATA_OK; STRATA_EBUDGET when no placement fits (with a fixed placement plan_check's message;
 * with "auto" the plan_check message of the placement least over its budgets, then every placement tried and
 * why it does not fit; in and *p then hold that closest placement's plan);
 * STRATA_EUNSUPPORTED for the optimizer state fixed on a device it cannot live on. Pure arithmetic. */
strata_status plan_place(const strata_config *cfg, bool opt_on_device, plan_input *in, size_t device_budget,
                         size_t host_budget, plan_placement *out, plan *p);

#endif
