/*
 * The first failure of work that runs on other threads.
 *
 * A worker (an I/O completion, a host function on a stream, the optimizer thread, a collective's
 * progress) cannot return its failure to the caller that queued it: it latches it here, and the
 * caller raises it at its next wait. The first failure wins because it is the cause; what fails
 * after it usually fails because of it. Every such hand-off in strata goes through this type.
 */
#ifndef STRATA_BASE_LATCH_H
#define STRATA_BASE_LATCH_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef struct err_latch {
    pthread_mutex_t lock; /* a leaf lock: nothing else is taken while it is held */
    atomic_bool failed;   /* read without the lock by err_latch_failed */
    err_slot first;
    uint64_t at;          /* where in its queue the first failure happened (err_latch_set_at); 0 = unknown */
} err_latch;

void err_latch_init(err_latch *l);
void err_latch_destroy(err_latch *l);

/* Keeps (st, msg) when nothing is latched yet; a later failure is dropped. A NULL msg keeps
 * strata_status_str(st); STRATA_OK is ignored. Thread-safe. Returns true when this call latched. */
bool err_latch_set(err_latch *l, strata_status st, const char *msg);

/* err_latch_set for work that runs in queue order: at (> 0) is the failing item's place in the queue,
 * so that err_latch_raise_upto can tell a waiter whether the failure came before what it waits for. */
bool err_latch_set_at(err_latch *l, uint64_t at, strata_status st, const char *msg);

/* Latches st with this thread's last error message (err_last()); returns st, so that a worker
 * can end with `return err_latch_set_last(&x->err, st);`. */
strata_status err_latch_set_last(err_latch *l, strata_status st);

/* Whether a failure is latched; lock-free, for polling loops. */
bool err_latch_failed(err_latch *l);

/* Makes the latched failure this thread's last error ("op: message" when op is not NULL) and
 * returns its status, or STRATA_OK. raise keeps it latched (a broken state that every later call
 * reports); take clears it (a per-round status, such as one batch of I/O). */
strata_status err_latch_raise(err_latch *l, const char *op);
strata_status err_latch_take(err_latch *l, const char *op);

/* err_latch_raise for a waiter on the queue's item upto: a failure latched at a later place (by
 * err_latch_set_at) is not its failure, and it gets STRATA_OK. */
strata_status err_latch_raise_upto(err_latch *l, uint64_t upto, const char *op);

/* Clears it and hands it over without touching this thread's error (msg may be NULL): for a
 * worker that passes a failure on to another latch or callback. */
strata_status err_latch_take_copy(err_latch *l, char *msg, size_t len);

#endif
