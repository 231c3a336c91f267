/*
 * Streams and events over a backend's own (see device.h), and the capture of errors from
 * asynchronous work: every enqueue takes a sequence number, a failing host function records its
 * error with its number, and an event reports that error when it was recorded after it.
 */
#include <stdio.h>
#include <stdlib.h>

#include "base/log.h"
#include "gpu/device_internal.h"

/* One host function in flight: what runs, and where its failure is recorded. */
typedef struct host_call {
    dev_stream *stream;
    uint64_t seq;
    dev_host_fn_t fn;
    void *arg;
} host_call;

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
    err_latch_init(&s->err);
    strata_status st = wrap ? dev->ops->stream_wrap(dev->impl, native, s->name, &s->impl)
                            : dev->ops->stream_create(dev->impl, s->name, &s->impl);
    if (st != STRATA_OK) {
        err_latch_destroy(&s->err);
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
    char msg[ERR_MSG_BYTES];
    if (err_latch_take_copy(&s->err, msg, sizeof msg) != STRATA_OK)
        LOG_WARN(LOG_DEV, "device %s: stream \"%s\" destroyed with an error nobody collected: %s", dev->name,
                 s->name, msg);
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
    err_latch_destroy(&s->err);
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
    if (st != STRATA_OK && !err_latch_failed(&s->err)) {
        char msg[ERR_MSG_BYTES];
        snprintf(msg, sizeof msg, "stream \"%s\" on %s: host function failed: %s", s->name, s->dev->name,
                 err_last()[0] ? err_last() : strata_status_str(st));
        err_latch_set_at(&s->err, c->seq, st, msg);
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

strata_status dev_adam_step(dev_stream *s, const struct adam_consts *c, const dev_adam_arrays *a, size_t n)
{
    if (n == 0)
        return STRATA_OK;
    if (!c || !a || !a->master || !a->exp_avg || !a->exp_avg_sq || !a->grad)
        return err_set(STRATA_EINVAL, "dev_adam_step on stream \"%s\": NULL constants or array", s->name);
    bool narrow = a->param_dtype == STRATA_DTYPE_BF16 || a->param_dtype == STRATA_DTYPE_FP16;
    if (!narrow && a->param_dtype != STRATA_DTYPE_FP32 && a->param_dtype != STRATA_DTYPE_NONE)
        return err_set(STRATA_EINVAL, "dev_adam_step on stream \"%s\": param_dtype %d is not one of fp32, bf16, "
                       "fp16 or none", s->name, (int)a->param_dtype);
    if (a->param_dtype != STRATA_DTYPE_NONE && !a->param)
        return err_set(STRATA_EINVAL, "dev_adam_step on stream \"%s\": NULL param with a param_dtype", s->name);
    pthread_mutex_lock(&s->lock);
    s->seq++;
    strata_status st = s->dev->ops->adam_step(s->dev->impl, s->impl, c, a, n);
    pthread_mutex_unlock(&s->lock);
    return st;
}

strata_status dev_stream_sync(dev_stream *s)
{
    ERR_CHECK(s->dev->ops->stream_sync(s->dev->impl, s->impl));
    return err_latch_take(&s->err, NULL);
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
    strata_status st = s ? err_latch_raise_upto(&s->err, seq, NULL) : STRATA_OK;
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
