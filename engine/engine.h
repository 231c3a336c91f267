/*
 * The engine object: what every engine/ file reaches through its handle.
 *
 * Layout. Every module's parameters are one contiguous, padded range [offset, offset + numel) of a
 * flat per-rank partition of `total_numel` elements. Each state class is one tier_array over that
 * partition: the parameters (param dtype), the fp32 gradients, master weights and Adam moments.
 * A module fetch moves one range of the parameter array; an optimizer sub-group is one range of all
 * arrays. Ranges start on ENGINE_MODULE_ALIGN elements, which keeps every NVMe transfer 4 KiB-aligned
 * for every dtype.
 */
#ifndef STRATA_ENGINE_ENGINE_H
#define STRATA_ENGINE_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>

#include "base/error.h"
#include "cpu_adam/adam.h"
#include "gpu/device.h"
#include "nvme/io.h"
#include "nvme/swap.h"
#include "offload/pool.h"
#include "offload/tier_array.h"
#include "engine/plan.h"
#include "engine/trace.h"
#include "strata.h"

#define ENGINE_NAME_BYTES 128
#define ENGINE_MODULE_ALIGN PLAN_MODULE_ALIGN /* see plan_module_layout() */

typedef struct step_slots step_slots;

typedef struct eng_param {
    char name[ENGINE_NAME_BYTES];
    strata_module_id module;
    size_t numel;
    size_t offset;                 /* in the flat partition (after finalize) */
    strata_init_fn init;
    void *init_ctx;
} eng_param;

typedef enum mod_state {
    MOD_ABSENT = 0,  /* no device copy */
    MOD_LOADING,     /* a fetch is in flight: NVMe read and/or host->device copy */
    MOD_RESIDENT,    /* the device copy is valid */
} mod_state;

typedef struct eng_module {
    struct strata_engine *engine;  /* for callbacks that only get the module */
    char name[ENGINE_NAME_BYTES];
    strata_param_id *params;
    size_t nparams, cap;
    size_t offset, numel;          /* flat range, padded to ENGINE_MODULE_ALIGN */
    size_t used_numel;             /* elements that belong to parameters (without the tail padding) */
    bool persistent;               /* below the persistence threshold: stays resident */

    mod_state state;
    bool held;                     /* fetched and not yet released */
    void *dev;                     /* the device copy (or the device-tier array itself) */
    bool dev_owned;                /* dev was carved for this fetch and is freed on eviction */
    void *staging;                 /* pinned buffer of an NVMe fetch */
    io_wait io;                    /* the NVMe read of a fetch; its completion queues the copy */
    bool copy_queued;              /* the read landed and the copy was queued (under fetch_lock) */
    strata_status fetch_status;    /* a failed read or copy queueing (under fetch_lock) */
    char fetch_msg[ERR_MSG_BYTES];
    dev_event *ready;              /* recorded after the host->device copy */
    dev_event *grads_written;      /* recorded on the compute stream at grads_ready */
    size_t fetch_bytes;            /* counted in flight / resident */
    uint64_t issue_ns, loaded_ns;  /* when the fetch was queued / its copy finished (trace) */

    void *grad_dev;                /* device gradient buffer, while the trainer fills it */
    bool grad_pending;             /* grads_ready queued, accumulation not yet confirmed */
} eng_module;

/* A device buffer that becomes free once an event has completed. */
typedef struct deferred_free {
    void *ptr;
    dev_event *after;
    bool pinned;                   /* a pinned-pool buffer rather than device memory */
} deferred_free;

/* One gradient hand-off in flight on the d2h stream. */
typedef struct grad_job {
    struct strata_engine *engine;
    eng_module *module;
    void *staging;                 /* pinned copy of the device gradients */
    tier_array *store;             /* the fp32 gradient store it accumulates into */
    bool first;                    /* the module's first gradients this step: overwrite */
    uint64_t submit_ns;
    struct grad_job *next;
} grad_job;

typedef struct eng_counters {
    _Atomic uint64_t nvme_to_host, host_to_device, device_to_host, host_to_nvme;
    _Atomic uint64_t adam_ns, step_io_wait_ns;
} eng_counters;

struct strata_engine {
    strata_config cfg;              /* validated copy of the caller's config */
    strata_backend_kind backend;    /* resolved: never AUTO */
    err_slot err;                   /* strata_last_error(engine) */
    bool finalized;

    /* registry */
    eng_module *modules;
    size_t nmodules, modules_cap;
    eng_param *params;
    size_t nparams, params_cap;
    size_t total_numel;             /* the padded flat partition */
    size_t largest_module_numel;

    /* devices and tiers */
    device *dev;
    dev_stream *h2d, *d2h, *copy, *upd; /* fetches, gradients, sync copies, parameter updates */
    dev_stream *compute;            /* the trainer's: a CUDA stream, or the caller's thread (host backend) */
    nvme_io *io;
    nvme_swap *swap;
    pinned_pool *pool;
    tier_env env;
    size_t param_bytes;             /* bytes of one parameter element */
    strata_tier param_tier, opt_tier, grad_tier;
    tier_array param[2];            /* [front, back] with the delayed update, else param[0] only */
    int param_front;                /* index the trainer's fetches read */
    tier_array grad[2];             /* fp32 gradient stores: [accumulating, being consumed] */
    int grad_front;
    tier_array master, exp_avg, exp_avg_sq;
    struct step_slots *step_slots;  /* the optimizer's pinned slots, kept between steps (step.c) */
    uint8_t *grad_touched[2];       /* per grad store, per module: gradients arrived since its last step */

    /* fetch window */
    size_t prefetch_bytes, max_live_bytes;
    size_t inflight_bytes, resident_bytes;
    strata_module_id *order;        /* the fetch order of one step (declared or recorded) */
    size_t order_len, order_cap;
    bool order_declared, order_valid, order_warned;
    strata_module_id *rec;          /* this step's fetches so far */
    size_t rec_len, rec_cap;
    size_t order_pos;
    pthread_mutex_t fetch_lock;     /* NVMe fetch completions arrive on I/O threads */
    pthread_cond_t fetch_cv;
    deferred_free *frees;
    size_t nfrees, frees_cap;
    grad_job *grad_jobs;            /* in flight, in submission order */
    pthread_mutex_t grad_lock;
    strata_status grad_status;      /* first failure of an accumulation, reported at the next call */
    char grad_msg[ERR_MSG_BYTES];

    /* optimizer */
    const adam_ops *adam;
    int adam_threads;
    int64_t adam_step;              /* updates applied (or in flight) */
    double loss_scale;
    int good_steps, hysteresis_left;
    pthread_t opt_thread;
    bool opt_thread_running;
    pthread_mutex_t opt_lock;
    pthread_cond_t opt_cv;
    bool opt_job_pending, opt_job_done, opt_job_in_flight, opt_quit;
    double opt_job_lr, opt_job_scale;
    int opt_job_grad, opt_job_param;
    strata_status opt_job_status;
    char opt_job_msg[ERR_MSG_BYTES];
    strata_step_result opt_job_result;
    int64_t steps_called;

    trace *trace;                   /* strata.trace_path, or NULL */

    /* stats */
    eng_counters ctr;
    uint64_t fetches, prefetch_hits, stall_ns, step_ns, steps, skipped_steps;
    size_t host_tier_bytes;

    /* checkpoints (checkpoint.c) */
    bool ckpt_incomplete;           /* a strata_load failed half-way: the state is a mix; steps refuse */
};

/* ---------------------------------------------------------------- shared between engine/ files */

/* STRATA_ESTATE unless finalize has run (what names the call). */
strata_status engine_require_finalized(strata_engine *e, const char *what);

eng_module *engine_module(strata_engine *e, strata_module_id id, const char *what);
eng_param *engine_param(strata_engine *e, strata_param_id id, const char *what);
/* The parameter if its module is held; else NULL with STRATA_ESTATE in the thread's error. */
eng_param *engine_held_param(strata_engine *e, strata_param_id id, const char *what);

/* Recording of the fetch order (registry.c). */
bool registry_record(strata_engine *e, strata_module_id id);
void registry_adopt_recording(strata_engine *e);

/* Fetch machinery (fetch.c). */
/* Starts a fetch; a demand fetch (the trainer waits for it) may wait for prefetches to make room. */
strata_status fetch_start(strata_engine *e, eng_module *m, bool demand);
strata_status fetch_drop(strata_engine *e, eng_module *m);
void fetch_invalidate_all(strata_engine *e);
/* Starts fetches of the modules that come next in the order, within the window. */
strata_status fetch_prefetch(strata_engine *e);
void fetch_step_boundary(strata_engine *e);
strata_status engine_process_frees(strata_engine *e, bool wait);
strata_status engine_defer_free(strata_engine *e, void *ptr, bool pinned, dev_stream *after_stream);

/* Gradients (grads.c). */
strata_status grads_drain(strata_engine *e);

/* Optimizer (step.c, step_thread.c). */
/* One optimizer step over gradient store grad_index, writing the parameters into param[param_out].
 * loss_scale is the scale the trainer's gradients carry. res->skipped on an fp16 overflow. */
strata_status step_run(strata_engine *e, double lr, double loss_scale, int grad_index, int param_out,
                       strata_step_result *res);
/* The optimizer's pinned slots keep the state of the last sub-groups a step wrote; after anything else writes
 * the optimizer state (strata_load), step_slots_forget makes the next step read it again. step_slots_free
 * waits for the slots' I/O and gives them back (engine destroy). */
void step_slots_forget(strata_engine *e);
void step_slots_free(strata_engine *e);
strata_status opt_thread_start(strata_engine *e);
void opt_thread_stop(strata_engine *e);
void opt_job_submit(strata_engine *e, double lr, double loss_scale, int grad_index, int param_out);
/* Waits for the job in flight (if any); its result goes to res, its failure to the thread's error. */
strata_status opt_job_join(strata_engine *e, strata_step_result *res, bool *had_job);
/* Waits for the job in flight (if any) without taking it: it stays for the next opt_job_join, which
 * publishes it (a checkpoint must not make an update visible early). *pending says whether there was one. */
strata_status opt_job_settle(strata_engine *e, strata_step_result *res, bool *pending);
/* Makes a finished job with result res wait for the next opt_job_join, as if it had just run (strata_load). */
void opt_job_restore(strata_engine *e, const strata_step_result *res);

#endif
