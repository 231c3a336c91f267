/*
 * gpu/device.h — the device contract every backend meets, written once.
 *
 * The two calls the rest of strata starts from:
 *
 *   strata_status dev_probe(strata_backend_kind kind, char *detail, size_t len);
 *       STRATA_OK when that backend is usable on this machine; detail (may be NULL) then
 *       describes it ("cuda: 1 device; device 0: NVIDIA H200, 139.8 GiB, sm_90, ...").
 *       Otherwise detail says why, for a person: "cuda: no device (cudaGetDeviceCount: no
 *       CUDA-capable device is detected)" or "cuda: not built (nvcc was not found when strata
 *       was configured)". The host backend is always usable. AUTO probes what dev_create(AUTO)
 *       would pick. Thread-safe; used by `strata info`.
 *
 *   strata_status dev_create(strata_backend_kind kind, const dev_options *opt, device **out);
 *       Opens a device: AUTO means CUDA when a device answers, else host. opt may be NULL
 *       (DEV_OPTIONS_INIT). Reserves the whole memory budget once (one cudaMalloc, or one lazy
 *       mmap for the host backend) and carves it with strata's own allocator (gpu/arena.h).
 *       Used by strata_engine_create().
 *
 * Ownership and threads. Every object belongs to the device it was made on; dev_destroy() first
 * drains the in-flight work of every stream, then frees every stream, event, pinned buffer and
 * registration the caller left behind. Memory, pinned-memory, stream and event calls are
 * thread-safe on one device; one stream may be fed from several threads (each call is ordered as a
 * whole). Destroy functions accept NULL.
 *
 * Errors. Functions return strata_status and leave the detail in the thread's last error
 * (base/error.h). Work that fails after it was queued (a host function returning an error, a CUDA
 * fault) is never lost: its stream keeps the first such error and reports it — status and message —
 * from the next dev_stream_sync() of that stream (which then clears it), and from dev_event_sync()
 * and dev_event_query() of any event recorded on that stream after the failed work. An error stays
 * with the stream it happened on: a stream that waited on an event of a failed stream does not
 * inherit it.
 *
 * Core code never tests which backends were built: only gpu/device.c knows.
 */
#ifndef STRATA_GPU_DEVICE_H
#define STRATA_GPU_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strata.h"

typedef struct device device;
typedef struct dev_stream dev_stream;
typedef struct dev_event dev_event;
struct adam_consts; /* cpu_adam/adam.h: the scalars of one Adam step */

/* Every device allocation starts on this boundary (and sizes are rounded up to it). */
#define DEV_ALIGN_BYTES 256
/* Pinned host buffers from dev_host_alloc() start on a page (O_DIRECT needs it). */
#define DEV_HOST_ALIGN_BYTES 4096
/* The host backend's budget when dev_options.budget_bytes is 0. */
#define DEV_HOST_DEFAULT_BUDGET_BYTES ((size_t)1 << 30)
/* Freed device memory is filled with this 32-bit word when poisoning is on: a quiet float NaN. */
#define DEV_POISON_WORD 0x7fc00000u

typedef struct dev_options {
    int device_id;        /* CUDA device ordinal; the host backend ignores it */
    size_t budget_bytes;  /* the device arena. 0: CUDA takes all free memory but a small headroom
                             for the CUDA context and libraries; host takes DEV_HOST_DEFAULT_BUDGET_BYTES */
    bool poison_on_free;  /* fill freed device blocks with DEV_POISON_WORD. Also on in debug builds
                             (!NDEBUG) and with STRATA_POISON=1; STRATA_POISON=0 turns the debug default off */
    int budget_share;     /* processes that use this device (ranks of a host sharing a GPU): with budget_bytes 0,
                             CUDA takes 1/budget_share of the device (total memory / budget_share less the headroom,
                             and never more than is free); 0 or 1: all free memory. The host backend ignores it:
                             its default is no share of anything */
} dev_options;
#define DEV_OPTIONS_INIT {0, 0, false, 0}

/* Device memory in use; the engine's stats read it. */
typedef struct dev_mem_stats {
    size_t budget_bytes;         /* the arena size */
    size_t used_bytes;           /* live device blocks, aligned sizes */
    size_t peak_bytes;           /* highest used_bytes since create or dev_reset_peak() */
    size_t free_bytes;
    size_t largest_free_bytes;   /* the biggest dev_alloc() that can succeed now */
    size_t live_allocs;
    size_t free_blocks;          /* 1 when nothing is allocated */
    size_t alloc_count;          /* successful dev_alloc() calls, ever */
    size_t pinned_bytes;         /* live dev_host_alloc() buffers */
    size_t registered_bytes;     /* live dev_host_register() ranges */
} dev_mem_stats;

/* A host function run in stream order (dev_host_fn). It runs on a backend thread, must not call
 * any dev_* function (CUDA forbids CUDA calls there, and a wait could deadlock its own stream),
 * and should return quickly: later work on its stream waits for it, and host functions of different
 * streams may run one at a time (CUDA runs them on one internal thread), so one must never wait for
 * another. A failure it returns
 * (with err_set) becomes its stream's error (see Errors above); later work on the stream still runs. */
typedef strata_status (*dev_host_fn_t)(void *arg);

/* ---------------------------------------------------------------- devices */

strata_status dev_probe(strata_backend_kind kind, char *detail, size_t len);

/* STRATA_EINVAL for a bad kind or option; STRATA_EUNSUPPORTED for CUDA in a build without it;
 * STRATA_EDEVICE when CUDA was asked for and no device answers; STRATA_EBUDGET when the budget does
 * not fit the device's free memory; STRATA_ENOMEM when the host cannot reserve it. *out is NULL on failure. */
strata_status dev_create(strata_backend_kind kind, const dev_options *opt, device **out);

/* Drains every stream, then frees everything made on the device. NULL is a no-op. */
void dev_destroy(device *dev);

/* The GPUs the backend sees: 0 for the host backend, and for CUDA without a device or a build. AUTO counts
 * CUDA's. Ranks of one host pick theirs from it (one each when there are enough). Thread-safe. */
int dev_count(strata_backend_kind kind);
/* The backend actually in use (never AUTO), and a name for messages: "host", "cuda:0 (NVIDIA H200)". */
strata_backend_kind dev_kind(const device *dev);
const char *dev_name(const device *dev);

/* The CUDA device ordinal (dev_options.device_id) the device was opened on, for libraries that take one
 * (cudaSetDevice before NCCL calls); -1 on the host backend. */
int dev_ordinal(const device *dev);

/* The OS index of the NUMA node nearest the device (hwloc, from its PCI bus id), or -1 when there is
 * no such locality (the host backend, a single-node machine, or hwloc cannot place the device). Pinned
 * buffers the device copies from are best allocated there. */
int dev_numa_node(const device *dev);

/* Whether freed device memory is poisoned on this device (see dev_options.poison_on_free). */
bool dev_poisons(const device *dev);

/* ---------------------------------------------------------------- device memory */

/* Carves bytes (> 0) from the device arena, DEV_ALIGN_BYTES-aligned. The memory is uninitialised
 * (NaN-poisoned if it was freed with poisoning on). STRATA_EBUDGET when no free block fits, with
 * the numbers: "device budget exceeded: asked 96.00 MiB, free 64.00 MiB of 128.00 MiB (largest free
 * block 64.00 MiB); raise strata.device_budget_bytes or lower the prefetch window". */
strata_status dev_alloc(device *dev, size_t bytes, void **out);

/* Returns a block from dev_alloc() to the arena (poisoning it first when poisoning is on).
 * The caller guarantees that no queued work still touches it (sync an event recorded after
 * the last use). NULL is a no-op; STRATA_EINVAL names a pointer that is not a live block. */
strata_status dev_free(device *dev, void *ptr);

void dev_mem_stats_get(device *dev, dev_mem_stats *out);
void dev_reset_peak(device *dev);

/* ---------------------------------------------------------------- pinned host memory */

/* Page-locked host memory the device copies from and to asynchronously (CUDA: cudaHostAlloc;
 * host backend: DEV_HOST_ALIGN_BYTES-aligned heap memory). STRATA_ENOMEM when refused. */
strata_status dev_host_alloc(device *dev, size_t bytes, void **out);
/* NULL is a no-op; STRATA_EINVAL when ptr did not come from dev_host_alloc() on dev. */
strata_status dev_host_free(device *dev, void *ptr);

/* Pins an existing buffer for the device's copies (CUDA: cudaHostRegister; host: bookkeeping only),
 * e.g. buffers the NVMe layer allocated. Unregister before freeing the buffer. */
strata_status dev_host_register(device *dev, void *ptr, size_t bytes);
strata_status dev_host_unregister(device *dev, void *ptr);

/* ---------------------------------------------------------------- streams */

/* A queue of work run in order, concurrently with other streams (CUDA: a non-blocking stream;
 * host backend: a worker thread). name ("h2d", "d2h") appears in messages and thread names. */
strata_status dev_stream_create(device *dev, const char *name, dev_stream **out);
/* Wraps the caller's own stream, so that strata can order against the trainer's compute: make it
 * wait for a prefetch (dev_stream_wait_event), or record an event after the trainer's last use of a
 * buffer. CUDA: native is a cudaStream_t (NULL = the legacy default stream); the caller keeps it,
 * and dev_stream_destroy() only forgets it. Host backend: native must be NULL, and the stream is the
 * calling thread itself: work queued on it runs at once, inline, and a wait on an event blocks the
 * caller until the event completes — on a machine whose compute is the caller, that is what
 * "resident before the next compute" means. STRATA_EINVAL for a non-NULL native on the host backend. */
strata_status dev_stream_wrap(device *dev, void *native, const char *name, dev_stream **out);
/* Drains the stream, then frees it (a wrapped stream is drained and forgotten); an error nobody
 * collected is logged. NULL is a no-op. */
void dev_stream_destroy(dev_stream *s);
const char *dev_stream_name(const dev_stream *s);

/* Queues a copy of bytes from src to dst. The direction is inferred from the pointers (unified
 * addressing): device<->device, host<->device and host<->host all work. Host buffers should be
 * pinned (dev_host_alloc/dev_host_register); with pageable memory CUDA may copy synchronously. */
strata_status dev_memcpy_async(dev_stream *s, void *dst, const void *src, size_t bytes);
/* Queues setting bytes of device memory dst to the byte value. */
strata_status dev_memset_async(dev_stream *s, void *dst, int value, size_t bytes);
/* Queues fn(arg) after all work queued on s before it; later work waits for it to return. */
strata_status dev_host_fn(dev_stream *s, dev_host_fn_t fn, void *arg);
/* Waits until everything queued on s has run; reports and clears the stream's error. */
strata_status dev_stream_sync(dev_stream *s);

/* ---------------------------------------------------------------- events */

/* A marker in a stream. A never-recorded event counts as complete. */
strata_status dev_event_create(device *dev, dev_event **out);
/* Work already queued that waits on ev keeps its ordering. NULL is a no-op. */
void dev_event_destroy(dev_event *ev);
/* Captures all work queued on s so far; re-recording moves the marker. */
strata_status dev_event_record(dev_event *ev, dev_stream *s);
/* Makes work queued on s from now on wait until ev's latest recording completes, without
 * blocking the host: how the H2D stream is ordered before compute. */
strata_status dev_stream_wait_event(dev_stream *s, dev_event *ev);
/* *done = whether ev's latest recording has completed; never blocks. */
strata_status dev_event_query(dev_event *ev, bool *done);
/* Blocks until ev's latest recording has completed. */
strata_status dev_event_sync(dev_event *ev);

/* ---------------------------------------------------------------- device Adam */

/* The arrays of one device Adam update, all in device memory; element i of each belongs to element i. */
typedef struct dev_adam_arrays {
    float *master, *exp_avg, *exp_avg_sq; /* fp32, updated in place */
    const float *grad;                    /* fp32 gradients, read */
    void *param;                          /* the low-precision copy, written; NULL with STRATA_DTYPE_NONE */
    strata_dtype param_dtype;             /* FP32, BF16, FP16 or NONE */
} dev_adam_arrays;

/* Queues one Adam update of n elements on s, after the work queued before it (the optimizer's share that lives
 * on the device: offload_optimizer.ratio). c (copied at the call) holds the step's constants as
 * adam_consts_init() makes them. Every backend gives exactly the bits of adam_step_ref() (cpu_adam/adam_ref.c,
 * the specification) with fp32 gradients: the host backend runs this machine's CPU kernel (bit-identical to it;
 * STRATA_ISA=ref: that very function) on the stream's thread, one core; CUDA runs a kernel doing the same IEEE
 * operations in the same order, each rounded as written (no contraction), with the narrowing of
 * cpu_adam/base/half.h. STRATA_EINVAL for NULL arrays or an unknown param_dtype; a failure
 * of the queued work is the stream's error (see Errors above). n 0 queues nothing. */
strata_status dev_adam_step(dev_stream *s, const struct adam_consts *c, const dev_adam_arrays *a, size_t n);

/* The backend's own handles, for a trainer that orders its compute itself (e.g. cudaStreamWaitEvent
 * on its compute stream instead of a blocking dev_event_sync): the cudaStream_t / cudaEvent_t on CUDA,
 * NULL on the host backend, whose streams are threads. The device keeps ownership. */
void *dev_stream_native(const dev_stream *s);
void *dev_event_native(const dev_event *ev);

/* ================================================================ for backends only
 *
 * A backend implements dev_ops in its own file (gpu/backend_host.c, gpu/cuda/backend_cuda.c)
 * against its own state types; gpu/device.c does all validation, bookkeeping, error capture,
 * poisoning policy and the arena, so each op below only does the backend's part.
 * Every op returns STRATA_OK or a status with err_set() detail that names the failing call.
 */
typedef struct dev_impl dev_impl;               /* a backend's per-device state */
typedef struct dev_impl_stream dev_impl_stream;
typedef struct dev_impl_event dev_impl_event;

typedef struct dev_ops {
    const char *name; /* "host", "cuda" */
    strata_backend_kind kind;
    bool native_handles; /* dev_impl_stream / dev_impl_event pointers are cudaStream_t / cudaEvent_t */

    /* Usable here? detail as for dev_probe(). */
    strata_status (*probe)(char *detail, size_t len);
    /* Devices this backend sees (may be NULL: none to count). */
    int (*count)(void);
    /* The device's PCI bus id ("0000:17:00.0") into buf; false when it has none (host). May be NULL. */
    bool (*pci_bus_id)(dev_impl *d, char *buf, size_t len);
    /* Opens the device; name receives a name for messages. */
    strata_status (*create)(const dev_options *opt, dev_impl **out, char *name, size_t name_len);
    /* Called after every stream, event and buffer is gone. */
    void (*destroy)(dev_impl *d);

    /* Reserves the arena once: *bytes in = the wanted budget (0 = backend default), out = granted. */
    strata_status (*arena_reserve)(dev_impl *d, size_t *bytes, void **base);
    void (*arena_release)(dev_impl *d, void *base, size_t bytes);
    /* Fills device memory with DEV_POISON_WORD and returns when it is done. */
    strata_status (*poison)(dev_impl *d, void *ptr, size_t bytes);

    strata_status (*host_alloc)(dev_impl *d, size_t bytes, void **out);
    void (*host_free)(dev_impl *d, void *ptr);
    strata_status (*host_register)(dev_impl *d, void *ptr, size_t bytes);
    void (*host_unregister)(dev_impl *d, void *ptr);

    strata_status (*stream_create)(dev_impl *d, const char *name, dev_impl_stream **out);
    /* A stream over the caller's native one (see dev_stream_wrap); device.c checked nothing else. */
    strata_status (*stream_wrap)(dev_impl *d, void *native, const char *name, dev_impl_stream **out);
    /* The stream is already drained. wrapped: it came from stream_wrap and the caller owns the native one. */
    void (*stream_destroy)(dev_impl *d, dev_impl_stream *s, bool wrapped);
    strata_status (*memcpy_async)(dev_impl *d, dev_impl_stream *s, void *dst, const void *src, size_t bytes);
    strata_status (*memset_async)(dev_impl *d, dev_impl_stream *s, void *dst, int value, size_t bytes);
    /* fn(arg) in stream order; fn never fails (device.c wraps the caller's function). */
    strata_status (*host_fn)(dev_impl *d, dev_impl_stream *s, void (*fn)(void *arg), void *arg);
    strata_status (*stream_sync)(dev_impl *d, dev_impl_stream *s);
    /* dev_adam_step in stream order; device.c checked the arguments and n > 0. */
    strata_status (*adam_step)(dev_impl *d, dev_impl_stream *s, const struct adam_consts *c,
                               const dev_adam_arrays *a, size_t n);

    strata_status (*event_create)(dev_impl *d, dev_impl_event **out);
    /* Work queued earlier that records or waits on e must still behave. */
    void (*event_destroy)(dev_impl *d, dev_impl_event *e);
    strata_status (*event_record)(dev_impl *d, dev_impl_event *e, dev_impl_stream *s);
    strata_status (*stream_wait_event)(dev_impl *d, dev_impl_stream *s, dev_impl_event *e);
    strata_status (*event_query)(dev_impl *d, dev_impl_event *e, bool *done);
    strata_status (*event_sync)(dev_impl *d, dev_impl_event *e);
} dev_ops;

extern const dev_ops dev_ops_host; /* gpu/backend_host.c, always built */
extern const dev_ops dev_ops_cuda; /* gpu/cuda/backend_cuda.c, only when CUDA is built */

#endif
