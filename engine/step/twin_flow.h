/*
 * Partial optimizer offload (DeepSpeed's Twin-Flow, zero_optimization.offload_optimizer.ratio): the CPU updates
 * the first ceil(ratio * nsub) sub-groups of the optimizer partition, the device the rest, at the same time.
 *
 * The device share is the partition's tail [first, numel): the last sub-groups hold the last modules, whose
 * gradients are complete first in backward. Its master weights and moments live in device memory (their own
 * arrays, or the device-tier arrays themselves when offload_optimizer.device is "none"); the host-tier arrays
 * keep their full size, and their tail is brought up to date only when something reads it (twin_flow_store:
 * a checkpoint save, strata_param_read_master) and read back when something writes it (twin_flow_load: finalize,
 * strata_load). A step uploads the tail's fp32 gradients, runs dev_adam_step on the share's own stream with the
 * step's constants while the CPU walks its sub-groups, and writes the new parameters to their home (straight
 * into device-tier parameters; else through a device scratch copied back). Results are bit-identical to the
 * all-CPU step: dev_adam_step gives adam_step_ref's bits, and so do the CPU kernels.
 *
 * Ceil, not floor, for the CPU's count: the device never holds more than the share the ratio gives it, so a
 * device budget planned for 1 - ratio of the optimizer state is never exceeded by rounding.
 */
#ifndef STRATA_ENGINE_TWIN_FLOW_H
#define STRATA_ENGINE_TWIN_FLOW_H

#include <stddef.h>

#include "strata.h"

struct strata_engine;
struct step_consts;
struct tier_array;
typedef struct twin_flow twin_flow;

/* The first element of the device share of an optimizer partition of numel elements in sub-groups of sg
 * (numel when the CPU updates everything: ratio 1, or a share that rounds to no whole sub-group). */
size_t twin_flow_split(size_t numel, size_t sg, double ratio);

/* Builds the device share the config asks for (*out NULL when there is none) and fills it from the host arrays,
 * which must hold the initial state. STRATA_EUNSUPPORTED, naming the key and the value, where the share cannot
 * run (gradients on NVMe); the allocator's status when device memory is short. With several ranks each rank's
 * share is the tail of its own slice (the optimizer view). */
strata_status twin_flow_create(struct strata_engine *e, twin_flow **out);
/* Waits for its work and frees it; NULL is a no-op. */
void twin_flow_destroy(struct strata_engine *e, twin_flow *tf);

/* Elements the CPU updates (the device share's first element; numel when tf is NULL). */
size_t twin_flow_cpu_numel(const twin_flow *tf, size_t numel);

/* Queues the device share's update on its stream: gradients of grads (a host-tier store) up, Adam with c, new
 * parameters into pout. Returns at once; twin_flow_finish waits. NULL tf: nothing. */
strata_status twin_flow_launch(struct strata_engine *e, twin_flow *tf, struct tier_array *grads,
                               struct tier_array *pout, const struct step_consts *c);
/* Waits for what twin_flow_launch queued (its error, if any), writes NVMe-homed parameters, traces it. */
strata_status twin_flow_finish(struct strata_engine *e, twin_flow *tf, struct tier_array *pout);

/* The device share's master weights and moments into the host arrays (before a reader of them) and back
 * (after a writer). NULL tf, or a share that is the device-tier arrays themselves: nothing to do. */
strata_status twin_flow_store(struct strata_engine *e, twin_flow *tf);
strata_status twin_flow_load(struct strata_engine *e, twin_flow *tf);

#endif
