/*
 * A small synthetic trainer that uses strata only through include/strata.h: a stack of tanh
 * layers y = tanh(W x + b), squared-error loss, fetch/release in forward, fetch/grads/release in
 * backward, micro-batches, strata_step. Deterministic for a seed, so two engine configurations that
 * are meant to be equivalent must end with bit-identical master weights.
 */
#ifndef STRATA_TEST_SYNTH_H
#define STRATA_TEST_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "strata.h"

#define SYNTH_MAX_LAYERS 16
#define SYNTH_MAX_GROUPS 4

/* Optimizer parameter groups: groups 1..n added with hp[0..n), parameter p (2l: layer l's weight, 2l + 1: its bias)
 * put in group of_param[p] (0: the config's group). With lr_decay, group g's lr of step s is its lr * lr_decay^s, set
 * with strata_group_set before each step. */
typedef struct synth_groups {
    int n;
    strata_group_hparams hp[SYNTH_MAX_GROUPS];
    int of_param[2 * SYNTH_MAX_LAYERS];
} synth_groups;

typedef struct synth_opts {
    int layers;
    int width[SYNTH_MAX_LAYERS + 1];  /* width[0] = input, width[l+1] = output of layer l */
    int batch;
    int micro_batches;                /* gradient accumulation */
    int steps;
    uint64_t seed;
    bool declare_order;               /* strata_module_order instead of recording */
    int diverge_at_step;              /* 0 = never; else that step fetches in a different order */
    double lr_decay;                  /* lr of step s = cfg lr * lr_decay^s (0 = constant) */
    const synth_groups *groups;       /* NULL: one group */
    uint32_t frozen_layers;           /* bit l: layer l's module is frozen (strata_module_freeze): backward passes
                                         through it without taking or handing over its gradients */
    /* Checkpoints (all off when zero): */
    int first_step;                   /* the first step's index (data and lr continue from there) */
    const char *load_dir;             /* strata_load from here right after finalize */
    const char *save_dir;             /* strata_save here after step index save_after - 1 ... */
    int save_after;                   /* ... i.e. once save_after steps (counted from 0) are done */
    double *final_loss_scale;         /* when not NULL: receives strata_loss_scale() after the last step */
    double *grad_norms;               /* when not NULL: receives each step's strata_step_result.grad_norm */
    /* Ranks (world 1 when comm is NULL): the engine is one rank of comm's world, and this rank's micro-batch
     * mb of a step is the global micro-batch mb * world + rank, so N ranks with k micro-batches each see
     * the batches one rank sees with N * k. */
    strata_comm *comm;
    /* Gradients on a grid where fp32 sums of up to 16 micro-batches are exact in any order (multiples of 2^-26,
     * clamped to +-2^-6): N ranks summing in the reduce-scatter's order then match one rank bit for bit. */
    bool exact_sums;
    /* strata.norm_pass (cfg->norm_pass): every step runs its backward twice, strata_norm_pass_end between. At step
     * norm_pass_differ_at (1-based; 0 = never) the second backward's gradients of the last layer, the first handed
     * over, differ from the first's in one element: that strata_step must fail before anything is updated; its error
     * goes to norm_pass_error (when not NULL, 1024 bytes) and the step is run again, unchanged. */
    int norm_pass_differ_at;
    char *norm_pass_error;
} synth_opts;

/* Trains with cfg and returns every parameter's master weights concatenated (malloc'd) in *weights,
 * their count in *n, and the loss of each step in losses[0..steps) when losses is not NULL. */
strata_status synth_train(const synth_opts *o, const strata_config *cfg, float **weights, size_t *n, double *losses,
                          strata_stats *stats);

/* The model's engine alone, created and finalized with its initial values (modules "layer<l>" holding
 * parameters "weight" and "bias", ids in that order), for tests that drive it themselves. */
strata_status synth_engine(const synth_opts *o, const strata_config *cfg, strata_engine **out);

/* A host-backend configuration for it: 64 MiB device and 1 GiB host budgets, dtype parameters, two Adam
 * threads, sub-groups of 12288 elements (several per model, so the step pipeline pipelines), 64 KiB aio blocks,
 * lr 1e-2 with weight decay 0.05. Tests change what they are about. */
strata_config synth_config(strata_dtype dtype);

/* Gives the parameters' and/or the optimizer state's offload block dir as its one nvme_path; their tiers stay. */
void synth_nvme_path(strata_config *c, const char *dir, bool params, bool optimizer);

/* Homes the parameters and/or the optimizer state on `tier` (STRATA_TIER_NVME, or STRATA_TIER_AUTO: the planner
 * chooses, NVMe among its choices) with dir as their one nvme_path; nothing else changes. */
void synth_offload(strata_config *c, strata_tier tier, const char *dir, bool params, bool optimizer);

/* Places the parameters and/or the optimizer state on NVMe, with dir as their one nvme_path; with the optimizer
 * state, the gradient store too (strata.gradients_on_nvme = true); the host cache off (reads reach the drive). */
void synth_use_nvme(strata_config *c, const char *dir, bool params, bool optimizer);

/* The placements the equivalence-style tests sweep: everything on the device tier, optimizer on host,
 * parameters and optimizer on host, both on NVMe under nvme_dir (the gradient store in host memory, where it
 * fits) with the host cache off, mirroring all of it, and mirroring some parameter modules, and NVMe with a
 * device budget of two modules (the gradient store on NVMe too, no host cache; nothing stays resident, nothing
 * is prefetched: every fetch is a demand fetch from NVMe). */
typedef struct synth_placement {
    const char *name;
    void (*apply)(strata_config *c, const char *nvme_dir);
} synth_placement;
extern const synth_placement synth_placements[];
extern const size_t synth_placement_count;

/* Fresh random byte tokens and targets (n each) for the GPT model tests. */
void synth_rand_tokens(int32_t *tokens, int32_t *targets, size_t n);

/* How many of n floats differ bitwise; *first is the first index (n when none). */
size_t synth_count_diff(const float *a, const float *b, size_t n, size_t *first);

/* Sensible small defaults: 4 layers of widths 24..80, batch 6, 2 micro-batches, 4 steps. */
void synth_defaults(synth_opts *o, uint64_t seed);

/* The deterministic initial value of element i of parameter `index` (what the init callback writes). */
float synth_init_value(uint64_t seed, int index, size_t i);

/* The math, for an independent reference: the batch of (step, micro-batch), one layer forward,
 * the loss gradient (times scale), one layer backward (dout is consumed; din receives the input
 * gradient; gW/gb are overwritten). Weights are fp32 arrays. */
void synth_batch(const synth_opts *o, int step, int mb, float *input, float *target);
void synth_layer_forward(const synth_opts *o, int l, const float *W, const float *b, const float *in, float *out);
double synth_loss_grad(const synth_opts *o, const float *y, const float *target, float scale, float *dy);
void synth_layer_backward(const synth_opts *o, int l, const float *W, const float *in, const float *out, float *dout,
                          float *din, float *gW, float *gb);

#endif
