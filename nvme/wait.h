/*
 * A completion group: the caller adds the requests it submits, the I/O threads finish them,
 * the caller waits (or polls) once for all. The first failure's status and message are kept
 * and handed to the waiting thread's last error, since they were found on an I/O thread.
 */
#ifndef STRATA_NVME_WAIT_H
#define STRATA_NVME_WAIT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/latch.h"

typedef struct io_wait io_wait;

/* Called by the I/O thread when the group's last request finishes, instead of a broadcast
 * (the benchmark uses it to refill a slot). It must not block; w may be reused after it returns. */
typedef void (*io_notify_fn)(io_wait *w, void *ctx);

struct io_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending;
    err_latch err;              /* first failure since the last io_wait_wait/take_status */
    uint64_t done_ns;           /* when pending last reached zero (now_ns clock) */
    io_notify_fn notify;
    void *notify_ctx;
};

void io_wait_init(io_wait *w);
void io_wait_set_notify(io_wait *w, io_notify_fn fn, void *ctx);
void io_wait_destroy(io_wait *w);

/* Counts n more requests (before submitting them). */
void io_wait_add(io_wait *w, int n);

/* Finishes one request with its status (msg is used when st is a failure). Thread-safe. */
void io_wait_finish(io_wait *w, strata_status st, const char *msg);

/* Blocks until nothing is pending; returns the first failure (also set as this thread's last
 * error) or STRATA_OK, and resets the status for the next round. */
strata_status io_wait_wait(io_wait *w);

/* For groups with a notify function (which io_wait_wait cannot wait on): returns the first failure
 * (message into msg) and resets it. Call it from the notify function or after it ran. */
strata_status io_wait_take_status(io_wait *w, char *msg, size_t len);

/* True when nothing is pending (a later io_wait_wait returns without blocking). */
bool io_wait_idle(io_wait *w);

#endif
