/*
 * Backend selection and everything the backends share (see device.h): argument checks, the
 * arena and its budget message, poisoning policy, tracking of what the caller made (so that
 * dev_destroy() can drain and free it), and the capture of errors from asynchronous work.
 *
 * This is the only file that knows which backends were built.
 */
#include "gpu/device.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "base/size.h"
#include "gpu/arena.h"

/* Pinned buffers and registrations the caller owns, kept so that misuse is caught and destroy frees them. */
typedef struct host_block host_block;
struct host_block {
    void *ptr;
    size_t bytes;
    bool registered; /* dev_host_register() rather than dev_host_alloc() */
    host_block *next;
};

struct dev_stream {
    device *dev;
    dev_impl_stream *impl;
    char name[32];
    bool wrapped; /* the caller's native stream: forgotten, not destroyed */
    dev_stream *prev, *next;
    /* Serialises enqueues so that sequence numbers follow queue order. */
    pthread_mutex_t lock;
    uint64_t seq;       /* items queued so far */
    /* The first failure of queued work, kept until dev_stream_sync() reports it. A lock of its own:
     * a failing host function takes it on the backend's thread, while an enqueue holding `lock` may
     * be blocked inside CUDA until that very thread moves on. */
    pthread_mutex_t err_lock;
    uint64_t err_seq;   /* 0 = none */
    strata_status err_status;
    char err_msg[ERR_MSG_BYTES];
};

struct dev_event {
    device *dev;
    dev_impl_event *impl;
    dev_stream *stream; /* where it was last recorded; NULL once that stream is gone */
    uint64_t seq;       /* its position there */
    dev_event *prev, *next;
};

struct device {
    const dev_ops *ops;
    dev_impl *impl;
    char name[96];
    bool poison;
    /* Guards the arena and every list below. */
    pthread_mutex_t lock;
    arena *arena;
    char *base;
    size_t budget;
    dev_stream *streams;
    dev_event *events;
    host_block *host_blocks;
    size_t pinned_bytes, registered_bytes;
};

/* One host function in flight: what runs, and where its failure is recorded. */
typedef struct host_call {
    dev_stream *stream;
    uint64_t seq;
    dev_host_fn_t fn;
    void *arg;
} host_call;

/* ---------------------------------------------------------------- selection */

static const dev_ops *backend_ops(strata_backend_kind kind)
{
    switch (kind) {
    case STRATA_BACKEND_HOST:
        return &dev_ops_host;
    case STRATA_BACKEND_CUDA:
#ifdef STRATA_HAVE_CUDA
        return &dev_ops_cuda;
#else
        return NULL;
#endif
    default:
        return NULL;
    }
}

static const char *const cuda_not_built = "cuda: not built (nvcc was not found when strata was configured)";

strata_status dev_probe(strata_backend_kind kind, char *detail, size_t len)
{
    char scratch[256];
    if (!detail || len == 0) {
        detail = scratch;
        len = sizeof scratch;
    }
    detail[0] = '\0';
    if (kind == STRATA_BACKEND_AUTO) {
        char why[256];
        if (dev_probe(STRATA_BACKEND_CUDA, why, sizeof why) == STRATA_OK) {
            snprintf(detail, len, "auto -> %s", why);
            return STRATA_OK;
        }
        char host[256];
        strata_status st = dev_probe(STRATA_BACKEND_HOST, host, sizeof host);
        snprintf(detail, len, "auto -> %s; %s", host, why);
        return st;
    }
    if (kind != STRATA_BACKEND_HOST && kind != STRATA_BACKEND_CUDA) {
        snprintf(detail, len, "unknown backend kind %d", (int)kind);
        return err_set(STRATA_EINVAL, "dev_probe: %s", detail);
    }
    const dev_ops *ops = backend_ops(kind);
    if (!ops) {
        snprintf(detail, len, "%s", cuda_not_built);
        return err_set(STRATA_EUNSUPPORTED, "%s", detail);
    }
    return ops->probe(detail, len);
}

/* Poisoning: asked for, or forced by STRATA_POISON, or the debug-build default. */
static bool poison_wanted(const dev_options *opt)
{
    if (opt->poison_on_free)
        return true;
    const char *env = getenv("STRATA_POISON");
    if (env && *env) {
        if (strcmp(env, "1") == 0)
            return true;
        if (strcmp(env, "0") == 0)
            return false;
        LOG_ONCE(STRATA_LOG_WARN, LOG_DEV, "STRATA_POISON=\"%s\" is not 0 or 1; ignored", env);
    }
#ifdef NDEBUG
    return false;
#else
    return true;
#endif
}

strata_status dev_create(strata_backend_kind kind, const dev_options *opt, device **out)
{
    static const dev_options defaults = DEV_OPTIONS_INIT;
    *out = NULL;
    if (!opt)
        opt = &defaults;
    if (opt->device_id < 0)
        return err_set(STRATA_EINVAL, "dev_create: device_id = %d must be >= 0", opt->device_id);
    if (opt->budget_bytes && opt->budget_bytes < DEV_ALIGN_BYTES)
        return err_set(STRATA_EINVAL,
                       "dev_create: budget_bytes = %zu is below one %d-byte block; set strata.device_budget_bytes "
                       "higher, or 0 for the backend's default",
                       opt->budget_bytes, DEV_ALIGN_BYTES);

    char why[256];
    if (kind == STRATA_BACKEND_AUTO) {
        kind = dev_probe(STRATA_BACKEND_CUDA, why, sizeof why) == STRATA_OK ? STRATA_BACKEND_CUDA
                                                                            : STRATA_BACKEND_HOST;
        if (kind == STRATA_BACKEND_HOST)
            LOG_INFO(LOG_DEV, "backend auto: using the host backend (%s)", why);
    } else if (kind == STRATA_BACKEND_CUDA) {
        strata_status st = dev_probe(kind, why, sizeof why);
        if (st == STRATA_EUNSUPPORTED)
            return err_set(st, "%s; rebuild with nvcc on PATH, or use backend \"host\"", why);
        if (st != STRATA_OK)
            return err_set(STRATA_EDEVICE, "%s; use backend \"host\" (or \"auto\") on this machine", why);
    } else if (kind != STRATA_BACKEND_HOST) {
        return err_set(STRATA_EINVAL, "dev_create: unknown backend kind %d (allowed: auto, host, cuda)", (int)kind);
    }

    device *dev = calloc(1, sizeof *dev);
    if (!dev)
        return err_set(STRATA_ENOMEM, "dev_create: out of host memory");
    pthread_mutex_init(&dev->lock, NULL);
    dev->ops = backend_ops(kind);
    strata_status st = dev->ops->create(opt, &dev->impl, dev->name, sizeof dev->name);
    if (st != STRATA_OK)
        goto fail;
    size_t bytes = opt->budget_bytes;
    void *base = NULL;
    st = dev->ops->arena_reserve(dev->impl, &bytes, &base);
    if (st != STRATA_OK)
        goto fail;
    dev->base = base;
    dev->budget = bytes;
    st = arena_create(bytes, DEV_ALIGN_BYTES, &dev->arena);
    if (st != STRATA_OK)
        goto fail;
    dev->poison = poison_wanted(opt);

    char b[32];
    LOG_INFO(LOG_DEV, "device %s (%s backend): arena %s, poison on free %s", dev->name, dev->ops->name,
             size_format(dev->budget, b, sizeof b), dev->poison ? "on" : "off");
    *out = dev;
    return STRATA_OK;
fail:
    dev_destroy(dev);
    return st;
}

void dev_destroy(device *dev)
{
    if (!dev)
        return;
    /* Drain every stream before freeing anything: queued work may wait on events of other streams. */
    for (dev_stream *s = dev->streams; s; s = s->next)
        dev->ops->stream_sync(dev->impl, s->impl);
    while (dev->events)
        dev_event_destroy(dev->events);
    while (dev->streams)
        dev_stream_destroy(dev->streams);
    for (host_block *h = dev->host_blocks, *n; h; h = n) {
        n = h->next;
        LOG_DEBUG(LOG_DEV, "device %s: freeing a %s pinned buffer the caller left", dev->name,
                  h->registered ? "registered" : "allocated");
        if (h->registered)
            dev->ops->host_unregister(dev->impl, h->ptr);
        else
            dev->ops->host_free(dev->impl, h->ptr);
        free(h);
    }
    arena_destroy(dev->arena);
    if (dev->base)
        dev->ops->arena_release(dev->impl, dev->base, dev->budget);
    if (dev->impl)
        dev->ops->destroy(dev->impl);
    pthread_mutex_destroy(&dev->lock);
    free(dev);
}

strata_backend_kind dev_kind(const device *dev)
{
    return dev->ops->kind;
}

const char *dev_name(const device *dev)
{
    return dev->name;
}

bool dev_poisons(const device *dev)
{
    return dev->poison;
}

/* ---------------------------------------------------------------- device memory */

strata_status dev_alloc(device *dev, size_t bytes, void **out)
{
    *out = NULL;
    if (bytes == 0)
        return err_set(STRATA_EINVAL, "dev_alloc: 0 bytes asked of device %s", dev->name);
    size_t off = 0;
    pthread_mutex_lock(&dev->lock);
    strata_status st = arena_alloc(dev->arena, bytes, &off);
    if (st == STRATA_EBUDGET) {
        arena_stats a;
        arena_get_stats(dev->arena, &a);
        char asked[32], fr[32], all[32], big[32];
        err_set(st,
                "device budget exceeded: asked %s, free %s of %s (largest free block %s); "
                "raise strata.device_budget_bytes or lower the prefetch window",
                size_format(bytes, asked, sizeof asked), size_format(a.free_bytes, fr, sizeof fr),
                size_format(a.size_bytes, all, sizeof all), size_format(a.largest_free_bytes, big, sizeof big));
    }
    pthread_mutex_unlock(&dev->lock);
    if (st == STRATA_OK)
        *out = dev->base + off;
    return st;
}

strata_status dev_free(device *dev, void *ptr)
{
    if (!ptr)
        return STRATA_OK;
    char *p = ptr;
    if (p < dev->base || p >= dev->base + dev->budget)
        return err_set(STRATA_EINVAL, "dev_free: %p is not device memory of %s (its arena is %p..%p)", ptr,
                       dev->name, (void *)dev->base, (void *)(dev->base + dev->budget));
    size_t off = (size_t)(p - dev->base);
    strata_status st = STRATA_OK;
    pthread_mutex_lock(&dev->lock);
    size_t bytes = arena_block_bytes(dev->arena, off);
    if (bytes == 0) {
        st = err_set(STRATA_EINVAL,
                     "dev_free: %p is not a live allocation of %s (freed twice, or inside a block)", ptr, dev->name);
    } else {
        /* Poison before the block can be carved again, so no new owner ever sees the fill land. */
        if (dev->poison)
            st = dev->ops->poison(dev->impl, ptr, bytes);
        arena_free(dev->arena, off, NULL);
    }
    pthread_mutex_unlock(&dev->lock);
    return st;
}

void dev_mem_stats_get(device *dev, dev_mem_stats *out)
{
    arena_stats a;
    pthread_mutex_lock(&dev->lock);
    arena_get_stats(dev->arena, &a);
    *out = (dev_mem_stats){
        .budget_bytes = a.size_bytes,
        .used_bytes = a.used_bytes,
        .peak_bytes = a.peak_bytes,
        .free_bytes = a.free_bytes,
        .largest_free_bytes = a.largest_free_bytes,
        .live_allocs = a.used_blocks,
        .free_blocks = a.free_blocks,
        .alloc_count = a.alloc_count,
        .pinned_bytes = dev->pinned_bytes,
        .registered_bytes = dev->registered_bytes,
    };
    pthread_mutex_unlock(&dev->lock);
}

void dev_reset_peak(device *dev)
{
    pthread_mutex_lock(&dev->lock);
    arena_reset_peak(dev->arena);
    pthread_mutex_unlock(&dev->lock);
}

/* ---------------------------------------------------------------- pinned host memory */

static strata_status track_host(device *dev, void *ptr, size_t bytes, bool registered)
{
    host_block *h = malloc(sizeof *h);
    if (!h)
        return err_set(STRATA_ENOMEM, "device %s: out of host memory for bookkeeping", dev->name);
    *h = (host_block){ptr, bytes, registered, NULL};
    pthread_mutex_lock(&dev->lock);
    h->next = dev->host_blocks;
    dev->host_blocks = h;
    if (registered)
        dev->registered_bytes += bytes;
    else
        dev->pinned_bytes += bytes;
    pthread_mutex_unlock(&dev->lock);
    return STRATA_OK;
}

/* Unlinks ptr's record when it is of the wanted sort; NULL when there is none. */
static host_block *untrack_host(device *dev, void *ptr, bool registered)
{
    pthread_mutex_lock(&dev->lock);
    host_block **pp = &dev->host_blocks;
    while (*pp && !((*pp)->ptr == ptr && (*pp)->registered == registered))
        pp = &(*pp)->next;
    host_block *h = *pp;
    if (h) {
        *pp = h->next;
        if (registered)
            dev->registered_bytes -= h->bytes;
        else
            dev->pinned_bytes -= h->bytes;
    }
    pthread_mutex_unlock(&dev->lock);
    return h;
}

strata_status dev_host_alloc(device *dev, size_t bytes, void **out)
{
    *out = NULL;
    if (bytes == 0)
        return err_set(STRATA_EINVAL, "dev_host_alloc: 0 bytes asked of device %s", dev->name);
    void *p = NULL;
    ERR_CHECK(dev->ops->host_alloc(dev->impl, bytes, &p));
    strata_status st = track_host(dev, p, bytes, false);
    if (st != STRATA_OK) {
        dev->ops->host_free(dev->impl, p);
        return st;
    }
    *out = p;
    return STRATA_OK;
}

strata_status dev_host_free(device *dev, void *ptr)
{
    if (!ptr)
        return STRATA_OK;
    host_block *h = untrack_host(dev, ptr, false);
    if (!h)
        return err_set(STRATA_EINVAL, "dev_host_free: %p was not allocated by dev_host_alloc() on %s (or was freed)",
                       ptr, dev->name);
    dev->ops->host_free(dev->impl, ptr);
    free(h);
    return STRATA_OK;
}

strata_status dev_host_register(device *dev, void *ptr, size_t bytes)
{
    if (!ptr || bytes == 0)
        return err_set(STRATA_EINVAL, "dev_host_register: %s on %s", ptr ? "0 bytes" : "NULL buffer", dev->name);
    ERR_CHECK(dev->ops->host_register(dev->impl, ptr, bytes));
    strata_status st = track_host(dev, ptr, bytes, true);
    if (st != STRATA_OK)
        dev->ops->host_unregister(dev->impl, ptr);
    return st;
}

strata_status dev_host_unregister(device *dev, void *ptr)
{
    host_block *h = ptr ? untrack_host(dev, ptr, true) : NULL;
    if (!h)
        return err_set(STRATA_EINVAL, "dev_host_unregister: %p is not registered with %s", ptr, dev->name);
    dev->ops->host_unregister(dev->impl, ptr);
    free(h);
    return STRATA_OK;
}

/* ---------------------------------------------------------------- streams */

/* Creates (native == NULL, wrap false) or wraps a stream, and links it to the device. */
static strata_status stream_open(device *dev, bool wrap, void *native, const char *name, dev_stream **out)
{
    *out = NULL;
    dev_stream *s = calloc(1, sizeof *s);
    if (!s)
        return err_set(STRATA_ENOMEM, "dev_stream_create: out of host memory");
    snprintf(s->name, sizeof s->name, "%s", name && *name ? name : "stream");
    s->dev = dev;
    s->wrapped = wrap;
    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_init(&s->err_lock, NULL);
    strata_status st = wrap ? dev->ops->stream_wrap(dev->impl, native, s->name, &s->impl)
                            : dev->ops->stream_create(dev->impl, s->name, &s->impl);
    if (st != STRATA_OK) {
        pthread_mutex_destroy(&s->err_lock);
        pthread_mutex_destroy(&s->lock);
        free(s);
        return st;
    }
    pthread_mutex_lock(&dev->lock);
    s->next = dev->streams;
    if (s->next)
        s->next->prev = s;
    dev->streams = s;
    pthread_mutex_unlock(&dev->lock);
    *out = s;
    return STRATA_OK;
}

strata_status dev_stream_create(device *dev, const char *name, dev_stream **out)
{
    return stream_open(dev, false, NULL, name, out);
}

strata_status dev_stream_wrap(device *dev, void *native, const char *name, dev_stream **out)
{
    return stream_open(dev, true, native, name, out);
}

void dev_stream_destroy(dev_stream *s)
{
    if (!s)
        return;
    device *dev = s->dev;
    dev->ops->stream_sync(dev->impl, s->impl);
    if (s->err_seq)
        LOG_WARN(LOG_DEV, "device %s: stream \"%s\" destroyed with an error nobody collected: %s", dev->name,
                 s->name, s->err_msg);
    pthread_mutex_lock(&dev->lock);
    if (s->prev)
        s->prev->next = s->next;
    else
        dev->streams = s->next;
    if (s->next)
        s->next->prev = s->prev;
    /* Events recorded here outlive it; their errors go with the stream. */
    for (dev_event *e = dev->events; e; e = e->next)
        if (e->stream == s)
            e->stream = NULL;
    pthread_mutex_unlock(&dev->lock);
    dev->ops->stream_destroy(dev->impl, s->impl, s->wrapped);
    pthread_mutex_destroy(&s->err_lock);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

const char *dev_stream_name(const dev_stream *s)
{
    return s->name;
}

void *dev_stream_native(const dev_stream *s)
{
    return s->dev->ops->native_handles ? (void *)s->impl : NULL;
}

void *dev_event_native(const dev_event *ev)
{
    return ev->dev->ops->native_handles ? (void *)ev->impl : NULL;
}

/* Every enqueue takes the next sequence number under the stream lock, so numbers follow queue order. */
strata_status dev_memcpy_async(dev_stream *s, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0)
        return STRATA_OK;
    if (!dst || !src)
        return err_set(STRATA_EINVAL, "dev_memcpy_async on stream \"%s\": NULL %s", s->name, dst ? "src" : "dst");
    pthread_mutex_lock(&s->lock);
    s->seq++;
    strata_status st = s->dev->ops->memcpy_async(s->dev->impl, s->impl, dst, src, bytes);
    pthread_mutex_unlock(&s->lock);
    return st;
}

strata_status dev_memset_async(dev_stream *s, void *dst, int value, size_t bytes)
{
    if (bytes == 0)
        return STRATA_OK;
    if (!dst)
        return err_set(STRATA_EINVAL, "dev_memset_async on stream \"%s\": NULL dst", s->name);
    pthread_mutex_lock(&s->lock);
    s->seq++;
    strata_status st = s->dev->ops->memset_async(s->dev->impl, s->impl, dst, value, bytes);
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* Runs on a backend thread: calls the caller's function and keeps its failure for the stream. */
static void run_host_call(void *arg)
{
    host_call *c = arg;
    dev_stream *s = c->stream;
    err_clear();
    strata_status st = c->fn(c->arg);
    if (st != STRATA_OK) {
        pthread_mutex_lock(&s->err_lock);
        if (!s->err_seq) {
            s->err_seq = c->seq;
            s->err_status = st;
            snprintf(s->err_msg, sizeof s->err_msg, "stream \"%s\" on %s: host function failed: %s", s->name,
                     s->dev->name, err_last()[0] ? err_last() : strata_status_str(st));
        }
        pthread_mutex_unlock(&s->err_lock);
    }
    free(c);
}

strata_status dev_host_fn(dev_stream *s, dev_host_fn_t fn, void *arg)
{
    if (!fn)
        return err_set(STRATA_EINVAL, "dev_host_fn on stream \"%s\": NULL function", s->name);
    host_call *c = malloc(sizeof *c);
    if (!c)
        return err_set(STRATA_ENOMEM, "dev_host_fn: out of host memory");
    pthread_mutex_lock(&s->lock);
    *c = (host_call){s, ++s->seq, fn, arg};
    strata_status st = s->dev->ops->host_fn(s->dev->impl, s->impl, run_host_call, c);
    pthread_mutex_unlock(&s->lock);
    if (st != STRATA_OK)
        free(c);
    return st;
}

/* Reports the stream's kept error when it happened at or before position upto; clear forgets it. */
static strata_status report_stream_error(dev_stream *s, uint64_t upto, bool clear)
{
    strata_status st = STRATA_OK;
    pthread_mutex_lock(&s->err_lock);
    if (s->err_seq && s->err_seq <= upto) {
        st = err_set(s->err_status, "%s", s->err_msg);
        if (clear)
            s->err_seq = 0;
    }
    pthread_mutex_unlock(&s->err_lock);
    return st;
}

strata_status dev_stream_sync(dev_stream *s)
{
    ERR_CHECK(s->dev->ops->stream_sync(s->dev->impl, s->impl));
    return report_stream_error(s, UINT64_MAX, true);
}

/* ---------------------------------------------------------------- events */

strata_status dev_event_create(device *dev, dev_event **out)
{
    *out = NULL;
    dev_event *e = calloc(1, sizeof *e);
    if (!e)
        return err_set(STRATA_ENOMEM, "dev_event_create: out of host memory");
    e->dev = dev;
    strata_status st = dev->ops->event_create(dev->impl, &e->impl);
    if (st != STRATA_OK) {
        free(e);
        return st;
    }
    pthread_mutex_lock(&dev->lock);
    e->next = dev->events;
    if (e->next)
        e->next->prev = e;
    dev->events = e;
    pthread_mutex_unlock(&dev->lock);
    *out = e;
    return STRATA_OK;
}

void dev_event_destroy(dev_event *ev)
{
    if (!ev)
        return;
    device *dev = ev->dev;
    pthread_mutex_lock(&dev->lock);
    if (ev->prev)
        ev->prev->next = ev->next;
    else
        dev->events = ev->next;
    if (ev->next)
        ev->next->prev = ev->prev;
    pthread_mutex_unlock(&dev->lock);
    dev->ops->event_destroy(dev->impl, ev->impl);
    free(ev);
}

strata_status dev_event_record(dev_event *ev, dev_stream *s)
{
    pthread_mutex_lock(&s->lock);
    uint64_t seq = ++s->seq;
    strata_status st = s->dev->ops->event_record(s->dev->impl, ev->impl, s->impl);
    pthread_mutex_unlock(&s->lock);
    /* The device lock is taken after the stream lock is dropped: report_event_error() nests them
     * the other way round. */
    if (st == STRATA_OK) {
        pthread_mutex_lock(&s->dev->lock);
        ev->stream = s;
        ev->seq = seq;
        pthread_mutex_unlock(&s->dev->lock);
    }
    return st;
}

strata_status dev_stream_wait_event(dev_stream *s, dev_event *ev)
{
    pthread_mutex_lock(&s->lock);
    s->seq++;
    strata_status st = s->dev->ops->stream_wait_event(s->dev->impl, s->impl, ev->impl);
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* The error of the stream ev was recorded on, if it happened before the recording. */
static strata_status report_event_error(dev_event *ev)
{
    pthread_mutex_lock(&ev->dev->lock);
    dev_stream *s = ev->stream;
    uint64_t seq = ev->seq;
    /* Holding the device lock keeps s alive: dev_stream_destroy() unlinks events under it. */
    strata_status st = s ? report_stream_error(s, seq, false) : STRATA_OK;
    pthread_mutex_unlock(&ev->dev->lock);
    return st;
}

strata_status dev_event_query(dev_event *ev, bool *done)
{
    *done = false;
    ERR_CHECK(ev->dev->ops->event_query(ev->dev->impl, ev->impl, done));
    return *done ? report_event_error(ev) : STRATA_OK;
}

strata_status dev_event_sync(dev_event *ev)
{
    ERR_CHECK(ev->dev->ops->event_sync(ev->dev->impl, ev->impl));
    return report_event_error(ev);
}
