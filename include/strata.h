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
    X(STRATA_EINTERNAL,    14, "internal error (a bug in strata; please report it)")

typedef enum strata_status {
#define STRATA_STATUS_ENUM_(name, value, text) name = value,
    STRATA_STATUS_LIST(STRATA_STATUS_ENUM_)
#undef STRATA_STATUS_ENUM_
} strata_status;

/* A short description of a status, e.g. "I/O error". Never NULL; unknown values give "unknown status". */
STRATA_API const char *strata_status_str(strata_status status);

/* The name of a status, e.g. "STRATA_EIO". Never NULL. */
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

typedef enum strata_optimizer_kind {
    STRATA_OPTIMIZER_ADAMW = 0, /* decoupled weight decay (torch.optim.AdamW) */
    STRATA_OPTIMIZER_ADAM,      /* L2 weight decay added to the gradient (torch.optim.Adam) */
} strata_optimizer_kind;

typedef enum strata_switch {
    STRATA_SWITCH_AUTO = 0, /* use it when the machine allows, else fall back and say so */
    STRATA_SWITCH_ON,       /* demand it: fail if the machine does not allow it */
    STRATA_SWITCH_OFF,
} strata_switch;

#define STRATA_MAX_NVME_PATHS 8
#define STRATA_PATH_BYTES 512

/* Where offloaded state of one kind goes (DeepSpeed's offload_param / offload_optimizer). */
typedef struct strata_offload_config {
    strata_tier device;                                         /* none | cpu | nvme */
    char nvme_path[STRATA_MAX_NVME_PATHS][STRATA_PATH_BYTES];   /* several paths are striped (RAID-0) */
    int nvme_path_count;
    int buffer_count;                                           /* pinned swap buffers */
    size_t buffer_size;                                         /* elements per buffer (offload_param) */
    size_t max_in_cpu;                                          /* elements kept in RAM when on nvme */
    bool pin_memory;
    bool pipeline_read;                                         /* overlap NVMe reads with Adam */
    bool pipeline_write;                                        /* overlap NVMe writes with Adam */
    double ratio;                                               /* share of optimizer work on the CPU */
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

/* The whole configuration. Fill it with strata_config_init() (or STRATA_CONFIG_INIT), then
 * change fields from C or load a JSON file over it. */
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
    int cpu_threads;                         /* OpenMP threads for Adam; 0 = cores of this process */
    bool delayed_update;                     /* ZeRO-Offload's one-step-delayed optimizer step */
    int delayed_warmup_steps;                /* steps run undelayed first */
    char trace_path[STRATA_PATH_BYTES];      /* Chrome trace-event JSON; "" = no trace */
    bool swap_checksum;                      /* crc32c per swap extent, checked on read */
    bool ignore_unimplemented;               /* warn (instead of fail) on DeepSpeed keys strata lacks */
} strata_config;

/* Sets every field to its default (see `strata config check` for the values) and struct_size.
 * STRATA_EINVAL if cfg is NULL. Thread-safe. */
STRATA_API strata_status strata_config_init(strata_config *cfg);

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

/* ------------------------------------------------------------------ engine */

typedef struct strata_engine strata_engine;

/* Creates an engine from a validated copy of cfg and chooses its device backend
 * (cfg->backend; AUTO picks CUDA when a device answers). *out is NULL on failure and the
 * detail is in strata_last_error(NULL). Thread-safe. */
STRATA_API strata_status strata_engine_create(const strata_config *cfg, strata_engine **out);

/* Drains in-flight work and frees everything the engine owns. NULL is a no-op. */
STRATA_API void strata_engine_destroy(strata_engine *engine);

/* The backend the engine runs on (never AUTO). */
STRATA_API strata_backend_kind strata_engine_backend(const strata_engine *engine);

/* The message of the last failed call on engine, or of the calling thread's last failed
 * handle-less call when engine is NULL. "" when nothing failed. Valid until the next call on
 * the same engine (or thread). */
STRATA_API const char *strata_last_error(const strata_engine *engine);

/* ================================================================== NVMe: strata_aio (issue 3) */
/* STRATA-AIO-BEGIN */
/* STRATA-AIO-END */

/* ================================================================== CPU Adam: strata_adam (issue 4) */
/* STRATA-ADAM-BEGIN */
/* STRATA-ADAM-END */

#ifdef __cplusplus
}
#endif

#endif /* STRATA_H */
