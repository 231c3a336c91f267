/* Completion groups shared by the rings and their callers. */
#include "nvme/wait.h"

#include "base/util.h"

void io_wait_init(io_wait *w)
{
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->pending = 0;
    err_latch_init(&w->err);
    w->done_ns = 0;
    w->notify = NULL;
    w->notify_ctx = NULL;
}

void io_wait_set_notify(io_wait *w, io_notify_fn fn, void *ctx)
{
    w->notify = fn;
    w->notify_ctx = ctx;
}

void io_wait_destroy(io_wait *w)
{
    err_latch_destroy(&w->err);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
}

void io_wait_add(io_wait *w, int n)
{
    pthread_mutex_lock(&w->mu);
    w->pending += n;
    pthread_mutex_unlock(&w->mu);
}

void io_wait_finish(io_wait *w, strata_status st, const char *msg)
{
    pthread_mutex_lock(&w->mu);
    /* Latched before pending drops, so that the waiter who sees zero also sees the failure. */
    err_latch_set(&w->err, st, msg);
    bool last = --w->pending == 0;
    if (last)
        w->done_ns = now_ns();
    io_notify_fn fn = w->notify;
    void *ctx = w->notify_ctx;
    if (last && !fn)
        pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    /* The waiter may free w as soon as the mutex is released, so nothing below touches it. */
    if (last && fn)
        fn(w, ctx);
}

strata_status io_wait_wait(io_wait *w)
{
    pthread_mutex_lock(&w->mu);
    while (w->pending > 0)
        pthread_cond_wait(&w->cv, &w->mu);
    strata_status st = err_latch_take(&w->err, NULL);
    pthread_mutex_unlock(&w->mu);
    return st;
}

strata_status io_wait_take_status(io_wait *w, char *msg, size_t len)
{
    return err_latch_take_copy(&w->err, msg, len);
}

bool io_wait_idle(io_wait *w)
{
    pthread_mutex_lock(&w->mu);
    bool idle = w->pending == 0;
    pthread_mutex_unlock(&w->mu);
    return idle;
}
