/*
 * Host collectives over MPI (comm.h "mpi"); the only file that includes mpi.h.
 *
 * Bounded waits. Every collective is posted in its nonblocking form and polled with MPI_Test until it
 * completes, the comm's deadline passes, or another rank's abort message arrives: a rank that failed never
 * leaves the others blocked inside MPI. The abort messages travel on a second duplicate of the embedder's
 * communicator ("ctl"), where one MPI_Irecv from any source stays posted for the comm's life.
 *
 * Ranks that disagree or disappear. Before each collective the ranks exchange what they are about to run
 * (comm_order.c): a rank in another call fails every rank at once, with one message naming both calls. A rank
 * that destroys its comm tells the others how many collectives it ran ("leave" messages on ctl), so a survivor
 * waiting in a later one knows it will never come; a rank on this host that is killed is found missing by its pid
 * (comm_peers.c). Both are checked while a collective waits, so the survivors report within seconds.
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
#include "comm/comm_order.h"
#include "comm/comm_peers.h"

/* The messages on ctl: a rank failed (its text), a rank left the world (the count of collectives it ran). */
#define ABORT_TAG 1
#define LEAVE_TAG 2
/* How often a waiting rank looks for the processes of its peers on this host. */
#define PEER_CHECK_NS 500000000ull
/* How long comm_abort_world lets its messages drain before it lets go of them. */
#define ABORT_SEND_WAIT_NS 2000000000ull

struct comm_impl {
    MPI_Comm data; /* the collectives */
    MPI_Comm ctl;  /* abort messages */
    MPI_Request abort_recv; /* MPI_REQUEST_NULL once received or cancelled */
    char abort_buf[ERR_MSG_BYTES + 24]; /* "<world id> <message>" */
    bool abort_seen;
    uint64_t world_id;    /* this comm's: rank 0's nonce; messages of an earlier comm carry another */
    uint64_t *left_after; /* per rank: the collectives it ran before leaving the world; UINT64_MAX while it is in */
    comm_peer *peers;     /* per rank: its process, to find it gone */
    comm_order *orders;   /* per rank: the collective it is about to run; [size] is this rank's own, sent from there
                           * (check_order's buffers: a stranded check may still write them, so a failed world leaks
                           * them with the communicators) */
    uint64_t next_peer_check_ns;
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

static strata_status post_ctl_recv(comm_impl *m)
{
    return MPI_Irecv(m->abort_buf, sizeof m->abort_buf, MPI_CHAR, MPI_ANY_SOURCE, MPI_ANY_TAG, m->ctl,
                     &m->abort_recv) == MPI_SUCCESS ? STRATA_OK : STRATA_ECOMM;
}

/* Takes the messages that arrived on ctl: an abort is kept (the first one), a leave recorded and the receive posted
 * again. */
static void take_ctl_messages(comm_impl *m)
{
    while (!m->abort_seen && m->abort_recv != MPI_REQUEST_NULL) {
        int flag = 0;
        MPI_Status status;
        if (MPI_Test(&m->abort_recv, &flag, &status) != MPI_SUCCESS || !flag)
            return;
        m->abort_buf[sizeof m->abort_buf - 1] = '\0';
        /* MPI reuses a freed communicator's context for a new one, so a message a destroyed comm never received
         * can arrive here: only this world's are taken. */
        char *text = NULL;
        bool ours = strtoull(m->abort_buf, &text, 16) == m->world_id && *text == ' ';
        if (ours && status.MPI_TAG != LEAVE_TAG) {
            memmove(m->abort_buf, text + 1, strlen(text + 1) + 1);
            m->abort_seen = true;
            return;
        }
        if (ours)
            m->left_after[status.MPI_SOURCE] = strtoull(text + 1, NULL, 10);
        if (post_ctl_recv(m) != STRATA_OK)
            m->abort_recv = MPI_REQUEST_NULL;
    }
}

static bool mpi_peer_failed(comm *c, char *msg, size_t len)
{
    comm_impl *m = c->impl;
    take_ctl_messages(m);
    if (m->abort_seen) {
        snprintf(msg, len, "%s", m->abort_buf);
        return true;
    }
    /* The collective this rank waits in is number seq: a rank that left after fewer will never join it. */
    uint64_t seq = atomic_load(&c->seq);
    for (int r = 0; r < c->size; r++)
        if (m->left_after[r] < seq) {
            snprintf(msg, len,
                     "rank %d left the world after %llu collectives (it destroyed its comm: its trainer finished or "
                     "stopped) while this rank waits in collective #%llu; every rank must make the same strata calls "
                     "(the same number of steps and micro-batches)",
                     r, (unsigned long long)m->left_after[r], (unsigned long long)seq);
            return true;
        }
    uint64_t now = comm_now_ns();
    if (now < m->next_peer_check_ns)
        return false;
    m->next_peer_check_ns = now + PEER_CHECK_NS;
    return comm_peers_gone(m->peers, c->size, c->rank, msg, len) >= 0;
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

static strata_status mpi_check_order(comm *c, const comm_req *r)
{
    comm_impl *m = c->impl;
    comm_order *mine = &m->orders[c->size];
    comm_order_of(r, mine);
    MPI_Request req;
    int rc = MPI_Iallgather(mine, sizeof *mine, MPI_BYTE, m->orders, sizeof *mine, MPI_BYTE, m->data, &req);
    ERR_CHECK(wait_bounded(c, r->op, "MPI_Iallgather (the order check)", rc, &req));
    char msg[ERR_MSG_BYTES];
    if (!comm_order_agree(m->orders, c->size, msg, sizeof msg))
        return comm_mark_broken(c, r->op, msg);
    return STRATA_OK;
}

/* Sends msg with tag to every other rank on ctl; a peer that is gone must not hold this rank (see below). */
static void send_to_peers(comm *c, int tag, const char *what)
{
    comm_impl *m = c->impl;
    char msg[ERR_MSG_BYTES + 24];
    snprintf(msg, sizeof msg, "%016llx %s", (unsigned long long)m->world_id, what);
    MPI_Request *reqs = calloc((size_t)c->size, sizeof *reqs);
    if (!reqs) {
        LOG_WARN(LOG_CORE, "comm_abort_world: out of host memory; the other ranks will time out instead");
        return;
    }
    int n = 0;
    for (int r = 0; r < c->size; r++)
        if (r != c->rank && MPI_Isend(msg, (int)strlen(msg) + 1, MPI_CHAR, r, tag, m->ctl, &reqs[n]) ==
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

static void mpi_abort_world(comm *c, const char *msg)
{
    send_to_peers(c, ABORT_TAG, msg);
}

static void mpi_destroy(comm *c)
{
    comm_impl *m = c->impl;
    if (!m)
        return;
    /* A rank that leaves a working world says after how many collectives, so that a peer still waiting for a later
     * one (it runs more steps) fails at once, naming this rank. Every rank of a world that ends together sends it
     * too; nobody waits for it then, and MPI drops it with the communicator. */
    if (m->ctl != MPI_COMM_NULL && m->left_after && c->size > 1 && !m->stranded && !err_latch_failed(&c->broken)) {
        char text[32];
        snprintf(text, sizeof text, "%llu", (unsigned long long)atomic_load(&c->seq));
        send_to_peers(c, LEAVE_TAG, text);
    }
    if (m->abort_recv != MPI_REQUEST_NULL) {
        /* Cancelling a receive completes promptly whether or not a message had arrived. */
        MPI_Cancel(&m->abort_recv);
        MPI_Wait(&m->abort_recv, MPI_STATUS_IGNORE);
    }
    bool finalize = m->owns_mpi, broken = m->stranded || err_latch_failed(&c->broken);
    if (broken) {
        LOG_INFO(LOG_CORE, "comm: leaving the communicators of a failed world allocated (%d collective(s) still "
                           "posted; freeing them is erroneous)", m->stranded);
    } else {
        if (m->data != MPI_COMM_NULL)
            MPI_Comm_free(&m->data);
        if (m->ctl != MPI_COMM_NULL)
            MPI_Comm_free(&m->ctl);
    }
    free(m->left_after);
    free(m->peers);
    if (!broken)
        free(m->orders);
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
    .check_order = mpi_check_order,
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
    int size = 1;
    MPI_Comm_size(m->data, &size);
    m->left_after = malloc((size_t)size * sizeof *m->left_after);
    m->peers = calloc((size_t)size, sizeof *m->peers);
    m->orders = calloc((size_t)size + 1, sizeof *m->orders);
    if (!m->left_after || !m->peers || !m->orders)
        return err_set(STRATA_ENOMEM, "%s: out of host memory for %d ranks", op, size);
    for (int r = 0; r < size; r++)
        m->left_after[r] = UINT64_MAX;
    comm_peer self;
    comm_peer_self(&self);
    rc = MPI_Allgather(&self, sizeof self, MPI_BYTE, m->peers, sizeof self, MPI_BYTE, m->data);
    if (rc != MPI_SUCCESS)
        return mpi_fail(op, "MPI_Allgather (the ranks' processes)", rc);
    m->world_id = m->peers[0].nonce;
    if (post_ctl_recv(m) != STRATA_OK)
        return err_set(STRATA_ECOMM, "%s: MPI_Irecv on the control communicator failed", op);
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
