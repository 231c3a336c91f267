/*
 * The memory plan: how many bytes each tier must hold for a model of a given shape under a config,
 * with the largest module and the prefetch window in flight. strata_engine_finalize() checks it
 * against the budgets before allocating anything; `strata estimate` prints it for a model shape
 * without allocating anything. One arithmetic, two users.
 */
#ifndef STRATA_ENGINE_PLAN_H
#define STRATA_ENGINE_PLAN_H

#include <stddef.h>

#include "strata.h"

#define PLAN_MAX_LINES 24

typedef struct plan_input {
    size_t total_numel;            /* padded flat partition */
    size_t largest_module_numel;
    size_t param_bytes;            /* bytes per parameter element on the device */
    strata_tier param_tier, opt_tier, grad_tier;
    bool delayed;                  /* double-buffered parameters and gradient stores */
    size_t sub_group_numel;
    size_t prefetch_bytes, max_live_bytes;
    size_t activation_bytes;       /* reserved for the trainer's strata_device_alloc */
    /* A data-parallel world: the plan is then per rank. world_size 0 means 1 (callers from before ranks).
     * From zero_stage 1 the optimizer state, from 2 also the gradient store, from 3 also the parameters'
     * home hold only shard_numel elements: this rank's slice of the flat partition, summed over modules
     * (0 = align_up(ceil(total_numel / world_size), PLAN_MODULE_ALIGN)). The device still holds whole
     * modules while they are fetched, so the largest module and the prefetch window stay whole. */
    int world_size;
    int zero_stage;
    size_t shard_numel;
    /* With frozen modules (registry.h: parameters only), the gradient and optimizer classes hold the trained modules'
     * trained_numel elements (shard_trained_numel in this rank's shard); without, everything is trained. */
    bool frozen;
    size_t trained_numel, shard_trained_numel;
    size_t largest_trained_numel;  /* with frozen modules: the largest trained module, whose gradients are the most a
                                      hand-off buffers (frozen ones take none) */
    /* The optimizer's device share (offload_optimizer.ratio < 1, engine/step/twin_flow.h): elements whose master weights
     * and moments (unless opt_tier is the device already), gradients and, when parameters live elsewhere, a
     * parameter scratch are in device memory. The host arrays keep their full size. */
    size_t opt_device_numel;
    /* strata.step_in_backward: no gradient store (each module's update reads its gradients from the staging), and
     * the step's pinned buffers are one piece's master weights, moments and parameter staging
     * (engine/step/step_in_backward.c). */
    bool step_in_backward;
    /* With gradient clipping or fp16 too, unless strata.norm_pass measures the norm first (cfg_speculates), the
     * updates speculate (engine/step/step_rollback.h): a second copy of master weights and moments in the optimizer
     * state's tier, and no host cache of the optimizer state (its copies trade places every step); with clipping
     * (keep_grads) also the gradients kept for a redo (parameter dtype, fp32 with ranks) there or in host memory
     * (plan.kept_tier), and one piece of them pinned for a read-back from NVMe. */
    bool speculate, keep_grads;
    /* Offloaded activations (strata_act_push): their tier (DEVICE: none), what the trainer keeps at once and the
     * largest one (engine/act_store.h). */
    strata_tier act_tier;
    size_t act_bytes, act_max_bytes;
    /* strata.optimizer_moments: the moments' bytes per element in the optimizer's tier (plan_opt_elem_bytes), and for
     * 8-bit their block scales, which live in host memory whatever that tier (NVMe moves whole 4 KiB pages; a
     * sub-group's scales are a few bytes). */
    strata_moments moments;
} plan_input;

typedef struct plan_line {
    const char *what;
    strata_tier tier;
    size_t bytes;
    bool pinned_pool;              /* part of the pinned pool (host tier) */
} plan_line;

typedef struct plan {
    plan_line lines[PLAN_MAX_LINES];
    int nlines;
    size_t tier_bytes[3];          /* indexed by strata_tier */
    size_t pinned_pool_bytes;
    size_t pool_part_bytes[4];     /* fetch staging, gradient staging, accumulation, step (offload/pool.h) */
    size_t live_window_bytes;      /* device bytes for fetched modules and gradient buffers */
    /* The host cache of NVMe-homed state (plan_host_cache): bytes it may mirror of the parameters (every copy) and
     * of the optimizer state, and what there is on NVMe of each. */
    size_t cache_param_bytes, cache_opt_bytes;
    size_t nvme_param_bytes, nvme_opt_bytes;
    /* Where a speculating step in backward keeps its gradients (keep_grads): with the optimizer state, or host memory
     * when that is NVMe and the host budget holds them after the parameters' cache (plan_host_cache). */
    strata_tier kept_tier;
    size_t act_window_bytes;       /* device bytes for restored activations (act_store.c) */
} plan;

/* The gradient store's tier once the optimizer state's is known (plan_place chooses both homes): host memory, or
 * NVMe when the optimizer state is there and strata.gradients_on_nvme is true; with gradients_on_nvme auto this
 * first answer is host, and plan_choose_grad_tier settles it once the sizes are known. */
strata_tier plan_grad_tier(const strata_config *cfg, strata_tier opt_tier);

/* The nvme_paths the swap space spans: those of every block placed on NVMe, or that "auto" may place there, each
 * path once. Fills paths (pointers into cfg) and returns how many. (A finalized engine's config holds the tiers
 * auto chose, never "auto".) */
#define PLAN_MAX_SWAP_PATHS (2 * STRATA_MAX_NVME_PATHS)
int plan_swap_paths(const strata_config *cfg, const char *paths[PLAN_MAX_SWAP_PATHS]);

/* Offloaded activations: every one kept takes its bytes rounded up to PLAN_ACT_ALIGN in its tier (NVMe moves whole
 * pages), and the device holds PLAN_ACT_RESTORED of the largest at once while restoring (the one in use and the
 * next, prefetched); with NVMe, PLAN_ACT_STAGING pinned buffers of the largest stage the copies (two written,
 * two read). */
#define PLAN_ACT_ALIGN ((size_t)4096)
#define PLAN_ACT_RESTORED 2
#define PLAN_ACT_STAGING 4
/* The largest activation a config allows (strata.offload_activations.max_bytes, 0 = bytes). */
size_t plan_act_max_bytes(const strata_config *cfg);
/* The device bytes of the restore window for activations of at most max_bytes. */
size_t plan_act_window_bytes(size_t max_bytes);

/* The prefetch window and the device residency cap of a config, in bytes. */
void plan_windows(const strata_config *cfg, size_t param_bytes, size_t *prefetch_bytes, size_t *max_live_bytes);

/* The layout rules, in one place: parameters start on PLAN_PARAM_ALIGN elements within their module
 * (device pointers stay 256-byte aligned), modules on PLAN_MODULE_ALIGN elements of the flat partition
 * (>= 4 KiB for any dtype, so NVMe transfers stay aligned), and a parameter whose optimizer group differs from
 * the one before it on PLAN_GROUP_ALIGN elements (one 8-bit moments block: no block, tile alignment or streaming
 * store spans two groups, and shards, cut on PLAN_MODULE_ALIGN, keep the boundaries aligned). Returns the padded
 * numel of a module whose parameters have the given sizes and groups (group may be NULL: all in one), and the
 * offset of each within it (offsets may be NULL). */
#define PLAN_PARAM_ALIGN ((size_t)128)
#define PLAN_GROUP_ALIGN ((size_t)2048)
#define PLAN_MODULE_ALIGN ((size_t)4096)
size_t plan_module_layout(const size_t *param_numel, const uint32_t *group, size_t nparams, size_t *offsets,
                          size_t *used_numel);

/* Bytes per element of the optimizer state in its tier: fp32 master weights and two moments in their form (12, 8,
 * 6), and the host bytes of the 8-bit moments' block scales for numel elements (0 for the other forms). */
size_t plan_opt_elem_bytes(strata_moments moments);
size_t plan_moment_scale_bytes(strata_moments moments, size_t numel);

/* The elements of each state class this rank keeps under in (the whole partition for one rank). */
void plan_class_numel(const plan_input *in, size_t *param_numel, size_t *grad_numel, size_t *opt_numel);

void plan_compute(const plan_input *in, plan *out);

/* With gradients_on_nvme auto and the optimizer state on NVMe: keeps in->grad_tier on the host when the plan's
 * host bytes fit host_budget, else moves it to NVMe; then computes the plan into out. */
void plan_choose_grad_tier(const strata_config *cfg, plan_input *in, size_t host_budget, plan *out);

/* The host cache (strata.host_cache): once p fits host_budget, what is left of it mirrors NVMe-homed state, first
 * the parameters (read at every fetch: twice per micro-batch), at most param_max_in_cpu elements of each copy,
 * then the optimizer state (read once per step). Adds its lines to p's host tier; nothing when the cache is off,
 * nothing is on NVMe, or p already exceeds host_budget. */
void plan_host_cache(const strata_config *cfg, const plan_input *in, size_t host_budget, plan *p);

/* STRATA_EBUDGET naming the tier, what the plan needs line by line, what is allowed and the knob
 * to change; STRATA_OK when every tier fits. device_budget/host_budget in bytes, per rank. */
strata_status plan_check(const plan *p, const plan_input *in, size_t device_budget, size_t host_budget);

/* The host budget a config means (0 = 3/4 of physical memory). */
size_t plan_host_budget(const strata_config *cfg);

#endif
