/*
 * The worker thread and its FIFO: every collective of a comm runs here, one at a time, in the order the calls
 * were queued, so that all ranks issue the same sequence and MPI sees a single caller (MPI_THREAD_SERIALIZED).
 * Also the shared wait-loop pieces: deadlines, polling pauses and the broken state.
 */
#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "comm/comm_internal.h"

uint64_t comm_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t comm_deadline_ns(const comm *c)
{
    uint32_t ms = atomic_load(&c->timeout_ms);
    return ms ? comm_now_ns() + (uint64_t)ms * 1000000u : UINT64_MAX;
}

void comm_poll_pause(unsigned *spins)
{
    /* A short spin keeps the latency of quick collectives low; after it, a 50 us sleep: with more ranks than
     * cores (tests oversubscribe 2 cores with 4 ranks), a spinning rank would steal the core its peer needs. */
    if (++*spins < 64)
        return;
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
}

strata_status comm_mark_broken(comm *c, const char *op, const char *reason)
{
    if (err_latch_set(&c->broken, STRATA_ECOMM, reason))
        LOG_WARN(LOG_CORE, "comm rank %d of %d: %s: %s", c->rank, c->size, op, reason);
    return comm_check_broken(c, op);
}

strata_status comm_check_broken(comm *c, const char *op)
{
    return err_latch_raise(&c->broken, op);
}

strata_status comm_poll_check(comm *c, const char *op, uint64_t deadline_ns)
{
    char msg[ERR_MSG_BYTES];
    if (c->ops->peer_failed && c->ops->peer_failed(c, msg, sizeof msg))
        return comm_mark_broken(c, op, msg);
    /* This rank's own comm_abort_world (from another thread) ends its pending collective too. */
    if (err_latch_failed(&c->broken))
        return comm_check_broken(c, op);
    if (comm_now_ns() >= deadline_ns) {
        snprintf(msg, sizeof msg,
                 "timed out after %u ms waiting for ranks of the world of %d in collective #%llu (rank %d was ready; "
                 "a peer is stuck or slow, or died on another host; the config key strata.comm_timeout_s or "
                 "strata_comm_set_timeout sets the limit, 0 = wait forever)",
                 atomic_load(&c->timeout_ms), c->size, (unsigned long long)atomic_load(&c->seq), c->rank);
        return comm_mark_broken(c, op, msg);
    }
    return STRATA_OK;
}

static void *worker_main(void *arg)
{
    comm *c = arg;
    for (;;) {
        pthread_mutex_lock(&c->lock);
        while (!c->head && !c->stopping)
            pthread_cond_wait(&c->work_cv, &c->lock);
        comm_req *r = c->head;
        if (!r) {
            pthread_mutex_unlock(&c->lock);
            break;
        }
        c->head = r->next;
        if (!c->head)
            c->tail = NULL;
        pthread_mutex_unlock(&c->lock);

        err_clear();
        strata_status st = r->runs_when_broken ? STRATA_OK : comm_check_broken(c, r->op);
        if (st == STRATA_OK && r->kind != COMM_KIND_NONE) {
            r->seq = atomic_fetch_add(&c->seq, 1) + 1;
            if (c->ops->check_order)
                st = c->ops->check_order(c, r);
        }
        if (st == STRATA_OK)
            st = r->run(c, r);
        if (st == STRATA_OK)
            atomic_fetch_add(&c->bytes, r->payload_bytes);
        err_copy(&r->result, st);

        pthread_mutex_lock(&c->lock);
        r->done = true;
        pthread_cond_broadcast(&c->done_cv);
        pthread_mutex_unlock(&c->lock);
    }
    return NULL;
}

strata_status comm_start(const comm_ops *ops, comm_impl *impl, int rank, int size, int local_rank, int local_size,
                         comm **out)
{
    *out = NULL;
    comm *c = calloc(1, sizeof *c);
    if (!c) {
        ops->destroy(&(comm){.ops = ops, .impl = impl});
        return err_set(STRATA_ENOMEM, "comm: out of host memory");
    }
    c->ops = ops;
    c->impl = impl;
    c->rank = rank;
    c->size = size;
    c->local_rank = local_rank;
    c->local_size = local_size;
    atomic_init(&c->timeout_ms, COMM_DEFAULT_TIMEOUT_MS);
    err_latch_init(&c->broken);
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->work_cv, NULL);
    pthread_cond_init(&c->done_cv, NULL);
    int rc = pthread_create(&c->worker, NULL, worker_main, c);
    if (rc) {
        char b[128];
        strata_status st = err_set(err_from_errno(rc), "comm: pthread_create of the worker failed: %s",
                                   err_errno_str(rc, b, sizeof b));
        comm_destroy(c);
        return st;
    }
    c->worker_started = true;
    pthread_setname_np(c->worker, "strata-comm");
    LOG_INFO(LOG_CORE, "comm %s: rank %d of %d (local %d of %d)", ops->name, rank, size, local_rank, local_size);
    *out = c;
    return STRATA_OK;
}

strata_status comm_enqueue(comm *c, comm_req *r)
{
    if (!r->runs_when_broken)
        ERR_CHECK(comm_check_broken(c, r->op));
    r->c = c;
    r->done = false;
    r->next = NULL;
    pthread_mutex_lock(&c->lock);
    if (c->tail)
        c->tail->next = r;
    else
        c->head = r;
    c->tail = r;
    pthread_cond_signal(&c->work_cv);
    pthread_mutex_unlock(&c->lock);
    return STRATA_OK;
}

strata_status comm_req_finish(comm_req *r)
{
    comm *c = r->c;
    pthread_mutex_lock(&c->lock);
    while (!r->done)
        pthread_cond_wait(&c->done_cv, &c->lock);
    pthread_mutex_unlock(&c->lock);
    if (r->result.status != STRATA_OK)
        return err_set(r->result.status, "%s", r->result.msg);
    return STRATA_OK;
}

void comm_queue_stop(comm *c)
{
    if (!c->worker_started)
        return;
    pthread_mutex_lock(&c->lock);
    c->stopping = true;
    pthread_cond_signal(&c->work_cv);
    pthread_mutex_unlock(&c->lock);
    pthread_join(c->worker, NULL);
    c->worker_started = false;
}
