/* One io_uring, its I/O thread, piece splitting, completion checking and resubmission. */
#include "nvme/ring.h"

#include <assert.h>
#include <errno.h>
#include <liburing.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "base/latch.h"
#include "base/log.h"
#include "base/util.h"
#include "nvme/direct.h"
#include "nvme/fault.h"

/* user_data of the eventfd poll that wakes the thread; pieces use their (aligned) address. */
#define WAKE_TAG ((uint64_t)1)
/* EINTR/EAGAIN retries of one piece before it counts as an error (each retry is a new syscall). */
#define MAX_RETRIES 10000

typedef struct request {
    ring_req_args a;
    size_t cursor;          /* bytes handed to pieces so far */
    int inflight;           /* pieces of this request in flight */
    err_latch err;          /* its first failure, handed to the caller's io_wait when it finishes */
    struct request *next;
} request;

typedef struct piece {
    request *req;
    char *buf;
    uint64_t off;
    size_t len;             /* what is left of this piece */
    size_t sub_len;         /* what the last submission asked for (shorter under a SHORT fault) */
    unsigned retries;
    nvme_fault_kind fault;
    struct piece *next_free;
} piece;

struct ring {
    struct io_uring uring;
    bool uring_ok;
    pthread_t thread;
    bool thread_started;
    char name[32];
    size_t block;
    int qd;
    bool single_submit, overlap;
    ring_caps caps;
    int efd;

    pthread_mutex_t mu;     /* guards the queue and the two flags below */
    request *head, *tail;
    bool waiting;           /* the thread may block: a producer must write the eventfd */
    bool stopping;

    /* Owned by the thread. */
    piece *pieces, *free_list;
    int inflight;
    request *cur;           /* request being split into pieces */
    /* How the ring submitted, logged when it goes: what aio.single_submit and overlap_events change. */
    uint64_t pieces_started, submissions, largest_submission, started_in_flight;
};

/* io_uring_submit (or submit_and_wait) result: counted when it submitted anything. */
static void count_submission(ring *r, int submitted)
{
    if (submitted <= 0)
        return;
    r->submissions++;
    r->largest_submission = MAX(r->largest_submission, (uint64_t)submitted);
}

static void submit(ring *r)
{
    count_submission(r, io_uring_submit(&r->uring));
}

static const char *op_name(ring_op op)
{
    return op == RING_READ ? "read" : "write";
}

static void fail_request(request *q, strata_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail_request(request *q, strata_status st, const char *fmt, ...)
{
    if (err_latch_failed(&q->err))
        return; /* only the first failure is kept: spare formatting the later ones */
    char msg[ERR_MSG_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    err_latch_set(&q->err, st, msg);
}

static void finish_request(ring *r, request *q)
{
    if (r->cur == q)
        r->cur = NULL;
    char msg[ERR_MSG_BYTES];
    strata_status st = err_latch_take_copy(&q->err, msg, sizeof msg);
    io_wait_finish(q->a.w, st, msg);
    err_latch_destroy(&q->err);
    free(q);
}

static struct io_uring_sqe *get_sqe(ring *r)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&r->uring);
    if (!sqe) {
        /* The SQ is sized for every piece plus the wake poll, so this only happens when
         * SQPOLL has not consumed entries yet; submitting makes room. */
        submit(r);
        sqe = io_uring_get_sqe(&r->uring);
    }
    return sqe;
}

static void arm_wake(ring *r)
{
    struct io_uring_sqe *sqe = get_sqe(r);
    io_uring_prep_poll_add(sqe, r->efd, POLLIN);
    io_uring_sqe_set_data64(sqe, WAKE_TAG);
}

/* Puts a piece's (remaining) transfer into an SQE. */
static void prep_piece(ring *r, piece *p)
{
    const ring_req_args *a = &p->req->a;
    size_t len = p->len;
    if (p->fault == NVME_FAULT_SHORT) {
        /* A short transfer that direct I/O can still express: half, rounded down to the block. */
        size_t half = a->direct ? len / 2 / NVME_ALIGN * NVME_ALIGN : len / 2;
        if (half > 0)
            len = half;
        p->fault = NVME_FAULT_NONE;
    }
    p->sub_len = len;
    struct io_uring_sqe *sqe = get_sqe(r);
    int fd = a->fixed_file >= 0 ? a->fixed_file : a->fd;
    if (a->op == RING_READ) {
        if (a->fixed_buf >= 0)
            io_uring_prep_read_fixed(sqe, fd, p->buf, (unsigned)len, p->off, a->fixed_buf);
        else
            io_uring_prep_read(sqe, fd, p->buf, (unsigned)len, p->off);
    } else {
        if (a->fixed_buf >= 0)
            io_uring_prep_write_fixed(sqe, fd, p->buf, (unsigned)len, p->off, a->fixed_buf);
        else
            io_uring_prep_write(sqe, fd, p->buf, (unsigned)len, p->off);
    }
    if (a->fixed_file >= 0)
        sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data(sqe, p);
    if (r->single_submit)
        submit(r);
}

/* Starts pieces of queued requests while slots are free. */
static void fill(ring *r)
{
    /* Without overlap_events a batch is submitted only once the previous one has fully completed. */
    if (!r->overlap && r->inflight > 0)
        return;
    int earlier = r->inflight; /* pieces submitted before this call and not yet complete */
    while (r->free_list) {
        if (!r->cur) {
            pthread_mutex_lock(&r->mu);
            request *q = r->head;
            if (q) {
                r->head = q->next;
                if (!r->head)
                    r->tail = NULL;
            }
            pthread_mutex_unlock(&r->mu);
            if (!q)
                break;
            r->cur = q;
        }
        request *q = r->cur;
        if (err_latch_failed(&q->err) || q->cursor >= q->a.len) {
            r->cur = NULL; /* fully issued; its last piece finishes it */
            continue;
        }
        piece *p = r->free_list;
        r->free_list = p->next_free;
        p->req = q;
        p->buf = (char *)q->a.buf + q->cursor;
        p->off = q->a.offset + q->cursor;
        p->len = MIN(r->block, q->a.len - q->cursor);
        p->retries = 0;
        p->fault = nvme_fault_next();
        q->cursor += p->len;
        q->inflight++;
        r->inflight++;
        r->pieces_started++;
        r->started_in_flight += earlier > 0;
        prep_piece(r, p);
    }
    /* The batch goes in with the wait that follows (ring_main's io_uring_submit_and_wait): one system call a
     * round instead of two. */
}

static void release_piece(ring *r, piece *p)
{
    request *q = p->req;
    p->req = NULL;
    p->next_free = r->free_list;
    r->free_list = p;
    r->inflight--;
    q->inflight--;
    if (q->inflight == 0 && (err_latch_failed(&q->err) || q->cursor >= q->a.len))
        finish_request(r, q);
}

/* Checks one completion: every result is looked at, nothing is assumed. */
static void complete_piece(ring *r, piece *p, int res)
{
    request *q = p->req;
    const ring_req_args *a = &q->a;
    char eb[96];
    if (p->fault == NVME_FAULT_EIO || p->fault == NVME_FAULT_EAGAIN) {
        res = p->fault == NVME_FAULT_EIO ? -EIO : -EAGAIN;
        p->fault = NVME_FAULT_NONE;
    }
    if ((res == -EAGAIN || res == -EINTR) && ++p->retries <= MAX_RETRIES) {
        prep_piece(r, p);
        return;
    }
    if (res < 0) {
        int e = -res;
        fail_request(q, err_from_errno(e), "%s \"%s\" at offset %llu, length %zu failed: %s", op_name(a->op),
                     a->path, (unsigned long long)p->off, p->len, err_errno_str(e, eb, sizeof eb));
    } else if (res == 0) {
        if (a->op == RING_READ)
            fail_request(q, STRATA_EIO,
                         "read beyond end of data: \"%s\" has no data at offset %llu (wanted %zu bytes; "
                         "request offset %llu, length %zu)",
                         a->path, (unsigned long long)p->off, p->len, (unsigned long long)a->offset, a->len);
        else
            fail_request(q, STRATA_EIO, "write \"%s\" at offset %llu, length %zu made no progress (0 bytes written)",
                         a->path, (unsigned long long)p->off, p->len);
    } else if ((size_t)res < p->len) {
        /* A direct read that stops off the block grid has hit the end of the file: the
         * remainder cannot even be asked for. */
        if (a->op == RING_READ && a->direct && res % NVME_ALIGN != 0) {
            fail_request(q, STRATA_EIO,
                         "read beyond end of data: \"%s\" ends at offset %llu, inside a read at offset %llu "
                         "of length %zu",
                         a->path, (unsigned long long)(p->off + (uint64_t)res), (unsigned long long)a->offset,
                         a->len);
        } else {
            LOG_TRACE(LOG_IO, "%s: short %s of \"%s\" at %llu: %d of %zu bytes; resubmitting the rest", r->name,
                      op_name(a->op), a->path, (unsigned long long)p->off, res, p->sub_len);
            p->buf += res;
            p->off += (uint64_t)res;
            p->len -= (size_t)res;
            p->retries = 0;
            prep_piece(r, p);
            return;
        }
    }
    release_piece(r, p);
}

static void cancel_request(ring *r, request *q)
{
    fail_request(q, STRATA_ECANCELED,
                 "%s \"%s\" at offset %llu, length %zu canceled: the I/O handle was destroyed before it finished",
                 op_name(q->a.op), q->a.path, (unsigned long long)q->a.offset, q->a.len);
    if (q->inflight == 0)
        finish_request(r, q);
}

static void drain_eventfd(ring *r)
{
    uint64_t v;
    while (read(r->efd, &v, sizeof v) > 0) {
    }
}

static void *ring_main(void *arg)
{
    ring *r = arg;
    arm_wake(r);
    submit(r);
    for (;;) {
        pthread_mutex_lock(&r->mu);
        bool stop = r->stopping;
        request *cancel = stop ? r->head : NULL;
        if (stop)
            r->head = r->tail = NULL;
        pthread_mutex_unlock(&r->mu);
        while (cancel) {
            request *next = cancel->next;
            cancel_request(r, cancel);
            cancel = next;
        }
        /* A request whose every piece is already issued completes normally; only the unissued rest is canceled. */
        if (stop && r->cur && r->cur->cursor < r->cur->a.len)
            cancel_request(r, r->cur);
        else if (stop)
            r->cur = NULL;
        if (!stop)
            fill(r);
        if (stop && r->inflight == 0)
            break;

        pthread_mutex_lock(&r->mu);
        bool more = !r->stopping && r->head && r->free_list && (r->overlap || r->inflight == 0);
        if (!more)
            r->waiting = true;
        pthread_mutex_unlock(&r->mu);
        if (more)
            continue;

        struct io_uring_cqe *cqe;
        int rc = io_uring_submit_and_wait(&r->uring, 1);
        count_submission(r, rc);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
            char eb[96];
            LOG_ERROR(LOG_IO, "%s: io_uring_enter failed: %s; retrying", r->name, err_errno_str(-rc, eb, sizeof eb));
        }
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&r->uring, head, cqe) {
            seen++;
            if (cqe->user_data == WAKE_TAG) {
                drain_eventfd(r);
                arm_wake(r);
                continue;
            }
            complete_piece(r, io_uring_cqe_get_data(cqe), cqe->res);
        }
        io_uring_cq_advance(&r->uring, seen);
    }
    return NULL;
}

static strata_status setup_uring(ring *r, const strata_aio_config *cfg)
{
    char eb[96];
    unsigned entries = (unsigned)r->qd + 2;
    struct io_uring_params p;
    if (cfg->sqpoll != STRATA_SWITCH_OFF) {
        memset(&p, 0, sizeof p);
        p.flags = IORING_SETUP_SQPOLL;
        p.sq_thread_idle = 50;
        int rc = io_uring_queue_init_params(entries, &r->uring, &p);
        if (rc == 0) {
            r->caps.sqpoll = true;
            return STRATA_OK;
        }
        if (cfg->sqpoll == STRATA_SWITCH_ON)
            return err_set(STRATA_EUNSUPPORTED,
                           "aio.sqpoll is on but io_uring refused SQPOLL: %s; set aio.sqpoll to auto or false",
                           err_errno_str(-rc, eb, sizeof eb));
        LOG_INFO(LOG_IO, "%s: SQPOLL not permitted (%s); using normal submission", r->name,
                 err_errno_str(-rc, eb, sizeof eb));
    }
    memset(&p, 0, sizeof p);
    int rc = io_uring_queue_init_params(entries, &r->uring, &p);
    if (rc < 0)
        return err_set(err_from_errno(-rc),
                       "io_uring_queue_init(%u entries) failed: %s; is io_uring disabled "
                       "(/proc/sys/kernel/io_uring_disabled) or blocked by a seccomp policy?",
                       entries, err_errno_str(-rc, eb, sizeof eb));
    return STRATA_OK;
}

strata_status ring_create(const strata_aio_config *cfg, const char *name, ring **out)
{
    *out = NULL;
    /* nvme_aio_validate() has checked the ranges. */
    assert(cfg->block_size % NVME_ALIGN == 0 && cfg->queue_depth >= 1);
    ring *r = calloc(1, sizeof *r);
    if (!r)
        return err_set(STRATA_ENOMEM, "ring: out of memory");
    snprintf(r->name, sizeof r->name, "%s", name);
    r->block = cfg->block_size;
    r->qd = cfg->queue_depth;
    r->single_submit = cfg->single_submit;
    r->overlap = cfg->overlap_events;
    r->efd = -1;
    pthread_mutex_init(&r->mu, NULL);
    strata_status st = STRATA_OK;
    r->pieces = calloc((size_t)r->qd, sizeof *r->pieces);
    if (!r->pieces) {
        st = err_set(STRATA_ENOMEM, "ring: out of memory");
        goto fail;
    }
    for (int i = r->qd - 1; i >= 0; i--) {
        r->pieces[i].next_free = r->free_list;
        r->free_list = &r->pieces[i];
    }
    r->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (r->efd < 0) {
        char eb[96];
        st = err_set(STRATA_EIO, "ring: eventfd failed: %s", err_errno_str(errno, eb, sizeof eb));
        goto fail;
    }
    st = setup_uring(r, cfg);
    if (st != STRATA_OK)
        goto fail;
    r->uring_ok = true;
    /* Registered buffers and files save the kernel a page walk and an fd lookup per I/O;
     * they are an optimization, so a refusal is only worth an info line. */
    int rc = io_uring_register_buffers_sparse(&r->uring, RING_MAX_FIXED);
    r->caps.fixed_buffers = rc == 0;
    rc = io_uring_register_files_sparse(&r->uring, RING_MAX_FIXED);
    r->caps.fixed_files = rc == 0;
    if (!r->caps.fixed_buffers || !r->caps.fixed_files)
        LOG_INFO(LOG_IO, "%s: registered buffers %s, fixed files %s (the kernel refused; plain I/O is used)", r->name,
                 r->caps.fixed_buffers ? "on" : "off", r->caps.fixed_files ? "on" : "off");
    if (pthread_create(&r->thread, NULL, ring_main, r) != 0) {
        st = err_set(STRATA_ENOMEM, "ring: cannot start the I/O thread");
        goto fail;
    }
    r->thread_started = true;
    *out = r;
    return STRATA_OK;
fail:
    ring_destroy(r);
    return st;
}

void ring_destroy(ring *r)
{
    if (!r)
        return;
    if (r->thread_started) {
        pthread_mutex_lock(&r->mu);
        r->stopping = true;
        pthread_mutex_unlock(&r->mu);
        uint64_t one = 1;
        ssize_t n = write(r->efd, &one, sizeof one);
        (void)n;
        pthread_join(r->thread, NULL);
        LOG_DEBUG(LOG_IO, "%s: %llu pieces in %llu submissions (at most %llu SQEs in one); %llu pieces started while "
                  "earlier ones were in flight", r->name, (unsigned long long)r->pieces_started,
                  (unsigned long long)r->submissions, (unsigned long long)r->largest_submission,
                  (unsigned long long)r->started_in_flight);
    }
    if (r->uring_ok)
        io_uring_queue_exit(&r->uring);
    if (r->efd >= 0)
        close(r->efd);
    free(r->pieces);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

strata_status ring_submit(ring *r, const ring_req_args *a)
{
    if (a->len > 0 && !a->buf)
        return err_set(STRATA_EINVAL, "%s \"%s\": buffer is NULL", op_name(a->op), a->path);
    request *q = calloc(1, sizeof *q);
    if (!q)
        return err_set(STRATA_ENOMEM, "ring: out of memory for a request");
    q->a = *a;
    if (a->len == 0) {
        io_wait_finish(a->w, STRATA_OK, NULL);
        free(q);
        return STRATA_OK;
    }
    err_latch_init(&q->err);
    pthread_mutex_lock(&r->mu);
    if (r->stopping) {
        pthread_mutex_unlock(&r->mu);
        err_latch_destroy(&q->err);
        free(q);
        return err_set(STRATA_ESTATE, "%s \"%s\": the I/O handle is being destroyed", op_name(a->op), a->path);
    }
    if (r->tail)
        r->tail->next = q;
    else
        r->head = q;
    r->tail = q;
    bool wake = r->waiting;
    r->waiting = false;
    pthread_mutex_unlock(&r->mu);
    if (wake) {
        uint64_t one = 1;
        ssize_t n = write(r->efd, &one, sizeof one);
        (void)n;
    }
    return STRATA_OK;
}

bool ring_register_buffer(ring *r, int slot, void *buf, size_t len)
{
    if (!r->caps.fixed_buffers || slot < 0 || slot >= RING_MAX_FIXED)
        return false;
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    int rc = io_uring_register_buffers_update_tag(&r->uring, (unsigned)slot, &iov, NULL, 1);
    if (rc < 0) {
        char eb[96];
        LOG_ONCE(STRATA_LOG_INFO, LOG_IO,
                 "cannot register a %zu-byte buffer with io_uring: %s (RLIMIT_MEMLOCK too small?); "
                 "using unregistered buffers",
                 len, err_errno_str(-rc, eb, sizeof eb));
        return false;
    }
    return true;
}

void ring_unregister_buffer(ring *r, int slot)
{
    struct iovec iov = {.iov_base = NULL, .iov_len = 0};
    if (r->caps.fixed_buffers && slot >= 0 && slot < RING_MAX_FIXED)
        io_uring_register_buffers_update_tag(&r->uring, (unsigned)slot, &iov, NULL, 1);
}

bool ring_register_file(ring *r, int slot, int fd)
{
    if (!r->caps.fixed_files || slot < 0 || slot >= RING_MAX_FIXED)
        return false;
    return io_uring_register_files_update(&r->uring, (unsigned)slot, &fd, 1) == 1;
}

void ring_unregister_file(ring *r, int slot)
{
    int fd = -1;
    if (r->caps.fixed_files && slot >= 0 && slot < RING_MAX_FIXED)
        io_uring_register_files_update(&r->uring, (unsigned)slot, &fd, 1);
}

ring_caps ring_get_caps(const ring *r)
{
    return r->caps;
}
