/*
 * What the files of comm/ share: the implementation vtable, the comm handle and the queued request.
 * Private to comm/.
 *
 * comm.c validates and counts, comm_queue.c owns the worker thread and its FIFO, comm_dev.c the device
 * paths; an implementation (comm_single.c, comm_mpi.c) fills comm_ops with the host collectives, which only
 * ever run on the worker thread, one at a time and in queue order.
 */
#ifndef STRATA_COMM_COMM_INTERNAL_H
#define STRATA_COMM_COMM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "base/latch.h"
#include "comm/comm.h"

typedef struct comm_impl comm_impl; /* an implementation's own state */
typedef struct comm_dev_state comm_dev_state; /* comm_dev.c's staging buffers and stream */
typedef struct comm_nccl comm_nccl; /* comm_nccl.c's communicator and stream */

/* Every op runs on the comm's worker thread and returns STRATA_OK or a status with err_set() detail that
 * names the operation (`op` is the public name, "comm_allgather"). A failure that leaves the world in an
 * unknown state (a peer failed, a deadline passed) also marks the comm broken (comm_mark_broken). */
typedef struct comm_ops {
    const char *name; /* "single", "mpi" */
    strata_status (*allreduce)(comm *c, const char *op, void *buf, size_t count, comm_dtype dt, comm_op rop);
    strata_status (*reduce_scatter)(comm *c, const char *op, const void *send, void *recv, size_t recv_count,
                                    comm_dtype dt);
    /* in_place: send is recv's own block (see comm_allgather). */
    strata_status (*allgather)(comm *c, const char *op, const void *send, void *recv, size_t send_count,
                               comm_dtype dt, bool in_place);
    strata_status (*broadcast)(comm *c, const char *op, void *buf, size_t count, comm_dtype dt, int root);
    strata_status (*barrier)(comm *c, const char *op);
    /* Tells every other rank that this one failed (msg is "rank R failed: why"). Worker thread. */
    void (*abort_world)(comm *c, const char *msg);
    /* Whether a peer's abort message has arrived (msg receives it); never blocks. Worker thread. May be NULL. */
    bool (*peer_failed)(comm *c, char *msg, size_t len);
    /* Before collective number r->seq (every request with a kind): every rank learns what every other is about to
     * run, and a rank in a different collective, or with other sizes, fails every rank at once with one message
     * naming both calls and ranks, instead of a transport error or a deadline. Worker thread. May be NULL. */
    strata_status (*check_order)(comm *c, const comm_req *r);
    /* Frees impl after the worker has stopped, on the destroying thread. */
    void (*destroy)(comm *c);
} comm_ops;

/* What a request does to the world, compared across ranks before it runs (check_order). COMM_KIND_NONE: a
 * request that is not a collective (an abort message, a device detach). */
typedef enum comm_kind {
    COMM_KIND_NONE,
    COMM_KIND_ALLREDUCE,
    COMM_KIND_REDUCE_SCATTER,
    COMM_KIND_ALLGATHER,
    COMM_KIND_BROADCAST,
    COMM_KIND_BARRIER,
    COMM_KIND_ATTACH_NCCL,
} comm_kind;

/* "all-reduce", "reduce-scatter", ... for messages. */
const char *comm_kind_name_of(comm_kind k);
/* "f32", "u64", ... for messages. */
const char *comm_dtype_name(comm_dtype dt);

/* One queued collective. The blocking calls keep it on their stack; comm_start_* hand it out as comm_req. */
struct comm_req {
    comm *c;
    const char *op; /* the public name, for messages */
    comm_kind kind;
    uint64_t seq;   /* set by the worker: this collective's number on the comm, from 1 */
    /* Runs the collective on the worker thread. */
    strata_status (*run)(comm *c, comm_req *r);
    const void *send;
    void *recv;
    size_t count;
    comm_dtype dt;
    comm_op rop;
    int root;
    bool in_place;
    bool runs_when_broken; /* comm_abort_world's message and device cleanup still run on a broken comm */
    bool reduce_scatter;   /* device collectives: which one */
    uint64_t payload_bytes; /* added to comm_bytes when it succeeds */
    device *dev;       /* device collectives: the buffers' device */
    dev_event *after;  /* device collectives: recorded on the caller's stream at the call */
    void *arg;         /* comm_attach_nccl: the embedder's ncclComm_t */
    /* Set by the worker. */
    bool done;
    err_slot result;
    comm_req *next;
};

struct strata_comm {
    const comm_ops *ops;
    comm_impl *impl;
    int rank, size, local_rank, local_size;
    bool owns_mpi; /* comm_create_from_env initialised MPI: destroy finalises it */
    _Atomic uint64_t bytes;
    _Atomic uint32_t timeout_ms;
    _Atomic uint64_t seq; /* collectives started so far (written by the worker only) */
    /* Set once, by the first failure that leaves the world unusable; raised by every later call. */
    err_latch broken;

    /* The queue: guarded by lock; the worker waits on work_cv, callers on done_cv. */
    pthread_mutex_t lock;
    pthread_cond_t work_cv, done_cv;
    comm_req *head, *tail;
    bool stopping;
    bool worker_started;
    pthread_t worker;

    comm_dev_state *dev_state; /* worker thread only */
    comm_nccl *nccl;           /* worker thread only, once attached */
    device *nccl_dev;          /* the device nccl was attached for; NULL when none */
};

#define COMM_DEFAULT_TIMEOUT_MS 120000u

/* Makes the handle around an implementation (rank, size, ...) and starts its worker; on failure calls
 * ops->destroy and returns the status with *out NULL. */
strata_status comm_start(const comm_ops *ops, comm_impl *impl, int rank, int size, int local_rank, int local_size,
                         comm **out);

/* Argument checks shared by the host and device forms: NULL comm, dtype, int counts, NULL buffers. */
strata_status comm_check_args(const comm *c, const char *op, size_t count, comm_dtype dt, bool reduces,
                              const void *a, const void *b);
/* Fill r for an all-gather / reduce-scatter (checks included); the device forms change run. */
strata_status comm_make_allgather(comm *c, const char *op, const void *send, void *recv, size_t send_count,
                                  comm_dtype dt, comm_req *r);
strata_status comm_make_reduce_scatter(comm *c, const char *op, const void *send, void *recv, size_t recv_count,
                                       comm_dtype dt, comm_req *r);
/* Queues r and waits for it: the blocking form of every collective. */
strata_status comm_run_blocking(comm *c, comm_req *r);

/* Queues r (filled except for the worker's fields); fails at once, without queueing, on a broken comm. */
strata_status comm_enqueue(comm *c, comm_req *r);
/* Blocks until r is done; re-raises its error on the calling thread; does not free r. */
strata_status comm_req_finish(comm_req *r);
/* Stops the worker after it has drained the queue. */
void comm_queue_stop(comm *c);

/* Marks the comm broken with the reason (kept: the first one wins) and returns STRATA_ECOMM with err_set
 * detail "<op>: <reason>". */
strata_status comm_mark_broken(comm *c, const char *op, const char *reason);
/* STRATA_ECOMM "<op>: <broken reason>" when the comm is broken, else STRATA_OK. */
strata_status comm_check_broken(comm *c, const char *op);

/* The poll budget of one collective: the deadline from the comm's timeout (0 = none), in CLOCK_MONOTONIC ns. */
uint64_t comm_deadline_ns(const comm *c);
uint64_t comm_now_ns(void);
/* One step of a wait loop: spins first, then sleeps briefly so that oversubscribed ranks let their peers run. */
void comm_poll_pause(unsigned *spins);
/* Why a wait on op must stop (a peer's abort, this rank's abort, the deadline): marks the comm broken and
 * returns STRATA_ECOMM; STRATA_OK to keep waiting. */
strata_status comm_poll_check(comm *c, const char *op, uint64_t deadline_ns);

/* The MPI implementation (comm_mpi.c, or comm_mpi_none.c when strata is built without MPI). */
strata_status comm_mpi_create(const void *mpi_comm, bool owns_mpi, comm **out);
/* Whether the environment says mpirun (or another PMI launcher) started this process. */
bool comm_launched_by_mpirun(void);
/* comm_create_from_env under a launcher: MPI_Init_thread + comm over MPI_COMM_WORLD, or an MPI comm when MPI
 * is already initialised by the embedder. */
strata_status comm_mpi_create_from_env(comm **out);

/* Device collectives (comm_dev.c): frees the comm's staging state (comm_destroy, comm_detach_device). */
void comm_dev_release(comm *c);

/* NCCL (comm_nccl.c, or comm_nccl_none.c). Both run on the worker thread. */
strata_status comm_nccl_attach(comm *c, device *dev, void *nccl_comm);
/* A device all-gather (reduce_scatter false) or reduce-scatter on the attached communicator, after r->after. */
strata_status comm_nccl_collective(comm *c, comm_req *r, bool reduce_scatter);
/* Frees what comm_nccl_attach made (the ncclComm_t only when strata made it). */
void comm_nccl_release(comm *c);

#endif
