/*
 * One io_uring and the I/O thread that owns it.
 *
 * Callers queue requests (any length, any thread); the thread splits each into pieces of at
 * most block_size, keeps up to queue_depth pieces in flight, submits them in batches and
 * checks every completion: a negative result is an error naming the file, offset, length and
 * errno; a short transfer is resubmitted for the remainder; EINTR/EAGAIN are retried; a read
 * that returns 0 bytes is "read beyond end of data", never zero-filled success.
 * Destroying a ring cancels requests that have not started and drains those in flight.
 */
#ifndef STRATA_NVME_RING_H
#define STRATA_NVME_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nvme/wait.h"
#include "strata.h"

#define RING_MAX_FIXED 64 /* registered buffer and file slots per ring */

typedef enum ring_op { RING_READ = 0, RING_WRITE } ring_op;

typedef struct ring ring;

/* One request as the caller describes it; the ring copies it. path and the buffer must stay
 * valid until the request finishes (w is finished once for it). */
typedef struct ring_req_args {
    ring_op op;
    int fd;
    int fixed_file;   /* slot from ring_register_file, or -1 */
    int fixed_buf;    /* slot from ring_register_buffer holding all of buf..buf+len, or -1 */
    bool direct;      /* the fd is O_DIRECT: a short read that ends unaligned is the end of data */
    const char *path; /* for messages */
    void *buf;
    uint64_t offset;
    size_t len;
    io_wait *w;
} ring_req_args;

/* What a ring got from the kernel, for logs and benchmarks. */
typedef struct ring_caps {
    bool sqpoll;
    bool fixed_buffers;
    bool fixed_files;
} ring_caps;

/* Creates a ring with cfg's block_size, queue_depth, single_submit, overlap_events and sqpoll,
 * and starts its thread. name appears in messages ("aio ring 0"). */
strata_status ring_create(const strata_aio_config *cfg, const char *name, ring **out);

/* Cancels queued requests (STRATA_ECANCELED), drains in-flight pieces, stops the thread. NULL-safe. */
void ring_destroy(ring *r);

/* Queues a request. Thread-safe. Fails (without finishing w) only on bad arguments or when the
 * ring is shutting down. */
strata_status ring_submit(ring *r, const ring_req_args *a);

/* Registers a buffer / file in slot (0..RING_MAX_FIXED-1). Returns false (and the caller uses
 * the plain path) when the kernel or RLIMIT_MEMLOCK refuses. Thread-safe. */
bool ring_register_buffer(ring *r, int slot, void *buf, size_t len);
void ring_unregister_buffer(ring *r, int slot);
bool ring_register_file(ring *r, int slot, int fd);
void ring_unregister_file(ring *r, int slot);

ring_caps ring_get_caps(const ring *r);

#endif
