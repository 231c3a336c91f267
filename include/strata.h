/*
 * strata.h — the only public header of strata, a tiered memory engine for
 * training models whose state does not fit in GPU memory.
 *
 * Conventions (they hold for every function below unless its comment says otherwise):
 *  - Every function returns a strata_status; STRATA_OK is 0. The human-readable
 *    detail of the last failure is kept per handle (strata_last_error(engine),
 *    strata_aio_last_error(aio)); calls that take no handle keep it per thread,
 *    read with strata_last_error(NULL).
 *  - Out-parameters are set to NULL (or zero) on failure. destroy(NULL) is a no-op.
 *  - Sizes carry their unit in the name (_bytes, _ns); element counts are numel.
 *  - An engine is driven from one thread. Functions that are safe to call from
 *    several threads at once say so.
 */
#ifndef STRATA_H
#define STRATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define STRATA_API __attribute__((visibility("default")))
#else
#define STRATA_API
#endif

/* ------------------------------------------------------------------ version */

#define STRATA_VERSION_MAJOR 0
#define STRATA_VERSION_MINOR 1
#define STRATA_VERSION_PATCH 0
/* One number that compares: 0.1.0 -> 100, 1.2.3 -> 10203. */
#define STRATA_VERSION_CODE (STRATA_VERSION_MAJOR * 10000 + STRATA_VERSION_MINOR * 100 + STRATA_VERSION_PATCH)

/* The version of the library actually loaded, as "MAJOR.MINOR.PATCH" (static storage). */
STRATA_API const char *strata_version(void);

/* ------------------------------------------------------------------ status */

/* X(name, value, description). One list: the enum and strata_status_str() are both made from it. */
#define STRATA_STATUS_LIST(X)                                                        \
    X(STRATA_OK,           0, "success")                                           \
    X(STRATA_EINVAL,       1, "invalid argument")                                  \
    X(STRATA_ENOMEM,       2, "out of host memory")                                \
    X(STRATA_EBUDGET,      3, "memory budget exceeded")                            \
    X(STRATA_ESTATE,       4, "call not allowed in the current state")             \
    X(STRATA_ECONFIG,      5, "invalid configuration")                             \
    X(STRATA_EIO,          6, "I/O error")                                         \
    X(STRATA_ENOSPC,       7, "no space left on device")                           \
    X(STRATA_ECORRUPT,     8, "data failed validation (corrupt or truncated)")     \
    X(STRATA_EDEVICE,      9, "device (GPU) error")                                \
    X(STRATA_EUNSUPPORTED, 10, "not supported on this machine or build")           \
    X(STRATA_ENOTFOUND,    11, "not found")                                        \
    X(STRATA_EBUSY,        12, "work still in flight")                             \
    X(STRATA_ECANCELED,    13, "canceled")                                         \
    X(STRATA_EINTERNAL,    14, "internal error (a bug in strata; please report it)") \
    X(STRATA_ECOMM,        15, "collective communication failed (a rank failed, timed out or disagreed)")

typedef enum strata_status {
#define STRATA_STATUS_ENUM_(name, value, text) name = value,
    STRATA_STATUS_LIST(STRATA_STATUS_ENUM_)
#undef STRATA_STATUS_ENUM_
} strata_status;

/* A short description of a status, e.g. "I/O error". Never NULL; unknown values give "unknown status". */
STRATA_API const char *strata_status_str(strata_status status);

/* The name of a status, e.g. "STRATA_EIO". Never NULL; "STRATA_E?" for a value outside the list, so that a binding
 * can enumerate the statuses by asking for 0, 1, ... until that answer (the Python package names its errors so). */
STRATA_API const char *strata_status_name(strata_status status);

/* ------------------------------------------------------------------ logging */

typedef enum strata_log_level {
    STRATA_LOG_OFF = 0,
    STRATA_LOG_ERROR,
    STRATA_LOG_WARN,
    STRATA_LOG_INFO,
    STRATA_LOG_DEBUG,
    STRATA_LOG_TRACE,
} strata_log_level;

/* Receives every message that passes the level and subsystem filters.
 * subsystem is a short name ("io", "adam", "config", ...); message has no trailing newline.
 * May be called from strata's own threads, concurrently: the callback must be thread-safe. */
typedef void (*strata_log_fn)(strata_log_level level, const char *subsystem, const char *message, void *user);

/* Installs a log callback (NULL restores printing to stderr). Thread-safe. */
STRATA_API void strata_log_set_callback(strata_log_fn fn, void *user);

/* Sets the level, overriding STRATA_LOG. The default is STRATA_LOG_WARN. Thread-safe. */
STRATA_API void strata_log_set_level(strata_log_level level);

/* Restricts messages to a comma-separated subsystem list ("io,adam"), overriding STRATA_LOG_SUBSYS;
 * NULL or "all" allows every subsystem. STRATA_EINVAL (detail per thread) names an unknown subsystem. */
STRATA_API strata_status strata_log_set_subsystems(const char *list);

/* ------------------------------------------------------------------ configuration */

/* Where a class of model state lives. DeepSpeed's offload "device" words map as none->DEVICE, cpu->HOST. */
typedef enum strata_tier {
    STRATA_TIER_DEVICE = 0,
    STRATA_TIER_HOST,
    STRATA_TIER_NVME,
    STRATA_TIER_AUTO, /* only in a config ("auto"): the planner chooses the fastest placement that fits the budgets */
} strata_tier;

typedef enum strata_backend_kind {
    STRATA_BACKEND_AUTO = 0, /* CUDA when a device answers, else host */
    STRATA_BACKEND_HOST,     /* device memory is host memory counted against the device budget */
    STRATA_BACKEND_CUDA,
} strata_backend_kind;

typedef enum strata_dtype {
    STRATA_DTYPE_FP32 = 0,
    STRATA_DTYPE_BF16,
    STRATA_DTYPE_FP16,
    STRATA_DTYPE_NONE, /* "no output" where an output copy is optional */
} strata_dtype;

/* "fp32", "bf16", "fp16", "none" ("?" for a value outside the enum). Static storage; thread-safe. */
STRATA_API const char *strata_dtype_name(strata_dtype dtype);
/* Bytes of one element: 4, 2, 2, 0 (and 0 outside the enum). Thread-safe. */
STRATA_API size_t strata_dtype_bytes(strata_dtype dtype);
/* "device", "host", "nvme", "auto" ("?" outside the enum). Static storage; thread-safe. */
STRATA_API const char *strata_tier_name(strata_tier tier);
/* "auto", "host", "cuda" ("?" outside the enum). Static storage; thread-safe. */
STRATA_API const char *strata_backend_name(strata_backend_kind backend);
/* Converts count elements of src (src_dtype) into dst (dst_dtype) with strata's one rounding rule, the one the engine
 * stores with: narrowing to bf16 or fp16 rounds to nearest even, overflows to infinity, keeps subnormals and keeps a
 * NaN a NaN (PyTorch's canonical quiet NaN with the sign kept; the payload is not kept); widening to fp32 is exact.
 * Any pair of fp32, bf16 and fp16 converts (bf16 <-> fp16 through an exact fp32). Equal dtypes copy, and only then
 * may the regions overlap. Large counts run on OpenMP threads. STRATA_EINVAL for NULL buffers with count > 0 or a
 * dtype that stores no elements (none, or outside the enum). Detail per thread (strata_last_error(NULL)).
 * Thread-safe. */
STRATA_API strata_status strata_convert(void *dst, strata_dtype dst_dtype, const void *src, strata_dtype src_dtype,
                                        size_t count);

typedef enum strata_optimizer_kind {
    STRATA_OPTIMIZER_ADAMW = 0, /* decoupled weight decay (torch.optim.AdamW) */
    STRATA_OPTIMIZER_ADAM,      /* L2 weight decay added to the gradient (torch.optim.Adam) */
} strata_optimizer_kind;

/* How Adam updates its first moment (strata.adam_first_moment). The two round differently, and Adam amplifies
 * a one-rounding difference through near-zero gradients, so a trainer that must match a torch bit for bit picks
 * the formula of that torch. */
typedef enum strata_adam_formula {
    STRATA_ADAM_MUL_ADD = 0, /* "mul_add": exp_avg.mul_(beta1).add_(grad, alpha=1-beta1): torch < 2.0 */
    STRATA_ADAM_LERP,        /* "lerp": exp_avg.lerp_(grad, 1-beta1): torch >= 2.0 */
} strata_adam_formula;

/* How the ranks' gradients are combined (strata.gradient_reduction). */
typedef enum strata_grad_reduction {
    STRATA_REDUCE_SUM = 0,  /* the sum over ranks: a trainer divides its loss by the global batch itself */
    STRATA_REDUCE_MEAN,     /* the mean over ranks (DeepSpeed's and DDP's rule): the sum times 1 / world size */
} strata_grad_reduction;

typedef enum strata_switch {
    STRATA_SWITCH_AUTO = 0, /* use it when the machine allows, else fall back and say so */
    STRATA_SWITCH_ON,       /* demand it: fail if the machine does not allow it */
    STRATA_SWITCH_OFF,
} strata_switch;

/* How Adam's moments (exp_avg m, exp_avg_sq v) are stored in every tier (strata.optimizer_moments); the master
 * weights stay fp32 in every form. */
typedef enum strata_moments {
    STRATA_MOMENTS_FP32 = 0, /* 4 bytes each (the default) */
    STRATA_MOMENTS_BF16,     /* 2 bytes each, narrowed with stochastic rounding every step */
    STRATA_MOMENTS_8BIT,     /* 1 byte each plus one fp32 scale per 2048 elements (block-wise, bitsandbytes' maps) */
} strata_moments;

#define STRATA_MAX_NVME_PATHS 8
/* A count setting with no cap (param_max_in_cpu): larger than any model, and inside the config's range check. */
#define STRATA_NO_CAP ((size_t)1 << 62)
#define STRATA_PATH_BYTES 512

/* Where offloaded state of one kind goes (DeepSpeed's offload_param / offload_optimizer). */
typedef struct strata_offload_config {
    strata_tier device;                                         /* none | cpu | nvme | auto */
    char nvme_path[STRATA_MAX_NVME_PATHS][STRATA_PATH_BYTES];   /* several paths are striped (RAID-0) */
    int nvme_path_count;
    bool pipeline_read;                                         /* overlap NVMe reads with Adam (optimizer only) */
    bool pipeline_write;                                        /* overlap NVMe writes with Adam (optimizer only) */
} strata_offload_config;

/* The NVMe I/O engine's settings (DeepSpeed's "aio" block plus strata's own). */
typedef struct strata_aio_config {
    size_t block_size;          /* bytes per request piece */
    int queue_depth;            /* requests in flight per ring */
    int intra_op_parallelism;   /* I/O threads, each with its own ring ("thread_count" is the old name) */
    bool single_submit;         /* submit one request per syscall instead of batches */
    bool overlap_events;        /* keep submitting while completions are reaped */
    strata_switch direct;       /* O_DIRECT: auto falls back to buffered I/O where refused */
    strata_switch sqpoll;       /* kernel submission-queue polling thread; auto = off unless permitted */
} strata_aio_config;

/* The whole configuration. Fill it with strata_config_init(), then change fields from C or load a JSON file
 * over it.
 *
 * Versioning: strata_config only ever grows at its end, and struct_size (set by strata_config_init from the
 * caller's own sizeof) tells the library how much of it the caller's program knows. Every function that takes
 * a strata_config reads (and strata_config_load_json writes) only that prefix; fields added after it take their
 * defaults. So a program built against an older strata.h keeps working with a newer library; a program built
 * against a newer header than the library is refused with STRATA_EINVAL / STRATA_ECONFIG naming both sizes.
 * The layout of 0.1 is the first under the rule; the fields from lr_exact on were added to it since. */
typedef struct strata_config {
    uint32_t struct_size;       /* sizeof(strata_config) at the caller's compile time; set by init */

    /* zero_optimization */
    int zero_stage;                          /* 0..3; world size 1 partitions trivially */
    strata_offload_config offload_param;
    strata_offload_config offload_optimizer;
    size_t sub_group_size;                   /* elements per optimizer sub-group */
    size_t prefetch_bucket_size;             /* elements fetched ahead (stage3_prefetch_bucket_size) */
    size_t max_live_parameters;              /* elements resident at once (stage3_max_live_parameters) */
    size_t param_persistence_threshold;      /* params with fewer elements stay resident */

    strata_aio_config aio;

    /* optimizer */
    strata_optimizer_kind optimizer;
    float lr, beta1, beta2, eps, weight_decay;
    bool bias_correction;

    /* precision: the device dtype of parameters and gradients */
    strata_dtype param_dtype;                /* fp32, bf16 (bf16.enabled) or fp16 (fp16.enabled) */
    double loss_scale;                       /* fp16: 0 = dynamic */
    int initial_scale_power;                 /* fp16 dynamic: initial scale = 2^power */
    int loss_scale_window;                   /* fp16 dynamic: steps without overflow before growing */
    int hysteresis;                          /* fp16 dynamic: overflows tolerated before shrinking */
    double min_loss_scale;
    double gradient_clipping;                /* max global L2 norm; 0 = off */

    /* strata's own section */
    strata_backend_kind backend;
    int device_id;
    size_t device_budget_bytes;              /* 0 = all free device memory */
    size_t host_budget_bytes;                /* 0 = 3/4 of physical RAM */
    size_t prefetch_bytes;                   /* 0 = derived from prefetch_bucket_size */
    size_t max_live_bytes;                   /* 0 = derived from max_live_parameters */
    size_t activation_bytes;                 /* device memory reserved for the trainer (strata_device_alloc) */
    int cpu_threads;                         /* OpenMP threads for Adam; 0 = cores of this process */
    bool delayed_update;                     /* ZeRO-Offload's one-step-delayed optimizer step */
    int delayed_warmup_steps;                /* steps run undelayed first */
    char trace_path[STRATA_PATH_BYTES];      /* Chrome trace-event JSON; "" = no trace; with several ranks, rank
                                                r > 0 writes trace_path.rank<r> */
    bool swap_checksum;                      /* crc32c per swap extent, checked on read */
    strata_switch gradients_on_nvme;         /* with the optimizer state on NVMe: auto = only when the host
                                                budget cannot hold the fp32 gradient store */
    bool ignore_unimplemented;               /* warn (instead of fail) on DeepSpeed keys strata lacks */

    /* Added after the 0.1 layout. The optimizer's hyperparameters as the JSON gave them, in double precision: the CPU Adam
     * computes its constants (1 - beta, the bias corrections, 1 - lr * weight_decay) from these, in doubles, as
     * PyTorch does from its Python floats, so that betas such as 0.9 / 0.999 give torch's update bit for bit; the
     * fp32 fields above round them. Where a float field above no longer agrees with its double (a caller set the
     * float from C, or its struct predates these fields), the float's value is used. */
    double lr_exact, beta1_exact, beta2_exact, eps_exact, weight_decay_exact;
    /* The host cache of NVMe-homed state: what the host budget leaves once the plan fits mirrors parameters (up
     * to param_max_in_cpu elements, DeepSpeed's offload_param.max_in_cpu) and then optimizer state, written
     * through, so fetches and the step read host memory instead of the drive. */
    bool host_cache;                         /* strata.host_cache; default true */
    size_t param_max_in_cpu;                 /* default STRATA_NO_CAP: only the host budget (DeepSpeed: 1e9) */
    /* Twin-Flow partial optimizer offload (offload_optimizer.ratio, DeepSpeed's meaning): the share of the optimizer's
     * sub-groups the CPU updates; the others keep their optimizer state in device memory and are updated there by the
     * device's Adam, concurrently. 1 = all on the CPU (default), 0 = all on the device. */
    double offload_optimizer_ratio;
    /* strata.step_in_backward: with gradient accumulation 1, a module's optimizer update starts as soon as its
     * gradients are complete, and the fp32 gradient store is never written. Default false. With gradient clipping
     * or fp16 the updates speculate, unless norm_pass (at the struct's end) measures the norm first. */
    bool step_in_backward;
    /* Offloaded activations (strata_act_push, below): where the activations a trainer hands strata are kept until
     * backward: STRATA_TIER_DEVICE ("none": not offloaded, pushes are refused), HOST ("cpu": pinned host memory),
     * NVME (the swap space on offload_optimizer's or offload_param's nvme_path, through pinned staging) or AUTO
     * (host memory when the host budget holds it, else NVMe). The trainer says how much it keeps at once (the
     * plan budgets that in the tier) and the largest single activation (the device holds two while restoring:
     * the one in use and the next one, prefetched). */
    strata_tier offload_activations;         /* strata.offload_activations.device; default none */
    size_t offloaded_activation_bytes;       /* strata.offload_activations.bytes: kept at once, at most */
    size_t offloaded_activation_max_bytes;   /* strata.offload_activations.max_bytes: the largest one; 0 = bytes */
    /* strata.comm_timeout_s: how long a collective waits for the other ranks before it fails (0 = forever; default
     * 120). An engine sets it on its comm when created (strata_comm_set_timeout). */
    double comm_timeout_s;
    /* strata.gradient_reduction: the gradients the optimizer sees with several ranks, the sum of the ranks' (default)
     * or their mean. The clipping norm and strata_step_result.grad_norm are those of what the optimizer sees. */
    strata_grad_reduction gradient_reduction;
    /* strata.optimizer_moments: the storage of Adam's moments in every tier (default fp32). bf16 rounds them
     * stochastically, with random bits drawn from (optimizer_moments_seed, the step count, the element), so a resumed
     * run gives the bits of an uninterrupted one; 8-bit keeps them block-wise quantized. Finalize refuses the others
     * with offload_optimizer.ratio < 1 (the device's Adam keeps fp32 moments). */
    strata_moments optimizer_moments;
    int optimizer_moments_seed;      /* strata.optimizer_moments_seed, in [0, INT_MAX]; default 0 */
    /* strata.norm_pass: with step_in_backward and gradient clipping (or fp16), the trainer runs each step's forward
     * and backward twice; the first only measures the global gradient norm (strata_norm_pass_end), so the updates
     * of the second run clipped from the start instead of speculating. Default false. */
    bool norm_pass;
    /* strata.adam_first_moment: the first moment's formula (strata_adam_formula). Default "mul_add"; strata.torch
     * sets "lerp" under torch >= 2.0. */
    strata_adam_formula adam_formula;
} strata_config;

/* Sets every field to its default (see `strata config check` for the values) and struct_size.
 * STRATA_EINVAL if cfg is NULL. Thread-safe. A macro, so that struct_size is the caller's sizeof (the
 * versioning rule above); strata_config_init_sized is the function behind it, for bindings that know
 * the size of the layout they allocate. */
#define strata_config_init(cfg) strata_config_init_sized((cfg), sizeof(strata_config))
STRATA_API strata_status strata_config_init_sized(strata_config *cfg, size_t struct_size);

/* Loads a JSON file in the DeepSpeed vocabulary (plus a "strata" section) over cfg.
 * Keys absent from the file keep cfg's values. On any error cfg is left untouched and err
 * (when non-NULL) receives every problem found, one per line, each naming the JSON path, the
 * value, what is allowed and a hint; the first line is also the thread's last error.
 * Returns STRATA_ECONFIG for content errors, STRATA_EIO when the file cannot be read. Thread-safe. */
STRATA_API strata_status strata_config_load_json(strata_config *cfg, const char *path, char *err, size_t errlen);

/* As strata_config_load_json(), from a NUL-terminated JSON text; origin names it in messages. */
STRATA_API strata_status strata_config_load_json_string(strata_config *cfg, const char *json, const char *origin,
                                                       char *err, size_t errlen);

/* Checks the relations between fields that no single key shows (for configs filled from C):
 * e.g. bf16 and fp16 together, an nvme tier without an nvme_path. Same error reporting as above. */
STRATA_API strata_status strata_config_validate(const strata_config *cfg, char *err, size_t errlen);

/* sizeof(strata_config) in this library: for bindings that allocate the struct without its C declaration
 * (they pass it to strata_config_init_sized and treat the struct as opaque). Thread-safe. */
STRATA_API size_t strata_config_size(void);

/* The resolved configuration as one JSON object, every setting under its full DeepSpeed-vocabulary path with a
 * typed value ({"zero_optimization.stage": 3, "optimizer.params.lr": 0.0006000000284984708, ...}; floats exact),
 * NUL-terminated into out. *needed (may be NULL) gets the bytes the text takes with its NUL; when outlen is
 * smaller, STRATA_EINVAL and out is untouched: call again with that size (out may be NULL with outlen 0 to ask).
 * For bindings and tools that read back what strata will do. Thread-safe. */
STRATA_API strata_status strata_config_to_json(const strata_config *cfg, char *out, size_t outlen, size_t *needed);

/* ------------------------------------------------------------------ engine */

typedef struct strata_engine strata_engine;

/* Creates an engine from a validated copy of cfg and chooses its device backend
 * (cfg->backend; AUTO picks CUDA when a device answers). *out is NULL on failure and the
 * detail is in strata_last_error(NULL). Thread-safe. */
STRATA_API strata_status strata_engine_create(const strata_config *cfg, strata_engine **out);

/* Drains in-flight work and frees everything the engine owns. NULL is a no-op. */
STRATA_API void strata_engine_destroy(strata_engine *engine);

/* Writes the trace (strata.trace_path) now, with every event recorded so far, and closes its file; later events
 * are not recorded. Call it when the work to trace is done, to learn whether the file was written: without it,
 * strata_engine_destroy writes the trace and can only log a failure. STRATA_OK when written, when the engine has no
 * trace, and when an earlier call wrote it; STRATA_ENOSPC (full disk) or STRATA_EIO naming the file and errno
 * otherwise, for every later call too (the file is then incomplete). Thread-safe. */
STRATA_API strata_status strata_trace_write(strata_engine *engine);

/* The backend the engine runs on (never AUTO). */
STRATA_API strata_backend_kind strata_engine_backend(const strata_engine *engine);

/* The CPU cores this engine's Adam threads are bound to, as hwloc logical core indices in ascending order: thread t
 * of an optimizer step runs on cores[t % count]. It is this rank's share of its machine: the cores the process may
 * run on (its mpirun binding, else every core), divided among the ranks of its host bound to the same cores (see
 * strata.cpu_threads in docs/config.md); a world of one rank keeps them all. *count receives the size of the set
 * (0 when hwloc cannot read the topology and the threads run unbound), and cores the first max of them (cores may
 * be NULL when max is 0); *threads (may be NULL) the threads a step runs with (strata.cpu_threads, or the set's
 * size for 0). Valid from create on. STRATA_EINVAL for a NULL engine or count, or max < 0. Thread-safe. */
STRATA_API strata_status strata_engine_adam_cores(const strata_engine *engine, int *cores, int max, int *count,
                                                  int *threads);

/* The message of the last failed call on engine, or of the calling thread's last failed
 * handle-less call when engine is NULL. "" when nothing failed. Valid until the next call on
 * the same engine (or thread). */
STRATA_API const char *strata_last_error(const strata_engine *engine);

/* ------------------------------------------------------------------ ranks
 *
 * A data-parallel world: N processes, one engine each, that partition the model state across them as
 * zero_optimization.stage says (1: optimizer state, 2: + gradients, 3: + parameters; 0: replicated, the
 * gradients all-reduced). Collectives run over MPI (host buffers, and device buffers staged through pinned
 * memory) and NCCL (device buffers). Every rank makes the same calls in the same order: the same modules,
 * the same fetches, the same steps.
 *
 * Gradients. Each rank's gradients (what it hands over, summed over its micro-batches) are combined across ranks by
 * strata.gradient_reduction: "sum" (the default: the optimizer sees the sum over ranks, so a trainer that wants the
 * mean over the global batch divides its loss by the number of ranks as well as by its micro-batches, as
 * strata train and strata.torch do) or "mean" (DeepSpeed's and DDP's rule: the sum divided by the number of ranks,
 * folded into the optimizer's unscale factor). gradient_clipping and strata_step_result.grad_norm apply to what the
 * optimizer sees.
 *
 * Agreement. Finalize checks that every rank has the same math: the config settings that change it (optimizer,
 * precision, stage, clipping, ...; budgets, paths and threads are each rank's own), the model, the initial weights
 * the init callbacks gave, and the trainer's own values declared with strata_engine_agree_on. Every strata_step
 * checks its lr, its step number and the micro-batches handed over, and every collective checks that all ranks are
 * in the same one. A difference fails every rank at once (STRATA_ECONFIG or STRATA_ECOMM) naming the field, both
 * values and the ranks; a rank that left the world, or was killed on the same host, is named by the others.
 *
 * A failed world. When a rank fails (a call returns STRATA_ECOMM on the others, naming it), the world is over:
 * the collective that was interrupted stays posted in MPI (MPI cannot cancel a collective) and the peers' parts
 * of it may still arrive. Destroy the engine and the comm and end the process without further MPI use; strata
 * then leaves MPI unfinalized rather than let MPI_Finalize deliver those parts into freed memory, and the launcher
 * reports the failure.
 */
typedef struct strata_comm strata_comm;

/* The launcher's world: under mpirun (Open MPI / PMIx / PMI environment) initialises MPI with
 * MPI_THREAD_SERIALIZED and returns a comm over MPI_COMM_WORLD (MPI is finalised by strata_comm_destroy);
 * otherwise a world of 1. STRATA_EUNSUPPORTED when launched by mpirun but strata was built without MPI.
 * Detail per thread (strata_last_error(NULL)). */
STRATA_API strata_status strata_comm_create(strata_comm **out);
/* Over the embedder's own MPI communicator: mpi_comm points at an MPI_Comm (NULL = MPI_COMM_WORLD). strata
 * duplicates it, so its messages never match the embedder's; MPI must already be initialised with at least
 * MPI_THREAD_SERIALIZED. */
STRATA_API strata_status strata_comm_create_mpi(const void *mpi_comm, strata_comm **out);
/* Frees the comm (after every engine that uses it). NULL is a no-op. */
STRATA_API void strata_comm_destroy(strata_comm *comm);
STRATA_API int strata_comm_rank(const strata_comm *comm);
STRATA_API int strata_comm_size(const strata_comm *comm);
/* Rank among the processes on this host: picks the GPU (device_id + local rank, modulo the GPUs). */
STRATA_API int strata_comm_local_rank(const strata_comm *comm);

/* Sums n doubles across comm's world in place (every rank gets the sums): for a trainer's own figures, such as
 * the mean loss. A collective: every rank calls it, in the same order as its other strata calls. Not counted in
 * strata_stats.comm_bytes. STRATA_ECOMM when a rank failed or the world timed out. */
STRATA_API strata_status strata_comm_allreduce_sum(strata_comm *comm, double *values, size_t n);
/* The collective deadline: a collective that waits longer than seconds for the other ranks fails on every waiting
 * rank with STRATA_ECOMM (0 = wait forever; default 120). Ranks in different calls, a rank that left the world and a
 * killed rank on the same host are reported at once, whatever the deadline; it catches a rank that is stuck, or gone
 * on another host. An engine sets its config's strata.comm_timeout_s on its comm when it is created: call this
 * after strata_engine_create_ranked to override it. STRATA_EINVAL for a NULL comm or seconds outside
 * [0, 4e6]. Thread-safe. */
STRATA_API strata_status strata_comm_set_timeout(strata_comm *comm, double seconds);
/* This rank failed outside any strata call (its own file, its own data): every other rank's collectives, pending
 * and later, fail at once with STRATA_ECOMM and "rank R failed: why" instead of waiting for it, and so do this
 * rank's. No-op in a world of 1. */
STRATA_API void strata_comm_abort(strata_comm *comm, const char *why);

/* Declares a value of the trainer's own that every rank must share (a step count, a batch size, gradient
 * accumulation, a data seed): strata_engine_finalize compares it across ranks with the config and fails every rank
 * with STRATA_ECONFIG naming name, both values and the ranks when they differ. Declaring name again replaces its
 * value. At most 16 values, name 1..47 bytes (STRATA_EINVAL); STRATA_ESTATE after finalize. Has no effect in a world
 * of 1. Not thread-safe (the engine's thread). */
STRATA_API strata_status strata_engine_agree_on(strata_engine *engine, const char *name, double value);

/* As strata_engine_create, as one rank of comm's world (comm outlives the engine; NULL = world 1).
 * nccl_comm (an ncclComm_t of the same world, or NULL) is used for device buffers on the CUDA backend;
 * without it strata makes one over MPI when every rank on a host has its own GPU, and stages through
 * pinned memory over MPI when ranks share one. Finalize checks that the ranks agree (see Agreement above). */
STRATA_API strata_status strata_engine_create_ranked(const strata_config *cfg, strata_comm *comm, void *nccl_comm,
                                                     strata_engine **out);

/* ------------------------------------------------------------------ model registry
 *
 * A trainer describes its model once: modules (the unit it fetches, e.g. a layer) holding
 * parameters. strata_engine_finalize() lays the state out in flat per-rank partitions, places
 * every state class in its tier and writes the initial values there. Then, each step:
 *     forward:  fetch(m) -> use param_data -> release(m)            for each module in order
 *     backward: fetch(m) -> write grad_data -> grads_ready(m) -> release(m)   in reverse order
 *     step()
 * strata decides where state lives and when it moves; the trainer only says what it is about to use.
 */

typedef uint32_t strata_module_id;
typedef uint32_t strata_param_id;
#define STRATA_INVALID_ID UINT32_MAX

/* Writes the initial fp32 values of elements [offset, offset + count) of param into out.
 * Called during strata_engine_finalize(), chunk by chunk in ascending offset, from the calling
 * thread; a model larger than RAM is written straight into its tier. A non-OK return aborts finalize. */
typedef strata_status (*strata_init_fn)(void *ctx, strata_param_id param, size_t offset, size_t count,
                                        float *out);

/* Adds a module; name (copied, at most 127 bytes) appears in messages and traces.
 * STRATA_ESTATE after finalize; STRATA_EINVAL for an empty or duplicate name. */
STRATA_API strata_status strata_module_add(strata_engine *engine, const char *name, strata_module_id *out);

/* Adds a parameter of numel (> 0) elements to module. init may be NULL (zeros). name as above,
 * unique within its module. STRATA_ESTATE after finalize or for an unknown module. */
STRATA_API strata_status strata_param_add(strata_engine *engine, strata_module_id module, const char *name,
                                          size_t numel, strata_init_fn init, void *init_ctx,
                                          strata_param_id *out);

/* Freezes module (before finalize): its parameters are strata's like any other's (partitioned at ZeRO stage 3,
 * homed on the parameters' tier, fetched around their use, saved in checkpoints: params.safetensors, in param_dtype,
 * as it holds them) but take no gradients and have no optimizer state, and the plan counts them that way. It is the
 * unit of freezing: a trainer whose module mixes frozen and trained parameters puts the frozen ones in a module of
 * their own. strata_grad_data is NULL and strata_grads_ready / strata_grads_from_host STRATA_ESTATE for it;
 * strata_param_read_master reads its parameters, widened to fp32. Freezing again is a no-op; STRATA_ESTATE after
 * finalize or for an unknown module. Ranks must freeze the same modules. Not thread-safe (the engine's thread). */
STRATA_API strata_status strata_module_freeze(strata_engine *engine, strata_module_id module);
/* Whether module is frozen (false for an unknown one). */
STRATA_API bool strata_module_frozen(const strata_engine *engine, strata_module_id module);

#define STRATA_MAX_DIMS 8
/* Declares param's shape in the model: ndim (1..STRATA_MAX_DIMS) dimensions dims[0..ndim), each >= 1, whose product
 * is the parameter's numel. Optional: strata stores and moves a parameter flat whatever its shape; the shape goes
 * into checkpoints (the manifest's "model_shape"), so that `strata ckpt export` writes tensors in their model shape
 * and strata_load refuses a checkpoint whose recorded shape differs from the one declared here (STRATA_ECORRUPT),
 * while checkpoints without shapes still load. Declaring again replaces the shape; dims is copied.
 * STRATA_EINVAL naming the parameter for a bad ndim, a zero dimension or a product other than numel; STRATA_ESTATE
 * after finalize or for an unknown param. Not thread-safe (the engine's thread). */
STRATA_API strata_status strata_param_set_shape(strata_engine *engine, strata_param_id param, int ndim,
                                                const int64_t *dims);

/* Declares param as a part of a larger tensor: elements [first, first + numel) of tensor (a name of up to 127 bytes)
 * of ndim (1..STRATA_MAX_DIMS) dims, flattened row-major. A tensor too large to fetch at once (a vocabulary's
 * embedding, a wide linear layer) is split into parts, each a parameter of its own module, a tile the trainer
 * fetches, uses and releases in turn; declared as parts they are one tensor wherever strata names tensors:
 * checkpoints hold it whole under its name and shape (model.safetensors of a world of one holds "tensor" itself,
 * loadable by safetensors and PyTorch), `strata ckpt export` writes it whole, a checkpoint saved with one split (or
 * none: a parameter "<module>.<param>" is the whole tensor of that name) loads into another, and strata_param_load
 * reads the part out of the whole tensor of a file. A row range of a 2-D tensor (rows r0..r1 of [rows, cols]) is the
 * elements [r0 * cols, r1 * cols). Checked now (STRATA_EINVAL naming the parameter): the name, ndim, every dim >= 1,
 * and that the part lies inside the tensor. Checked at strata_engine_finalize (STRATA_EINVAL naming the tensor and
 * the parameters): the parts of a tensor cover it exactly once, declare the same shape, are in the same parameter
 * group, are all frozen or none, and follow each other with no other parameter between them (add the tiles' modules
 * one after another, in the order of their elements, each holding only its part), and no whole parameter has the
 * tensor's name. Declaring again replaces the part. STRATA_ESTATE after finalize or for an unknown param. Not
 * thread-safe. */
STRATA_API strata_status strata_param_set_part(strata_engine *engine, strata_param_id param, const char *tensor,
                                               uint64_t first, int ndim, const int64_t *dims);

/* ------------------------------------------------------------------ initial weights from safetensors
 *
 * Pretrained weights streamed into the tiers: an embedder opens safetensors weights on the engine and names, per
 * parameter, the tensor that holds its initial values; strata_engine_finalize then reads each tensor chunk by chunk as
 * it writes the parameter's initial state (the strata_init_fn protocol above), converting it to fp32, so that no more
 * than one chunk of the model is ever in memory. Everything that can be checked without reading the data is checked
 * for every loaded parameter before finalize writes any state: a failure leaves the engine unfinalized, with an error
 * that names the parameter, the tensor and its file. */

typedef uint32_t strata_weights_id;

/* Opens safetensors weights at path: a ".safetensors" file; a directory holding model.safetensors, else Hugging
 * Face's sharded model.safetensors.index.json; or such an index file itself. Every header is read and checked now
 * (each tensor's data within its file: a truncated shard is refused; an index's every file present and holding the
 * tensors it maps there); no tensor data is read until finalize. The files stay open until a finalize succeeds
 * (then they are closed; the tensor list stays queryable) or the engine is destroyed. Any dtype may be present;
 * F32, F16, BF16 and F64 tensors can be loaded. STRATA_ENOTFOUND when path (or a directory's model file) is not there,
 * STRATA_ECORRUPT naming the file (and tensor) for a malformed or truncated file or index, STRATA_ESTATE after
 * finalize. *out is the weights' id (0, 1, ...). Not thread-safe (the engine's thread). */
STRATA_API strata_status strata_weights_open(strata_engine *engine, const char *path, strata_weights_id *out);

/* A tensor of opened weights. The strings belong to the engine and live as long as it does. */
typedef struct strata_weights_tensor {
    const char *name;
    const char *file;    /* the safetensors file that holds it */
    const char *dtype;   /* as the file names it: "F32", "BF16", "F16", "F64", "I64", ... */
    int ndim;            /* 0..STRATA_MAX_DIMS (0: a scalar) */
    int64_t dims[STRATA_MAX_DIMS];
    uint64_t numel;
} strata_weights_tensor;

/* The number of tensors in weights (*count), and the one at index (0 .. count-1, ordered by name): for an embedder
 * that maps names or checks shapes itself. STRATA_EINVAL for an unknown weights id or an index past the end. */
STRATA_API strata_status strata_weights_count(const strata_engine *engine, strata_weights_id weights, size_t *count);
STRATA_API strata_status strata_weights_tensor_at(strata_engine *engine, strata_weights_id weights, size_t index,
                                                  strata_weights_tensor *out);
/* The tensor called name, or STRATA_ENOTFOUND (with the nearest name, when one is close, in the message). */
STRATA_API strata_status strata_weights_find(strata_engine *engine, strata_weights_id weights, const char *name,
                                             strata_weights_tensor *out);

/* strata_param_load's flags. */
#define STRATA_LOAD_TRANSPOSE 1u /* the file holds the 2-D transpose of the parameter's declared [rows, cols] shape
                                    (Hugging Face's Conv1D keeps [in, out], a Linear [out, in]) */

/* Makes tensor (a name in weights) the source of param's initial values, in place of the strata_init_fn it was added
 * with; loading the same parameter again replaces the source. Checked now: the tensor exists (STRATA_ENOTFOUND, with
 * the nearest name), its dtype is one strata converts (STRATA_EINVAL) and it has the parameter's numel (STRATA_EINVAL
 * with both). Checked again for every loaded parameter at finalize, before any state is written: where the parameter
 * has a declared shape (strata_param_set_shape), the tensor's shape equals it, or with STRATA_LOAD_TRANSPOSE is its
 * transpose (STRATA_EINVAL naming both shapes); and its file still has the size it had when opened
 * (STRATA_ECORRUPT). Every message names the parameter, the tensor and the file. STRATA_ESTATE after finalize or
 * for an unknown parameter, STRATA_EINVAL for an unknown weights id or another flag. Not thread-safe (the engine's
 * thread). */
STRATA_API strata_status strata_param_load(strata_engine *engine, strata_param_id param, strata_weights_id weights,
                                           const char *tensor, unsigned flags);

/* ------------------------------------------------------------------ parameter groups
 *
 * Adam's hyperparameters belong to parameter groups, as in torch.optim (param_groups): each group has its own lr,
 * weight decay, betas and eps. Group 0, "default", exists from strata_engine_create with the config's
 * optimizer.params and holds every parameter not put in another; a trainer adds more before finalize and assigns
 * parameters to them. Groups are what ranks agree on (finalize compares every group and every assignment; every step
 * its groups' values) and what checkpoints record (a load checks them; a checkpoint without groups is one group).
 * The layout keeps the parameters of different groups apart (a group boundary inside a module is padded to 2048
 * elements), so every optimizer pass over a range runs one set of constants. */
typedef uint32_t strata_group_id;
#define STRATA_MAX_GROUPS 4096

typedef struct strata_group_hparams {
    double lr;           /* [0, 1e6]: the group's learning rate (a schedule writes it before each step) */
    double weight_decay; /* [0, 1e6]: AdamW's decoupled decay, or Adam's L2 term (optimizer.type) */
    double beta1, beta2; /* [0, 1) */
    double eps;          /* (0, 1] */
} strata_group_hparams;

/* Adds a group (name unique, 1..127 bytes) with hyperparameters *hp; *out its id (1, 2, ...). STRATA_EINVAL naming
 * the group and the field for a value out of range or a duplicate name, STRATA_ESTATE after finalize, STRATA_ENOMEM
 * past STRATA_MAX_GROUPS. Not thread-safe (the engine's thread). */
STRATA_API strata_status strata_group_add(strata_engine *engine, const char *name, const strata_group_hparams *hp,
                                          strata_group_id *out);
/* Puts param in group (before finalize). A parameter is in one group: putting it in a second one is STRATA_EINVAL
 * naming the parameter and both groups (putting it again in the same group is a no-op). STRATA_ESTATE after finalize;
 * STRATA_EINVAL for an unknown param or group. */
STRATA_API strata_status strata_param_set_group(strata_engine *engine, strata_param_id param, strata_group_id group);
/* Replaces group's hyperparameters. Before finalize, or between steps: a step takes its groups' values when it
 * starts (strata_step; with strata.step_in_backward strata_step_begin, so a change while a step is begun is
 * STRATA_ESTATE), and a delayed update keeps the values of its own step. Errors as strata_group_add. */
STRATA_API strata_status strata_group_set(strata_engine *engine, strata_group_id group, const strata_group_hparams *hp);
/* The group's current hyperparameters into *out (group 0's are the config's until set). STRATA_EINVAL for an unknown
 * group or NULL. */
STRATA_API strata_status strata_group_get(strata_engine *engine, strata_group_id group, strata_group_hparams *out);
/* Groups (>= 1; 0 for a NULL engine). */
STRATA_API size_t strata_group_count(const strata_engine *engine);
/* The group of param (0 when never set), or STRATA_INVALID_ID for an unknown param. */
STRATA_API strata_group_id strata_param_group(const strata_engine *engine, strata_param_id param);

/* Lays out the partitions, checks that the budgets hold the plan (STRATA_EBUDGET with what is
 * needed, what is allowed and which knob to change), allocates every tier and writes the initial
 * state through the init callbacks. A failure (a budget, an NVMe path, a failing init callback) frees
 * everything the call built: the engine is as before the call and finalize may be called again.
 * Once it succeeded, STRATA_ESTATE. */
STRATA_API strata_status strata_engine_finalize(strata_engine *engine);

/* Where finalize put each state class: the home tier of the parameters, of the optimizer state and of the
 * gradient store (an offload device of "auto" resolved, so never STRATA_TIER_AUTO), and, when a device was
 * "auto", one line for a person saying what the planner chose and why each faster placement was not
 * ("" otherwise), cut to reason_len. Any out-parameter may be NULL. STRATA_ESTATE before finalize. */
STRATA_API strata_status strata_engine_placement(strata_engine *engine, strata_tier *param, strata_tier *optimizer,
                                                 strata_tier *gradients, char *reason, size_t reason_len);

/* Declares the order in which one step fetches modules (forward then backward, repeats allowed).
 * Optional: without it the order of the first step is recorded and used from the second on. */
STRATA_API strata_status strata_module_order(strata_engine *engine, const strata_module_id *order, size_t count);

/* ------------------------------------------------------------------ the training step */

/* Makes module's parameters resident on the device and ordered before the trainer's next work on
 * strata_compute_stream() (the host waits only for NVMe; on the host backend the parameters are
 * readable when this returns). Time spent waiting here is a stall in the stats.
 * Modules that come next in the order are already being fetched. STRATA_ESTATE for an unknown
 * module, before finalize or when module is already held, STRATA_EBUDGET when the
 * device budget cannot hold it with the modules still held. */
STRATA_API strata_status strata_fetch(strata_engine *engine, strata_module_id module);

/* The device pointer of a fetched module's parameter (param_dtype elements), or NULL when its module
 * is not held (strata_last_error says why). Valid until strata_release of its module. */
STRATA_API void *strata_param_data(strata_engine *engine, strata_param_id param);

/* The device gradient buffer of a fetched module's parameter (param_dtype elements, zero on first
 * use in a step): the trainer writes (or adds) the gradient there before strata_grads_ready. */
STRATA_API void *strata_grad_data(strata_engine *engine, strata_param_id param);

/* Says the trainer is done with module's parameters (and has queued nothing more that reads them).
 * STRATA_ESTATE when it is not held (a double release). */
STRATA_API strata_status strata_release(strata_engine *engine, strata_module_id module);

/* Hands module's gradients to strata: they are copied off the device on their own stream and
 * accumulated (fp32) into the gradient store across micro-batches; the device buffers are freed.
 * With strata.step_in_backward they are not accumulated: the module's optimizer update starts from them once
 * the module is released (see strata_step_begin).
 * The module must be held and its gradient buffers taken with strata_grad_data (STRATA_ESTATE otherwise). */
STRATA_API strata_status strata_grads_ready(strata_engine *engine, strata_module_id module);

/* ------------------------------------------------------------------ host arrays, without the device
 *
 * For a trainer whose parameters and gradients are host memory already (a model on the CPU; strata.torch's
 * OffloadAdam over CPU tensors): gradients go into the gradient store and weights come out of the parameter tier
 * directly, with no fetch, no device buffer and no copy through the device (on the host backend such copies cost
 * three passes over memory for one). A trainer may even use the stores' own memory as its arrays
 * (strata_grad_store_data, strata_param_home_data); the calls then copy nothing. One rank only, and not with
 * strata.step_in_backward (both move gradients as they come off the device): STRATA_ESTATE there. Engine thread only.
 */

/* The host address of param's fp32 elements in the gradient store that gradients accumulate into now, or NULL
 * (strata_last_error says why) when that store is not host memory (NVMe), before finalize, for an unknown param or
 * where the calls of this block are refused. A trainer may accumulate its gradients there itself and hand the
 * address to strata_grads_from_host. With strata.delayed_update the two stores alternate at each strata_step: ask
 * again after it. Valid until the engine is destroyed. */
STRATA_API float *strata_grad_store_data(strata_engine *engine, strata_param_id param);

/* Hands module's gradients over from host arrays, as strata_grads_ready does from the device buffers, at once:
 * grads[i] holds the gradient of the module's i-th parameter (in the order of strata_param_add; param_dtype
 * elements) or is NULL (no gradient: zeros); count is the module's number of parameters. They are accumulated into
 * the fp32 store (in place in host memory, read-add-write on NVMe), the first of a step overwriting; an address
 * that strata_grad_store_data gave for the same parameter is taken as in place and not copied. The module need not
 * be fetched, and the arrays may be reused on return. STRATA_EINVAL for a NULL grads or another count, STRATA_ESTATE
 * before finalize, for an unknown module, when its device gradient buffers were taken (strata_grad_data) and not
 * handed over, or where this block is refused. */
STRATA_API strata_status strata_grads_from_host(strata_engine *engine, strata_module_id module,
                                                const void *const *grads, size_t count);

/* The host address of param's weights (param_dtype elements) in the parameter tier: the version a fetch would
 * make resident now, which strata_step overwrites in place; NULL (strata_last_error says why) when the parameters
 * live on NVMe or the device, or as strata_grad_store_data. With strata.delayed_update the two copies alternate at
 * each strata_step and strata_sync, and a strata_load may change it: ask again after those. */
STRATA_API void *strata_param_home_data(strata_engine *engine, strata_param_id param);

/* Copies module's visible weights (as strata_param_home_data describes them) into host arrays: params[i] receives
 * the module's i-th parameter (param_dtype elements); NULL, or the address strata_param_home_data gave for it, is
 * skipped. Reads from whichever tier holds them (one copy from host memory; NVMe or the device through a
 * buffer), without fetching the module. Errors as strata_grads_from_host. */
STRATA_API strata_status strata_params_to_host(strata_engine *engine, strata_module_id module, void *const *params,
                                               size_t count);

typedef struct strata_step_args {
    double lr;                 /* this step's learning rate; 0 = the configured one (a schedule that reaches 0
                                  passes the smallest positive double, 5e-324: every fp32 constant of the update
                                  then rounds as at lr 0, so the weights stay put while the moments advance);
                                  negative or not finite: STRATA_EINVAL. It is group 0's lr for this step: with
                                  several parameter groups it must be 0 (each group's lr is set with
                                  strata_group_set), anything else is STRATA_EINVAL */
} strata_step_args;

typedef struct strata_step_result {
    int64_t step;              /* optimizer steps taken so far (skipped ones not counted) */
    bool skipped;              /* fp16 overflow: nothing was updated */
    bool delayed;              /* this step's update runs in the background (delayed_update) */
    double grad_norm;          /* global L2 norm of the (unscaled) gradients, when clipping or fp16 computed it; else -1 */
    double loss_scale;         /* the loss scale to use for the next step (1 without fp16) */
} strata_step_result;

/* Begins a step: fixes its learning rate (args->lr as in strata_step; args may be NULL) and its step count before
 * the backward that computes its gradients. Required with strata.step_in_backward, where each module's update runs
 * during backward, as soon as its one strata_grads_ready is followed by its strata_release: call it before the
 * first strata_grads_ready of every step (a hand-over without it, or a second hand-over of a module in one step,
 * is STRATA_ESTATE naming the module; gradient accumulation must be 1). Without step_in_backward it only checks
 * args and does nothing, so a trainer may always call it. STRATA_ESTATE before finalize or when a begun step was
 * not yet finished by strata_step; STRATA_EINVAL for a negative or non-finite lr. */
STRATA_API strata_status strata_step_begin(strata_engine *engine, const strata_step_args *args);

/* Ends a step's norm pass (strata.norm_pass: the step in backward with gradient clipping or fp16). With it on, the
 * trainer runs each step's forward and backward twice on the same batch, with the same hand-overs:
 *   strata_step_begin; forward + backward (the norm pass: every hand-over only adds to the gradient statistics);
 *   strata_norm_pass_end; forward + backward again (each update runs, clipped as the norm says); strata_step.
 * Here the global gradient norm is summed as the ordinary step sums it (with ranks, a collective) and the step
 * decided: clipped, or (fp16 overflow) skipped, when the second backward updates nothing. *grad_norm (or NULL)
 * gets the norm of the unscaled gradients. Each hand-over of the second backward must carry the gradients of the
 * first, bit for bit (the same batch and a deterministic backward: no dropout drawn anew, no atomics); one that
 * does not fails its update, before it writes anything, and strata_step reports it naming the module, with the
 * modules updated before it final: load the last checkpoint. STRATA_ESTATE when norm_pass is off, no step was
 * begun, or the norm pass of this step already ended; strata_step before it is STRATA_ESTATE too. */
STRATA_API strata_status strata_norm_pass_end(strata_engine *engine, double *grad_norm);

/* Runs the optimizer over all accumulated gradients and zeroes them. With delayed_update (after the
 * warm-up steps) the update runs on strata's optimizer thread and this returns at once; the result of
 * a delayed step describes the previous step's update. args and result may be NULL.
 * With strata.step_in_backward the updates already ran during backward: this waits for them, updates the modules
 * that got no gradients with zero gradients (as the ordinary step does) and publishes the new parameters; args
 * must then be NULL or carry strata_step_begin's lr (or 0): another lr is STRATA_EINVAL, and a step not begun
 * is STRATA_ESTATE. A failed update in backward is reported here and leaves the step's modules partly updated.
 * STRATA_ESTATE while the trainer still holds modules. */
STRATA_API strata_status strata_step(strata_engine *engine, const strata_step_args *args, strata_step_result *result);

/* The loss scale the trainer should multiply its loss by (1 unless fp16 is enabled). */
STRATA_API double strata_loss_scale(const strata_engine *engine);

/* Waits until no update and no transfer is in flight (e.g. before reading weights). */
STRATA_API strata_status strata_sync(strata_engine *engine);

/* Copies elements [offset, offset + count) of param's fp32 master weights into out, from whatever
 * tier holds them (after strata_sync). For tests, export and inspection. */
STRATA_API strata_status strata_param_read_master(strata_engine *engine, strata_param_id param, size_t offset,
                                                  size_t count, float *out);

/* ------------------------------------------------------------------ the trainer's device memory */

/* Device memory for the trainer's own use (activations, workspaces), carved from strata's device arena
 * so it counts against the device budget; the planner reserves strata.activation_bytes for it.
 * STRATA_EBUDGET with the numbers when it does not fit. Not thread-safe (the engine's thread). */
STRATA_API strata_status strata_device_alloc(strata_engine *engine, size_t bytes, void **out);
/* NULL is a no-op; STRATA_EINVAL for a pointer strata_device_alloc did not return. */
STRATA_API strata_status strata_device_free(strata_engine *engine, void *ptr);

/* Copies bytes between host and device memory (either direction, inferred from the pointers) and
 * returns when the copy is done. For the trainer's inputs and outputs, not for model state. */
STRATA_API strata_status strata_device_copy(strata_engine *engine, void *dst, const void *src, size_t bytes);

/* The native stream the trainer must compute on (a cudaStream_t on the CUDA backend; NULL on the
 * host backend, where the trainer computes on the calling thread): fetched parameters are ordered
 * before work on it, gradient buffers are zeroed on it, and strata_grads_ready / strata_release take
 * effect after the work queued on it so far. Valid after strata_engine_finalize. */
STRATA_API void *strata_compute_stream(strata_engine *engine);

/* ------------------------------------------------------------------ offloaded activations
 *
 * Activations a trainer keeps from forward to backward (with activation checkpointing: each block's input) need
 * not stay in device memory. The trainer hands one to strata with strata_act_push; strata copies it to
 * strata.offload_activations's tier on its own stream and gives the device copy back in backward
 * (strata_act_pop), restoring the pushes in the reverse of their order ahead of time, so that backward rarely
 * waits. Activations are per rank and per micro-batch: every push is dropped before strata_step.
 */
typedef uint64_t strata_act; /* a kept activation; 0 is never one */

/* Keeps bytes (> 0) of device memory at src until backward. The copy off the device starts after the work queued
 * on the compute stream so far, on strata's own stream. src stays strata's to read until the trainer's next
 * strata_act_push or strata_act_pop: work the trainer queues on the compute stream after that call is ordered
 * after this copy, so two buffers used in turn (block l's input, block l + 1's) never wait for each other.
 * STRATA_ESTATE when strata.offload_activations is "none" or before finalize; STRATA_EBUDGET when bytes is larger
 * than strata.offload_activations.max_bytes or the activations kept would exceed strata.offload_activations.bytes
 * (nothing is pushed then). */
STRATA_API strata_status strata_act_push(strata_engine *engine, const void *src, size_t bytes, strata_act *out);

/* The device copy of act's bytes, ordered before the trainer's next work on the compute stream (on the host
 * backend: readable when this returns). Valid until strata_act_drop(act); a second pop of act returns the same
 * copy. Waiting here for a restore still in flight counts as act_stall_ns (as does a push's wait for the drive).
 * The device holds two restored copies at once (the one in use and the next, prefetched): pop, use and drop one
 * before popping the next. STRATA_EINVAL for an act that is not kept (never pushed, or dropped); STRATA_EBUDGET
 * when the device budget has no room for it (see strata.offload_activations.max_bytes). */
STRATA_API strata_status strata_act_pop(strata_engine *engine, strata_act act, const void **out);

/* Forgets act: its kept copy is freed, and its device copy (if popped) once the compute stream's work queued so
 * far is done. A pushed act may be dropped unpopped. STRATA_EINVAL for an act that is not kept. */
STRATA_API strata_status strata_act_drop(strata_engine *engine, strata_act act);

/* ------------------------------------------------------------------ checkpoints */
/*
 * A checkpoint is a directory: manifest.json (format version, the world size that wrote it, step, loss-scale
 * state, resolved config, every tensor piece with its file, dtype, shape, element range, offsets and crc32c),
 * model.safetensors (fp32 master weights named "<module>.<param>", stored 1-D [numel]; the manifest's "model_shape"
 * gives a tensor's shape where the trainer declared one with strata_param_set_shape; loadable by safetensors/PyTorch,
 * and `strata ckpt export` writes them as one file of whole, shaped tensors), optimizer.safetensors
 * ("<name>.exp_avg", "<name>.exp_avg_sq"), and
 * params.safetensors (the trainer's bf16/fp16 parameter copy "<name>", plus "<name>.next" while a delayed update
 * is pending; absent for fp32 with nothing pending).
 *
 * A world of N > 1 ranks writes each file once per rank, "model.rank<r>.safetensors" and so on: rank r's files hold
 * the piece of every tensor that lies in its shards of the modules (1-D, under the tensor's name; the manifest
 * gives its element range), whatever the ZeRO stage, so the ranks' files together hold every tensor exactly once.
 * A world of one writes whole tensors under the names above. Manifests of format version 1 (one rank) still load.
 */

/* Writes a checkpoint of the whole training state (master weights, Adam moments, step, loss-scale state,
 * and what the delayed update has in flight) into the directory dir, streamed tier by tier without
 * gathering the model in RAM. It is written to ".<name>.tmp" beside dir, every file and the directory
 * fsynced, then atomically exchanged with dir: a crash or a full disk at any point leaves the previous
 * checkpoint at dir loadable (STRATA_ENOSPC / STRATA_EIO name the file; the engine stays usable).
 * dir may be missing, empty or a checkpoint; anything else is refused (STRATA_EINVAL), never replaced. Saving to
 * the same dir again and again is the intended use: the checkpoint it replaces is removed as a whole, with any
 * files a trainer added beside strata's (symbolic links are removed, never followed), and a stale temporary that
 * a crashed save left is removed first.
 * Call between steps: STRATA_ESTATE while modules are held or gradients have been accumulated since the
 * last strata_step. A delayed update in flight is waited for but not made visible early. One save per
 * dir at a time (not thread-safe; the engine's thread).
 * With several ranks it is a collective: every rank calls it with the same dir, on a filesystem all ranks share.
 * Rank 0 makes the temporary directory, every rank writes and fsyncs its own files, and rank 0 writes the one
 * manifest and makes the exchange once every rank's files are on disk; a failure on any rank fails the save on
 * every rank with the same status (the others' messages name the rank that failed) and leaves dir as it was. */
STRATA_API strata_status strata_save(strata_engine *engine, const char *dir);

/* Restores a checkpoint written by strata_save into a finalized engine with the same model (same modules,
 * parameters and sizes; STRATA_ECORRUPT naming the file and tensor when anything does not match, is
 * truncated or fails its checksum). Training then continues bit-identically to a run that never stopped,
 * whatever the placement, provided the trainer resumes its data at info.iterations. Loading another
 * precision is refused (STRATA_ECONFIG), as is a pending delayed update into an engine without
 * strata.delayed_update. Everything that can be checked is checked before the engine's state is touched;
 * a checksum failure found while streaming leaves the state mixed, and strata_step then refuses
 * (STRATA_ESTATE) until a load succeeds.
 * A checkpoint written by any number of ranks loads into a world of any size, one rank included: tensors are
 * stored by name and element range, and each rank reads what its shards (or, for state its ZeRO stage
 * replicates, the whole tensors) need, checking every piece it reads against its checksum. With the same number
 * of ranks and stage, training continues bit-identically; with another, the state loaded is bit-identical and
 * the steps differ from an uninterrupted run only as that world's sums differ. With several ranks it is a
 * collective (same dir on every rank): the ranks agree on every check before any state is touched, and a failure
 * on any rank fails the load on every rank with the same status, naming that rank. With strata.step_in_backward
 * a load between a step's first hand-over (or its norm pass) and its strata_step is STRATA_ESTATE: the step's
 * updates ran, or were decided, on the state before it. */
STRATA_API strata_status strata_load(strata_engine *engine, const char *dir);

/* What a checkpoint's manifest says (validated; data not checksummed: see strata_checkpoint_verify). */
typedef struct strata_checkpoint_info {
    int64_t step;              /* optimizer updates applied, counting a pending delayed one */
    int64_t iterations;        /* strata_step calls before the save: where the trainer's data resumes */
    strata_dtype param_dtype;
    double loss_scale;
    bool pending_update;       /* a delayed update was in flight at the save */
    size_t tensors;            /* entries in the manifest (all files; a sharded checkpoint counts every piece) */
    uint64_t bytes;            /* the data files together (every rank's) */
    int world_size;            /* ranks that wrote it (1 for a checkpoint of format version 1) */
} strata_checkpoint_info;

/* Reads dir's manifest into out. STRATA_ENOTFOUND when dir holds no manifest; STRATA_ECORRUPT naming the
 * file and field when it is malformed. Detail per thread. Thread-safe. */
STRATA_API strata_status strata_checkpoint_inspect(const char *dir, strata_checkpoint_info *out);

/* Reads every tensor of dir (every piece of every rank's files) and checks sizes, headers and crc32c against the
 * manifest, and that the pieces of each tensor cover it exactly once. STRATA_ECORRUPT names the first bad file
 * and tensor. Detail per thread. Thread-safe. */
STRATA_API strata_status strata_checkpoint_verify(const char *dir);

/* Keep-last-N rotation: among root's subdirectories that hold a checkpoint manifest, removes all but the
 * keep_last newest (most strata_step calls, then the highest step, then the later name), with their files; directories without a manifest
 * are never touched, nor are symbolic links (a link to a checkpoint elsewhere is neither counted nor removed, and
 * nothing inside a checkpoint is followed). *removed counts what was removed whole; a removal that fails is logged
 * as a warning naming it. keep_last >= 1 (STRATA_EINVAL otherwise). *removed (may be NULL) gets the count.
 * Typical use: strata_save(e, "root/step-00001200"), then strata_checkpoint_prune("root", 3, NULL). */
STRATA_API strata_status strata_checkpoint_prune(const char *root, int keep_last, int *removed);

/* The subdirectory of root holding the newest checkpoint (in strata_checkpoint_prune's order), written into
 * out (outlen bytes) as "root/name". STRATA_ENOTFOUND when root has none. For `--resume ROOT`. */
STRATA_API strata_status strata_checkpoint_latest(const char *root, char *out, size_t outlen);


/* ------------------------------------------------------------------ statistics */

typedef struct strata_stats {
    uint64_t steps, skipped_steps;
    uint64_t fetches;               /* strata_fetch calls */
    uint64_t prefetch_hits;         /* fetches that found the module resident or in flight */
    uint64_t stall_ns;              /* time the trainer waited inside strata_fetch */
    uint64_t step_ns;               /* time the trainer spent inside strata_step */
    uint64_t adam_ns;               /* CPU Adam busy time */
    uint64_t step_io_wait_ns;       /* time the optimizer waited for NVMe inside steps */
    uint64_t nvme_to_host_bytes, host_to_device_bytes, device_to_host_bytes, host_to_nvme_bytes;
    size_t device_peak_bytes, host_peak_bytes, nvme_peak_bytes;
    size_t device_budget_bytes, host_budget_bytes;
    int rank, world_size;           /* this engine's place in its data-parallel world */
    uint64_t comm_bytes;            /* collective payload: all-gathered outputs + reduce-scattered inputs
                                       (an all-reduce counts twice its buffer), this rank */
    /* The host cache of NVMe-homed state (strata.host_cache): the reads it served instead of the drive, their
     * bytes (nvme_to_host_bytes counts only what the drive served), and the bytes it mirrors. */
    uint64_t host_cache_hits, host_cache_read_bytes;
    size_t host_cache_bytes;
    /* Offloaded activations (strata_act_push): how many were pushed, the bytes copied off the device and back,
     * the most kept at once, the most device memory their restored copies took at once (within the plan's restore
     * window), and the time the trainer waited in strata_act_pop for a restore not yet done and in strata_act_push
     * for a copy off the device (host backend) or a staging buffer's NVMe write not yet done. */
    uint64_t act_pushes, act_offload_bytes, act_restore_bytes, act_stall_ns;
    size_t act_kept_peak_bytes, act_device_peak_bytes;
    /* This rank's CPU Adam: the threads a step runs with and the cores they are bound to, as ranges ("0-7",
     * "0,2,4-6", "..." when longer; "" when unbound): strata_engine_adam_cores, for a report. */
    int adam_threads;
    char adam_cores[124];
    /* strata.step_in_backward with gradient_clipping: the updates run during backward as if clipping will not
     * trigger; a step where it did is redone at strata_step from the kept state (every update again, clipped).
     * The steps redone, the time the redos took and the NVMe bytes they moved (reads and writes). */
    uint64_t steps_redone, redo_ns, redo_nvme_bytes;
    /* The writes of mirrored state the host cache held instead of the drive (host_to_nvme_bytes counts only what
     * the drive took): a mirrored module's parameters or sub-group's optimizer state reach the drive only when a
     * read needs the drive's copy. */
    uint64_t host_cache_held_bytes;
    /* strata.norm_pass: the norm passes run (one per step) and the time from strata_step_begin to
     * strata_norm_pass_end, the trainer's first forward and backward: what measuring the norm first costs. */
    uint64_t norm_passes, norm_pass_ns;
    /* strata_engine_finalize, most of a large model's start-up: planning and allocating every tier's memory, then
     * writing the initial state (the parameters' init callbacks, their copies into each tier, the optimizer's zero
     * moments); and the page-locked host memory the engine holds (allocated pinned and registered), which the
     * allocation phase pins page by page. */
    uint64_t finalize_alloc_ns, finalize_init_ns;
    size_t pinned_host_bytes;
} strata_stats;

/* Fills out with the counters since the engine was created. strata_stats only ever grows at its end: a caller
 * built against an older header passes its own sizeof (strata_stats_get does) and gets the fields it knows;
 * STRATA_EINVAL when size is smaller than the first release's struct. */
STRATA_API strata_status strata_stats_get_sized(strata_engine *engine, strata_stats *out, size_t size);
#define strata_stats_get(engine, out) strata_stats_get_sized((engine), (out), sizeof(strata_stats))

/* ================================================================== NVMe: strata_aio */
/*
 * strata_aio: the NVMe I/O engine on its own, usable without an engine (like DeepNVMe's aio
 * handle). io_uring rings, one I/O thread each (aio.intra_op_parallelism), requests cut into
 * aio.block_size pieces with up to aio.queue_depth in flight per ring. Files are opened with
 * O_DIRECT unless aio.direct is false; where the filesystem refuses it (tmpfs) strata warns once
 * and uses buffered I/O, unless aio.direct is true. Every completion is checked: errors name the
 * file, offset, length and errno; short transfers are finished; reading beyond the end of a file
 * is an error, never zero-filled data. The engine's swap space runs on the same code.
 *
 * A handle and its files are driven from one thread (use one handle per thread).
 */
typedef struct strata_aio strata_aio;
typedef struct strata_aio_file strata_aio_file;

/* strata_aio_open() flags. */
#define STRATA_AIO_READ     1u /* open for reading; the file must exist */
#define STRATA_AIO_WRITE    2u /* open for reading and writing; created with mode 0600 when missing */
#define STRATA_AIO_TRUNCATE 4u /* with STRATA_AIO_WRITE: cut the file to 0 bytes */

/* Fills cfg with the aio defaults (block_size 1 MiB, queue_depth 32, intra_op_parallelism 1,
 * single_submit false, overlap_events true, direct AUTO, sqpoll OFF). Thread-safe. */
STRATA_API strata_status strata_aio_config_init(strata_aio_config *cfg);

/* Creates a handle with its rings and I/O threads; cfg NULL means the defaults.
 * STRATA_ECONFIG names a setting out of range; STRATA_EUNSUPPORTED when io_uring is unavailable
 * (or sqpoll is ON and refused). *out is NULL on failure (detail: strata_aio_last_error(NULL)). */
STRATA_API strata_status strata_aio_create(const strata_aio_config *cfg, strata_aio **out);

/* Waits for every request in flight, then frees the handle. Files and buffers still open are
 * closed and freed. NULL is a no-op. */
STRATA_API void strata_aio_destroy(strata_aio *aio);

/* The message of aio's last failed call ("" when none); NULL gives the calling thread's last
 * handle-less failure (e.g. of strata_aio_create). */
STRATA_API const char *strata_aio_last_error(const strata_aio *aio);

/* Opens path with STRATA_AIO_* flags. *out is NULL on failure (STRATA_ENOTFOUND, STRATA_EIO,
 * STRATA_EUNSUPPORTED when aio.direct is ON and O_DIRECT is refused). */
STRATA_API strata_status strata_aio_open(strata_aio *aio, const char *path, unsigned flags, strata_aio_file **out);

/* Closes file. STRATA_EBUSY (and nothing closed) while the handle has requests in flight:
 * call strata_aio_wait() first. NULL file is a no-op. */
STRATA_API strata_status strata_aio_close(strata_aio *aio, strata_aio_file *file);

/* True when file uses O_DIRECT: buffers, offsets and lengths must then be multiples of 4096. */
STRATA_API bool strata_aio_file_is_direct(const strata_aio_file *file);

/* Queue a read into / write from the caller's buffer at offset; return at once. The buffer
 * must stay valid and untouched until strata_aio_wait() returns. On a direct file an unaligned
 * buffer, offset or length is STRATA_EINVAL naming it, checked before anything is queued. */
STRATA_API strata_status strata_aio_read(strata_aio *aio, strata_aio_file *file, void *buf, size_t bytes,
                                        uint64_t offset);
STRATA_API strata_status strata_aio_write(strata_aio *aio, strata_aio_file *file, const void *buf, size_t bytes,
                                         uint64_t offset);

/* Waits for every queued request of the handle. Returns the first failure among them
 * (STRATA_EIO, STRATA_ENOSPC, ...; the message names file, offset, length and errno), else OK. */
STRATA_API strata_status strata_aio_wait(strata_aio *aio);

/* Synchronous read / write: queue one request and wait for it alone. */
STRATA_API strata_status strata_aio_pread(strata_aio *aio, strata_aio_file *file, void *buf, size_t bytes,
                                         uint64_t offset);
STRATA_API strata_status strata_aio_pwrite(strata_aio *aio, strata_aio_file *file, const void *buf, size_t bytes,
                                          uint64_t offset);

/* A zeroed, 4 KiB-aligned buffer of at least bytes, locked in RAM and registered with the
 * handle's rings when the kernel and RLIMIT_MEMLOCK allow (best effort). Free it with
 * strata_aio_buffer_free() on the same handle, after its I/O has finished. */
STRATA_API strata_status strata_aio_buffer_alloc(strata_aio *aio, size_t bytes, void **out);
STRATA_API void strata_aio_buffer_free(strata_aio *aio, void *buf);

/* ================================================================== CPU Adam: strata_adam */
/*
 * The CPU Adam on caller arrays, usable without an engine (what DeepSpeedCPUAdam is used for).
 * One pass per element: reads the fp32 master weights, both moments and the gradient, writes them
 * back plus a low-precision copy of the parameters. The formula is PyTorch's torch.optim.AdamW
 * (decoupled decay) or torch.optim.Adam (L2 decay), fp32 throughout, with multiply-adds fused where
 * PyTorch's CPU kernels fuse them, and the first moment as the torch of hparams.formula updates it:
 * bit-identical to PyTorch 1.13 (MUL_ADD, Debian's build) and 2.x (LERP, PyPI's; both checked by
 * benchmarks/adam_vs_torch.py and the Python tests) and between strata's ISA variants.
 * The kernel (scalar, AVX2, AVX-512) is chosen once per process; STRATA_ISA=ref|avx2|avx512 forces one.
 */

/* Hyperparameters. Doubles, as Python passes them; each derived scalar is rounded to fp32 once. */
typedef struct strata_adam_hparams {
    strata_optimizer_kind kind;   /* ADAMW (decoupled decay) or ADAM (L2 added to the gradient) */
    double lr;                    /* >= 0 */
    double beta1, beta2;          /* [0, 1) */
    double eps;                   /* >= 0 */
    double weight_decay;          /* >= 0 */
    bool bias_correction;
    strata_adam_formula formula;  /* the first moment's update; 0 (MUL_ADD) for callers that predate it */
} strata_adam_hparams;

/* The arrays of one update; element i of each belongs to parameter element i. Arrays of one call
 * must not overlap, except that param may be master itself when param_dtype is FP32. */
typedef struct strata_adam_tensors {
    float *master;                /* fp32 master weights, updated in place */
    float *exp_avg;               /* first moment, in place */
    float *exp_avg_sq;            /* second moment, in place */
    const void *grad;             /* the gradient as stored (times loss scale, before clipping) */
    strata_dtype grad_dtype;      /* FP32, BF16 or FP16 */
    void *param;                  /* receives the updated parameters in param_dtype; NULL with NONE */
    strata_dtype param_dtype;     /* FP32, BF16, FP16 or NONE; rounding is to nearest even */
    size_t numel;
} strata_adam_tensors;

/* Called when elements [offset, offset + numel) of the parameter copy (and of master, m, v) are final and
 * in memory, from the worker thread that finished them (so concurrently with other tiles: it must be
 * thread-safe, and short — e.g. queue a copy to the device — since that thread waits for it). Tiles come
 * roughly in ascending order, cover every element exactly once and never split a cache line. */
typedef void (*strata_adam_tile_fn)(size_t offset, size_t numel, void *user);

/* The per-call settings of one step. Zero-initialise, then set step (and what you need). */
typedef struct strata_adam_step_args {
    int64_t step;                 /* this update's step count, from 1 (bias correction uses it) */
    double grad_scale;            /* gradients are multiplied by this: 1/loss_scale * clip coefficient;
                                     0 means 1 */
    int threads;                  /* OpenMP threads for this call; 0 = the cores this process may use */
    bool skip_nonfinite;          /* run the gradient pre-pass first and write nothing when a gradient
                                     is inf or NaN (fp16 overflow); the result says so */
    strata_adam_tile_fn on_tile;  /* optional per-tile completion callback */
    void *on_tile_user;
    size_t tile_numel;            /* elements per tile; 0 = strata's choice; rounded up to 1024 */
} strata_adam_step_args;

typedef struct strata_adam_step_result {
    bool skipped;                 /* skip_nonfinite found an inf/NaN: nothing was written */
    double grad_sumsq;            /* the pre-pass's sum of squares when it ran, else 0 */
} strata_adam_step_result;

/* Runs one Adam/AdamW update over t's arrays with the caller's thread count (no global OpenMP
 * setting is changed; worker threads are bound to cores for the call and unbound after).
 * result may be NULL. STRATA_EINVAL names the first bad field and its allowed range;
 * STRATA_EUNSUPPORTED when STRATA_ISA forces an ISA this CPU lacks. Detail: strata_last_error(NULL).
 * Thread-safe for calls on disjoint arrays. */
STRATA_API strata_status strata_adam_step(const strata_adam_hparams *hp, const strata_adam_tensors *t,
                                          const strata_adam_step_args *args, strata_adam_step_result *result);

/* The gradient pre-pass: one read of grad that returns the sum of squares of the stored values (for the
 * global norm used by clipping; accumulated in fp32 blocks and a double total) and whether any value is
 * inf or NaN. threads as in strata_adam_step. Same errors; thread-safe. */
STRATA_API strata_status strata_adam_grad_stats(const void *grad, strata_dtype grad_dtype, size_t numel,
                                                int threads, double *sumsq, bool *nonfinite);

/* The hyperparameters an engine made from cfg runs its Adam with (lr: the configured one): the exact doubles where
 * the fp32 fields agree with them, else the fp32 fields' values (strata_config, lr_exact). For a caller's own
 * oracle or standalone strata_adam_step. STRATA_EINVAL for NULL or a struct_size this library does not know. */
STRATA_API strata_status strata_config_adam_hparams(const strata_config *cfg, strata_adam_hparams *out);

/* The kernel in use ("ref", "avx2" or "avx512"), or NULL when STRATA_ISA forces one this CPU lacks
 * (strata_last_error(NULL) says why). Thread-safe. */
STRATA_API const char *strata_adam_isa(void);

#ifdef __cplusplus
}
#endif

#endif /* STRATA_H */
