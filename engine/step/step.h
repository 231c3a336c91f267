/*
 * The optimizer step pipeline: Adam over the flat partition in sub-groups, with the optimizer state
 * streamed through pinned slots when it lives on NVMe (see step.c for the schedule). The slots outlive a
 * step; the pipeline also counts the updates applied. The engine's optimizer code (step.c, step_in_backward.c) uses it.
 */
#ifndef STRATA_ENGINE_STEP_H
#define STRATA_ENGINE_STEP_H

#include <stdbool.h>
#include <stdint.h>

#include "cpu_adam/driver.h"
#include "strata.h"

/* Slots of optimizer state in pinned memory: one being computed, one being read ahead, and two being
 * written back. With only three, the read of k+1 has to wait for the write of k-2, which left barely an
 * iteration earlier, and the disk idles between them; the fourth slot gives the write a whole iteration
 * more (measured with `strata bench step`, whose I/O-alone peer uses as many). */
#define STEP_SLOTS 4

typedef struct step_pipeline step_pipeline;
struct strata_engine;

/* The Adam kernels (chosen for this CPU) and the thread count of cfg. */
strata_status step_create(const strata_config *cfg, step_pipeline **out);
/* Waits for the slots' I/O and gives their buffers back to the engine's pool. NULL is a no-op. */
void step_destroy(struct strata_engine *e, step_pipeline *sp);

/* What one optimizer step runs over. */
typedef struct step_job {
    double lr;                 /* group 0's (the groups' values were frozen when the step started: opt_groups.h) */
    double loss_scale;         /* the scale the trainer's gradients carry */
    int grad_index;            /* the gradient store it consumes */
    int param_out;             /* the parameter copy it writes */
    bool have_stats;           /* sumsq and nonfinite are given (summed over the ranks); else the step computes them */
    double sumsq;
    bool nonfinite;
} step_job;

/* One optimizer step over this rank's part of the partition (the optimizer's view). res->skipped on an fp16
 * overflow. Issues no collective: it may run on the optimizer thread. */
strata_status step_run(struct strata_engine *e, const step_job *job, strata_step_result *res);
/* This rank's gradient statistics over store grad_index (what step_run computes when have_stats is false). */
strata_status step_grad_stats(struct strata_engine *e, int grad_index, double *sumsq, bool *nonfinite);
/* Waits for the optimizer state's write-backs a step left in flight (a step returns without waiting for the drive):
 * before anything reads or writes the optimizer state on NVMe outside a step (a save, a load, strata_sync). A write
 * that failed is reported here, or by the next step. */
strata_status step_settle(struct strata_engine *e, step_pipeline *sp);
/* The slots keep the state of the last sub-groups a step wrote; after anything else writes the optimizer
 * state (strata_load), step_forget makes the next step read it again. */
void step_forget(step_pipeline *sp);
/* Runs one Adam job on the CPU (job->team_out is set here), counts its time in the engine's Adam time and
 * traces it on the optimizer track as `what`, labelled with `place` and the threads that ran it. */
strata_status step_adam_timed(struct strata_engine *e, adam_job *job, const char *what, const char *place);
/* Elements per piece of the optimizer's work: the sub-group size (aligned), at most this rank's partition. The
 * ordinary step walks the partition in sub-groups of it; the gradient norm sums each module's pieces of it. */
size_t step_piece_numel(const struct strata_engine *e);
/* Adds the gradient statistics of one piece (numel elements of grad in dtype, at most step_piece_numel) to
 * *module, with the kernels of the step (a small piece on the calling thread, a large one with the step's thread
 * count): the one definition the global norm is summed by. */
strata_status step_piece_gradstats(struct strata_engine *e, const void *grad, strata_dtype dtype, size_t numel,
                                   adam_gradstats *module);
/* The rounding key of bf16 moments (strata.optimizer_moments) of rank's optimizer view at update step (from 1), seed
 * strata.optimizer_moments_seed: fresh per step and rank; the kernel draws each element's bits by its index in the
 * view (adam_bf16_moments.base), so whatever cuts the view into jobs (sub-groups, a module's pieces) draws alike. */
uint32_t step_moments_key(int seed, int rank, int64_t step);
/* Points job at moments m and v of the range from element first of the optimizer view, in the moments' form
 * (tiers.moments): fp32 in job->arrays; bf16 with update step's rounding key; 8-bit with the block scales of
 * m_scale / v_scale (host memory) from first's block. */
struct tier_array;
void step_job_moments(const struct strata_engine *e, size_t first, void *m, void *v, struct tier_array *m_scale,
                      struct tier_array *v_scale, int64_t step, adam_job *job);
/* Updates applied (or in flight); a checkpoint saves and restores it. */
int64_t step_count(const step_pipeline *sp);
void step_set_count(step_pipeline *sp, int64_t count);

#endif
