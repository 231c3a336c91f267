/*
 * The CUDA backend (see gpu/device.h), in C against the CUDA runtime API.
 *
 * One cudaMalloc of the whole budget at create (gpu/device.c carves it), pinned memory through
 * cudaHostAlloc/cudaHostRegister, non-blocking streams (they never synchronise with the legacy
 * default stream the trainer may use), events without timing (cheaper to record and wait on).
 * Every call names the CUDA function that failed and cudaGetErrorString's words.
 *
 * The runtime keeps the current device per thread, and the engine calls in from several threads,
 * so every op that creates or queues something selects the device first (cheap after the first time).
 */
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "base/error.h"
#include "base/size.h"
#include "base/util.h"
#include "gpu/cuda/adam.h"
#include "gpu/cuda/poison.h"
#include "gpu/device.h"

/* Left free when the budget is "all free memory": the CUDA context, cuBLAS workspaces and the
 * trainer's own kernels allocate outside strata's arena. */
#define CUDA_HEADROOM_BYTES ((size_t)512 << 20)
/* The arena is rounded down to the allocation granularity of large cudaMalloc calls. */
#define CUDA_ARENA_GRANULE ((size_t)2 << 20)

struct dev_impl {
    int id;
    int share;                  /* dev_options.budget_share, at least 1 */
    cudaStream_t poison_stream; /* poisoning runs here and is waited for: it is a debug aid */
};

/* The CUDA objects are the backend's stream and event handles. */
static cudaStream_t as_stream(dev_impl_stream *s)
{
    return (cudaStream_t)(void *)s;
}

static cudaEvent_t as_event(dev_impl_event *e)
{
    return (cudaEvent_t)(void *)e;
}

static strata_status cuda_fail(const dev_impl *d, cudaError_t e, const char *call)
{
    strata_status st = e == cudaErrorMemoryAllocation ? STRATA_ENOMEM : STRATA_EDEVICE;
    return err_set(st, "cuda:%d: %s failed: %s (%s)", d ? d->id : -1, call, cudaGetErrorString(e),
                   cudaGetErrorName(e));
}

#define CUDA_TRY(d, call)                                   \
    do {                                                    \
        cudaError_t cuda_try_e_ = (call);                   \
        if (cuda_try_e_ != cudaSuccess)                     \
            return cuda_fail((d), cuda_try_e_, #call);      \
    } while (0)

static strata_status select_device(const dev_impl *d)
{
    CUDA_TRY(d, cudaSetDevice(d->id));
    return STRATA_OK;
}

/* ---------------------------------------------------------------- device */

static int cuda_count(void)
{
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

static strata_status cuda_probe(char *detail, size_t len)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        int rt = 0;
        cudaRuntimeGetVersion(&rt);
        char hint[128] = "";
        /* Without a driver, the runtime says "insufficient driver": say what that usually means here. */
        if (e == cudaErrorInsufficientDriver)
            snprintf(hint, sizeof hint, "; no NVIDIA driver is loaded, or it is older than this CUDA %d.%d runtime",
                     rt / 1000, rt % 1000 / 10);
        snprintf(detail, len, "cuda: no device (cudaGetDeviceCount: %s%s)", cudaGetErrorString(e), hint);
        return err_set(STRATA_EDEVICE, "%s", detail);
    }
    if (n == 0) {
        snprintf(detail, len, "cuda: no device (cudaGetDeviceCount found 0 devices)");
        return err_set(STRATA_EDEVICE, "%s", detail);
    }
    struct cudaDeviceProp p;
    e = cudaGetDeviceProperties(&p, 0);
    if (e != cudaSuccess) {
        snprintf(detail, len, "cuda: device 0 does not answer (cudaGetDeviceProperties: %s)", cudaGetErrorString(e));
        return err_set(STRATA_EDEVICE, "%s", detail);
    }
    int drv = 0, rt = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    char mem[32];
    snprintf(detail, len, "cuda: %d device%s; device 0: %s, %s, sm_%d%d; driver %d.%d, runtime %d.%d", n,
             n == 1 ? "" : "s", p.name, size_format(p.totalGlobalMem, mem, sizeof mem), p.major, p.minor,
             drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
    return STRATA_OK;
}

static bool cuda_pci_bus_id(dev_impl *d, char *buf, size_t len)
{
    return cudaDeviceGetPCIBusId(buf, (int)len, d->id) == cudaSuccess;
}

static strata_status cuda_create(const dev_options *opt, dev_impl **out, char *name, size_t name_len)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
        return cuda_fail(NULL, e, "cudaGetDeviceCount");
    if (opt->device_id >= n)
        return err_set(STRATA_EINVAL, "cuda: device_id = %d is out of range [0, %d); set strata.device_id",
                       opt->device_id, n);
    dev_impl *d = calloc(1, sizeof *d);
    if (!d)
        return err_set(STRATA_ENOMEM, "dev_create(cuda): out of host memory");
    d->id = opt->device_id;
    d->share = opt->budget_share > 1 ? opt->budget_share : 1;
    struct cudaDeviceProp p;
    strata_status st = select_device(d);
    if (st == STRATA_OK && (e = cudaGetDeviceProperties(&p, d->id)) != cudaSuccess)
        st = cuda_fail(d, e, "cudaGetDeviceProperties");
    if (st == STRATA_OK && (e = cudaStreamCreateWithFlags(&d->poison_stream, cudaStreamNonBlocking)) != cudaSuccess)
        st = cuda_fail(d, e, "cudaStreamCreateWithFlags");
    if (st != STRATA_OK) {
        free(d);
        return st;
    }
    snprintf(name, name_len, "cuda:%d (%s)", d->id, p.name);
    *out = d;
    return STRATA_OK;
}

/* Teardown calls cudaSetDevice directly: a failure there must not overwrite the error being reported. */
static void cuda_destroy(dev_impl *d)
{
    /* No cudaDeviceReset: the context belongs to the process, and the trainer uses it too. */
    if (cudaSetDevice(d->id) == cudaSuccess && d->poison_stream)
        cudaStreamDestroy(d->poison_stream);
    free(d);
}

static strata_status cuda_arena_reserve(dev_impl *d, size_t *bytes, void **base)
{
    ERR_CHECK(select_device(d));
    size_t free_b = 0, total_b = 0;
    CUDA_TRY(d, cudaMemGetInfo(&free_b, &total_b));
    char fb[32], tb[32], wb[32];
    size_t want = *bytes;
    if (want == 0) {
        if (free_b <= CUDA_HEADROOM_BYTES + CUDA_ARENA_GRANULE)
            return err_set(STRATA_EBUDGET, "cuda:%d: only %s of %s device memory is free; nothing left for an arena",
                           d->id, size_format(free_b, fb, sizeof fb), size_format(total_b, tb, sizeof tb));
        want = free_b - CUDA_HEADROOM_BYTES;
        /* Ranks sharing the GPU reserve one after another: a share of the total, so the first does not take what
         * the next needs, and never more than is free (each rank's context takes some, and other processes). */
        if (d->share > 1 && total_b / (size_t)d->share > CUDA_HEADROOM_BYTES + CUDA_ARENA_GRANULE)
            want = MIN(want, total_b / (size_t)d->share - CUDA_HEADROOM_BYTES);
        want = want / CUDA_ARENA_GRANULE * CUDA_ARENA_GRANULE;
    }
    if (want > free_b)
        return err_set(STRATA_EBUDGET,
                       "cuda:%d: device budget %s exceeds the free device memory %s (of %s); lower "
                       "strata.device_budget_bytes, or set it to 0 for all free memory",
                       d->id, size_format(want, wb, sizeof wb), size_format(free_b, fb, sizeof fb),
                       size_format(total_b, tb, sizeof tb));
    cudaError_t e = cudaMalloc(base, want);
    if (e != cudaSuccess) {
        *base = NULL;
        return err_set(STRATA_EBUDGET,
                       "cuda:%d: cudaMalloc of the %s device arena failed: %s (%s free of %s); lower "
                       "strata.device_budget_bytes",
                       d->id, size_format(want, wb, sizeof wb), cudaGetErrorString(e),
                       size_format(free_b, fb, sizeof fb), size_format(total_b, tb, sizeof tb));
    }
    *bytes = want;
    return STRATA_OK;
}

static void cuda_arena_release(dev_impl *d, void *base, size_t bytes)
{
    if (cudaSetDevice(d->id) == cudaSuccess)
        cudaFree(base);
}

static strata_status cuda_poison(dev_impl *d, void *ptr, size_t bytes)
{
    ERR_CHECK(select_device(d));
    CUDA_TRY(d, cuda_fill_u32(ptr, bytes, DEV_POISON_WORD, d->poison_stream));
    CUDA_TRY(d, cudaStreamSynchronize(d->poison_stream));
    return STRATA_OK;
}

/* ---------------------------------------------------------------- pinned host memory */

static strata_status cuda_host_alloc(dev_impl *d, size_t bytes, void **out)
{
    ERR_CHECK(select_device(d));
    cudaError_t e = cudaHostAlloc(out, bytes, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        char b[32];
        *out = NULL;
        return err_set(STRATA_ENOMEM,
                       "cuda:%d: cudaHostAlloc of %s pinned host memory failed: %s; lower "
                       "zero_optimization.sub_group_size or the prefetch window (the pinned pool), or move "
                       "state to NVMe (offload_param / offload_optimizer.device = \"nvme\")",
                       d->id, size_format(bytes, b, sizeof b), cudaGetErrorString(e));
    }
    return STRATA_OK;
}

static void cuda_host_free(dev_impl *d, void *ptr)
{
    cudaFreeHost(ptr);
}

static strata_status cuda_host_register(dev_impl *d, void *ptr, size_t bytes)
{
    ERR_CHECK(select_device(d));
    CUDA_TRY(d, cudaHostRegister(ptr, bytes, cudaHostRegisterPortable));
    return STRATA_OK;
}

static void cuda_host_unregister(dev_impl *d, void *ptr)
{
    cudaHostUnregister(ptr);
}

/* ---------------------------------------------------------------- streams */

static strata_status cuda_stream_create(dev_impl *d, const char *name, dev_impl_stream **out)
{
    cudaStream_t s;
    ERR_CHECK(select_device(d));
    CUDA_TRY(d, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *out = (dev_impl_stream *)(void *)s;
    return STRATA_OK;
}

static strata_status cuda_stream_wrap(dev_impl *d, void *native, const char *name, dev_impl_stream **out)
{
    *out = (dev_impl_stream *)native;
    return STRATA_OK;
}

static void cuda_stream_destroy(dev_impl *d, dev_impl_stream *s, bool wrapped)
{
    if (!wrapped)
        cudaStreamDestroy(as_stream(s));
}

static strata_status cuda_memcpy_async(dev_impl *d, dev_impl_stream *s, void *dst, const void *src, size_t bytes)
{
    ERR_CHECK(select_device(d));
    /* cudaMemcpyDefault: unified addressing tells the direction from the pointers. */
    CUDA_TRY(d, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(s)));
    return STRATA_OK;
}

static strata_status cuda_memset_async(dev_impl *d, dev_impl_stream *s, void *dst, int value, size_t bytes)
{
    ERR_CHECK(select_device(d));
    CUDA_TRY(d, cudaMemsetAsync(dst, value, bytes, as_stream(s)));
    return STRATA_OK;
}

static strata_status cuda_host_fn(dev_impl *d, dev_impl_stream *s, void (*fn)(void *), void *arg)
{
    ERR_CHECK(select_device(d));
    CUDA_TRY(d, cudaLaunchHostFunc(as_stream(s), fn, arg));
    return STRATA_OK;
}

static strata_status cuda_adam_step_op(dev_impl *d, dev_impl_stream *s, const struct adam_consts *c,
                                       const dev_adam_arrays *a, size_t n)
{
    ERR_CHECK(select_device(d));
    CUDA_TRY(d, cuda_adam_step(c, a->master, a->exp_avg, a->exp_avg_sq, a->grad, a->param, (int)a->param_dtype, n,
                               as_stream(s)));
    return STRATA_OK;
}

static strata_status cuda_stream_sync(dev_impl *d, dev_impl_stream *s)
{
    CUDA_TRY(d, cudaStreamSynchronize(as_stream(s)));
    return STRATA_OK;
}

/* ---------------------------------------------------------------- events */

static strata_status cuda_event_create(dev_impl *d, dev_impl_event **out)
{
    cudaEvent_t e;
    ERR_CHECK(select_device(d));
    CUDA_TRY(d, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    *out = (dev_impl_event *)(void *)e;
    return STRATA_OK;
}

static void cuda_event_destroy(dev_impl *d, dev_impl_event *e)
{
    /* Safe with work pending: the runtime releases the event once that work is done. */
    cudaEventDestroy(as_event(e));
}

static strata_status cuda_event_record(dev_impl *d, dev_impl_event *e, dev_impl_stream *s)
{
    ERR_CHECK(select_device(d));
    CUDA_TRY(d, cudaEventRecord(as_event(e), as_stream(s)));
    return STRATA_OK;
}

static strata_status cuda_stream_wait_event(dev_impl *d, dev_impl_stream *s, dev_impl_event *e)
{
    ERR_CHECK(select_device(d));
    CUDA_TRY(d, cudaStreamWaitEvent(as_stream(s), as_event(e), 0));
    return STRATA_OK;
}

static strata_status cuda_event_query(dev_impl *d, dev_impl_event *e, bool *done)
{
    cudaError_t r = cudaEventQuery(as_event(e));
    if (r == cudaErrorNotReady) {
        *done = false;
        return STRATA_OK;
    }
    if (r != cudaSuccess)
        return cuda_fail(d, r, "cudaEventQuery");
    *done = true;
    return STRATA_OK;
}

static strata_status cuda_event_sync(dev_impl *d, dev_impl_event *e)
{
    CUDA_TRY(d, cudaEventSynchronize(as_event(e)));
    return STRATA_OK;
}

const dev_ops dev_ops_cuda = {
    .name = "cuda",
    .kind = STRATA_BACKEND_CUDA,
    .native_handles = true,
    .probe = cuda_probe,
    .count = cuda_count,
    .pci_bus_id = cuda_pci_bus_id,
    .create = cuda_create,
    .destroy = cuda_destroy,
    .arena_reserve = cuda_arena_reserve,
    .arena_release = cuda_arena_release,
    .poison = cuda_poison,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
    .stream_create = cuda_stream_create,
    .stream_wrap = cuda_stream_wrap,
    .stream_destroy = cuda_stream_destroy,
    .memcpy_async = cuda_memcpy_async,
    .memset_async = cuda_memset_async,
    .host_fn = cuda_host_fn,
    .stream_sync = cuda_stream_sync,
    .adam_step = cuda_adam_step_op,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .stream_wait_event = cuda_stream_wait_event,
    .event_query = cuda_event_query,
    .event_sync = cuda_event_sync,
};
