/*
 * Host collectives over MPI (comm.h "mpi"); the only file that includes mpi.h.
 *
 * Bounded waits. Every collective is posted in its nonblocking form and polled with MPI_Test until it
 * completes, the comm's deadline passes, or another rank's abort message arrives: a rank that failed never
 * leaves the others blocked inside MPI. The abort messages travel on a second duplicate of the embedder's
 * communicator ("ctl"), where one MPI_Irecv from any source stays posted for the comm's life.
 *
 * After a failure the world is in an unknown state: the collective that failed is still posted (MPI forbids
 * cancelling or freeing a nonblocking collective's request), so the comm is marked broken and every later
 * call fails at once. Destroy then cancels the abort receive but leaves both communicators allocated: freeing
 * a communicator with a collective still posted on it is erroneous, and its peers may be gone. That is a small
 * leak, once per failed world, in exchange for a destroy that never hangs.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "comm/comm_internal.h"

/* The only message on ctl. */
#define ABORT_TAG 1
/* How long comm_abort_world lets its messages drain before it lets go of them. */
#define ABORT_SEND_WAIT_NS 2000000000ull

struct comm_impl {
    MPI_Comm data; /* the collectives */
    MPI_Comm ctl;  /* abort messages */
    MPI_Request abort_recv; /* MPI_REQUEST_NULL once received or cancelled */
    char abort_buf[ERR_MSG_BYTES];
    bool abort_seen;
    int stranded; /* collectives left posted by a failure: the communicators must not be freed */
    bool owns_mpi; /* comm_create_from_env initialised MPI: destroy finalises it */
};

static strata_status mpi_fail(const char *op, const char *call, int rc)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error %d", rc);
    return err_set(STRATA_ECOMM, "%s: %s failed: %s", op, call, text);
}

static MPI_Datatype mpi_type(comm_dtype dt)
{
    switch (dt) {
    case COMM_F32: return MPI_FLOAT;
    case COMM_F64: return MPI_DOUBLE;
    case COMM_U64: return MPI_UINT64_T;
    case COMM_I32: return MPI_INT32_T;
    default: return MPI_BYTE;
    }
}

static MPI_Op mpi_op(comm_op op)
{
    return op == COMM_MAX ? MPI_MAX : op == COMM_MIN ? MPI_MIN : MPI_SUM;
}

static bool mpi_peer_failed(comm *c, char *msg, size_t len)
{
    comm_impl *m = c->impl;
    if (!m->abort_seen && m->abort_recv != MPI_REQUEST_NULL) {
        int flag = 0;
        if (MPI_Test(&m->abort_recv, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) {
            m->abort_buf[sizeof m->abort_buf - 1] = '\0';
            m->abort_seen = true;
        }
    }
    if (m->abort_seen)
        snprintf(msg, len, "%s", m->abort_buf);
    return m->abort_seen;
}

/* Polls a posted collective to completion within the comm's deadline (see the top of the file). */
static strata_status wait_bounded(comm *c, const char *op, const char *call, int rc, MPI_Request *req)
{
    if (rc != MPI_SUCCESS)
        return mpi_fail(op, call, rc);
    uint64_t deadline = comm_deadline_ns(c);
    unsigned spins = 0;
    for (;;) {
        int done = 0;
        rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            c->impl->stranded++;
            mpi_fail(op, "MPI_Test", rc);
            return comm_mark_broken(c, op, err_last());
        }
        if (done)
            return STRATA_OK;
        strata_status st = comm_poll_check(c, op, deadline);
        if (st != STRATA_OK) {
            c->impl->stranded++;
            return st;
        }
        comm_poll_pause(&spins);
    }
}

static strata_status mpi_allreduce(comm *c, const char *op, void *buf, size_t count, comm_dtype dt, comm_op rop)
{
    MPI_Request req;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, mpi_type(dt), mpi_op(rop), c->impl->data, &req);
    return wait_bounded(c, op, "MPI_Iallreduce", rc, &req);
}

static strata_status mpi_reduce_scatter(comm *c, const char *op, const void *send, void *recv, size_t recv_count,
                                        comm_dtype dt)
{
    MPI_Request req;
    int rc = MPI_Ireduce_scatter_block(send, recv, (int)recv_count, mpi_type(dt), MPI_SUM, c->impl->data, &req);
    return wait_bounded(c, op, "MPI_Ireduce_scatter_block", rc, &req);
}

static strata_status mpi_allgather(comm *c, const char *op, const void *send, void *recv, size_t send_count,
                                   comm_dtype dt, bool in_place)
{
    MPI_Request req;
    MPI_Datatype t = mpi_type(dt);
    int rc = MPI_Iallgather(in_place ? MPI_IN_PLACE : send, (int)send_count, t, recv, (int)send_count, t,
                            c->impl->data, &req);
    return wait_bounded(c, op, "MPI_Iallgather", rc, &req);
}

static strata_status mpi_broadcast(comm *c, const char *op, void *buf, size_t count, comm_dtype dt, int root)
{
    MPI_Request req;
    int rc = MPI_Ibcast(buf, (int)count, mpi_type(dt), root, c->impl->data, &req);
    return wait_bounded(c, op, "MPI_Ibcast", rc, &req);
}

static strata_status mpi_barrier(comm *c, const char *op)
{
    MPI_Request req;
    int rc = MPI_Ibarrier(c->impl->data, &req);
    return wait_bounded(c, op, "MPI_Ibarrier", rc, &req);
}

static void mpi_abort_world(comm *c, const char *msg)
{
    comm_impl *m = c->impl;
    MPI_Request *reqs = calloc((size_t)c->size, sizeof *reqs);
    if (!reqs) {
        LOG_WARN(LOG_CORE, "comm_abort_world: out of host memory; the other ranks will time out instead");
        return;
    }
    int n = 0;
    for (int r = 0; r < c->size; r++)
        if (r != c->rank && MPI_Isend(msg, (int)strlen(msg) + 1, MPI_CHAR, r, ABORT_TAG, m->ctl, &reqs[n]) ==
                                MPI_SUCCESS)
            n++;
    /* Small messages go out eagerly, so this is quick; a peer that is gone must not hold this rank, so after a
     * bounded wait the requests are let go (freeing a point-to-point request is allowed; the send continues). */
    uint64_t deadline = comm_now_ns() + ABORT_SEND_WAIT_NS;
    unsigned spins = 0;
    int done = 0;
    while (MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE) == MPI_SUCCESS && !done && comm_now_ns() < deadline)
        comm_poll_pause(&spins);
    if (!done)
        for (int i = 0; i < n; i++)
            if (reqs[i] != MPI_REQUEST_NULL)
                MPI_Request_free(&reqs[i]);
    free(reqs);
}

static void mpi_destroy(comm *c)
{
    comm_impl *m = c->impl;
    if (!m)
        return;
    if (m->abort_recv != MPI_REQUEST_NULL) {
        /* Cancelling a receive completes promptly whether or not a message had arrived. */
        MPI_Cancel(&m->abort_recv);
        MPI_Wait(&m->abort_recv, MPI_STATUS_IGNORE);
    }
    if (m->stranded || atomic_load(&c->broken)) {
        LOG_INFO(LOG_CORE, "comm: leaving the communicators of a failed world allocated (%d collective(s) still "
                           "posted; freeing them is erroneous)", m->stranded);
    } else {
        if (m->data != MPI_COMM_NULL)
            MPI_Comm_free(&m->data);
        if (m->ctl != MPI_COMM_NULL)
            MPI_Comm_free(&m->ctl);
    }
    bool finalize = m->owns_mpi, broken = m->stranded || atomic_load(&c->broken);
    free(m);
    c->impl = NULL;
    /* MPI_Finalize progresses what is still posted: a failed world's collective would then write into the
     * caller's buffers, long freed. A failed process exits without finalizing instead (its launcher reports
     * the failure, which is what happened). */
    if (finalize && broken)
        LOG_WARN(LOG_CORE, "comm: not finalizing MPI after a failed world (a collective is still posted)");
    else if (finalize)
        MPI_Finalize();
}

static const comm_ops mpi_ops = {
    .name = "mpi",
    .allreduce = mpi_allreduce,
    .reduce_scatter = mpi_reduce_scatter,
    .allgather = mpi_allgather,
    .broadcast = mpi_broadcast,
    .barrier = mpi_barrier,
    .abort_world = mpi_abort_world,
    .peer_failed = mpi_peer_failed,
    .destroy = mpi_destroy,
};

static const char *thread_level_name(int level)
{
    switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    default: return "MPI_THREAD_MULTIPLE";
    }
}

static strata_status check_mpi_ready(const char *op)
{
    int init = 0, fin = 0, level = MPI_THREAD_SINGLE;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (!init || fin)
        return err_set(STRATA_ESTATE, "%s: MPI is %s; initialise it with MPI_Init_thread(&argc, &argv, "
                                      "MPI_THREAD_SERIALIZED, &provided) first",
                       op, fin ? "already finalised" : "not initialised");
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_SERIALIZED)
        return err_set(STRATA_EUNSUPPORTED, "%s: MPI was initialised with %s; strata calls MPI from its own thread "
                                            "and needs at least MPI_THREAD_SERIALIZED (MPI_Init_thread)",
                       op, thread_level_name(level));
    return STRATA_OK;
}

/* Both duplicates, errors returned instead of aborting the process, and the abort receive posted. */
static strata_status open_impl(const char *op, MPI_Comm base, comm_impl *m)
{
    int rc = MPI_Comm_dup(base, &m->data);
    if (rc != MPI_SUCCESS)
        return mpi_fail(op, "MPI_Comm_dup", rc);
    rc = MPI_Comm_dup(base, &m->ctl);
    if (rc != MPI_SUCCESS)
        return mpi_fail(op, "MPI_Comm_dup", rc);
    MPI_Comm_set_errhandler(m->data, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(m->ctl, MPI_ERRORS_RETURN);
    rc = MPI_Irecv(m->abort_buf, sizeof m->abort_buf, MPI_CHAR, MPI_ANY_SOURCE, ABORT_TAG, m->ctl, &m->abort_recv);
    if (rc != MPI_SUCCESS)
        return mpi_fail(op, "MPI_Irecv", rc);
    return STRATA_OK;
}

static strata_status create_mpi(const char *op, const void *mpi_comm, bool owns_mpi, comm **out)
{
    *out = NULL;
    ERR_CHECK(check_mpi_ready(op));
    comm_impl *m = calloc(1, sizeof *m);
    if (!m)
        return err_set(STRATA_ENOMEM, "%s: out of host memory", op);
    m->data = m->ctl = MPI_COMM_NULL;
    m->abort_recv = MPI_REQUEST_NULL;
    comm tmp = {.ops = &mpi_ops, .impl = m};
    strata_status st = open_impl(op, mpi_comm ? *(const MPI_Comm *)mpi_comm : MPI_COMM_WORLD, m);
    int rank = 0, size = 1, local_rank = 0, local_size = 1;
    MPI_Comm local = MPI_COMM_NULL;
    if (st == STRATA_OK) {
        MPI_Comm_rank(m->data, &rank);
        MPI_Comm_size(m->data, &size);
        int rc = MPI_Comm_split_type(m->data, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
        if (rc != MPI_SUCCESS)
            st = mpi_fail(op, "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)", rc);
    }
    if (st != STRATA_OK) {
        mpi_destroy(&tmp);
        return st;
    }
    MPI_Comm_rank(local, &local_rank);
    MPI_Comm_size(local, &local_size);
    MPI_Comm_free(&local);
    m->owns_mpi = owns_mpi;
    /* comm_start frees m through mpi_destroy when it fails (which finalises MPI if this comm owns it). */
    return comm_start(&mpi_ops, m, rank, size, local_rank, local_size, out);
}

strata_status comm_create_mpi(const void *mpi_comm, comm **out)
{
    if (!out)
        return err_set(STRATA_EINVAL, "comm_create_mpi: out is NULL");
    return create_mpi("comm_create_mpi", mpi_comm, false, out);
}

strata_status comm_mpi_create_from_env(comm **out)
{
    const char *op = "comm_create_from_env";
    *out = NULL;
    int init = 0;
    MPI_Initialized(&init);
    if (init) /* The embedder (or an earlier comm) initialised MPI: its world, and it finalises. */
        return create_mpi(op, NULL, false, out);
    int provided = MPI_THREAD_SINGLE;
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS)
        return mpi_fail(op, "MPI_Init_thread(MPI_THREAD_SERIALIZED)", rc);
    if (provided < MPI_THREAD_SERIALIZED) {
        MPI_Finalize();
        return err_set(STRATA_EUNSUPPORTED, "%s: MPI_Init_thread granted %s; strata needs MPI_THREAD_SERIALIZED "
                                            "(an MPI built with thread support)",
                       op, thread_level_name(provided));
    }
    strata_status st = create_mpi(op, NULL, true, out);
    if (st != STRATA_OK && !*out) {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin)
            MPI_Finalize();
    }
    return st;
}
