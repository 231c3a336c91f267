/*
 * The contract's front door (comm.h): argument checks, payload counting, and handing each collective to the
 * worker queue (comm_queue.c) as a request whose run function calls the implementation's op.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"

const char *comm_dtype_name(comm_dtype dt)
{
    switch (dt) {
    case COMM_BYTE: return "bytes";
    case COMM_F32: return "f32";
    case COMM_F64: return "f64";
    case COMM_U64: return "u64";
    case COMM_I32: return "i32";
    }
    return "?";
}

const char *comm_kind_name_of(comm_kind k)
{
    switch (k) {
    case COMM_KIND_NONE: return "no collective";
    case COMM_KIND_ALLREDUCE: return "all-reduce";
    case COMM_KIND_REDUCE_SCATTER: return "reduce-scatter";
    case COMM_KIND_ALLGATHER: return "all-gather";
    case COMM_KIND_BROADCAST: return "broadcast";
    case COMM_KIND_BARRIER: return "barrier";
    case COMM_KIND_ATTACH_NCCL: return "NCCL attach";
    }
    return "?";
}

size_t comm_dtype_bytes(comm_dtype dt)
{
    switch (dt) {
    case COMM_BYTE: return 1;
    case COMM_F32: case COMM_I32: return 4;
    case COMM_F64: case COMM_U64: return 8;
    }
    return 0;
}

/* ---------------------------------------------------------------- making and freeing */

strata_status comm_create_from_env(comm **out)
{
    if (!out)
        return err_set(STRATA_EINVAL, "comm_create_from_env: out is NULL");
    *out = NULL;
    if (comm_launched_by_mpirun())
        return comm_mpi_create_from_env(out);
    return comm_create_single(out);
}

void comm_destroy(comm *c)
{
    if (!c)
        return;
    comm_queue_stop(c);
    comm_dev_release(c);
    comm_nccl_release(c);
    if (c->ops && c->ops->destroy)
        c->ops->destroy(c);
    pthread_cond_destroy(&c->work_cv);
    pthread_cond_destroy(&c->done_cv);
    pthread_mutex_destroy(&c->lock);
    err_latch_destroy(&c->broken);
    free(c);
}

int comm_rank(const comm *c) { return c ? c->rank : 0; }
int comm_size(const comm *c) { return c ? c->size : 1; }
int comm_local_rank(const comm *c) { return c ? c->local_rank : 0; }
int comm_local_size(const comm *c) { return c ? c->local_size : 1; }
uint64_t comm_bytes(const comm *c) { return c ? atomic_load(&c->bytes) : 0; }

const char *comm_kind_name(const comm *c)
{
    if (!c)
        return "single";
    return c->nccl ? "mpi+nccl" : c->ops->name;
}

void comm_set_timeout(comm *c, uint32_t timeout_ms)
{
    if (c)
        atomic_store(&c->timeout_ms, timeout_ms);
}

static strata_status run_abort(comm *c, comm_req *r)
{
    c->ops->abort_world(c, r->arg);
    return STRATA_OK;
}

void comm_abort_world(comm *c, const char *why)
{
    if (!c)
        return;
    char msg[ERR_MSG_BYTES];
    snprintf(msg, sizeof msg, "rank %d failed: %s", c->rank, why ? why : "(no reason given)");
    bool first = !err_latch_failed(&c->broken);
    /* Broken first: the collective the worker may be waiting in stops at its next poll, and everything queued
     * before the message fails at once, so the message goes out promptly. */
    comm_mark_broken(c, "comm_abort_world", msg);
    if (!first)
        return;
    comm_req r = {.op = "comm_abort_world", .run = run_abort, .runs_when_broken = true, .arg = msg};
    if (comm_enqueue(c, &r) == STRATA_OK)
        comm_req_finish(&r);
}

/* ---------------------------------------------------------------- checks */

strata_status comm_check_args(const comm *c, const char *op, size_t count, comm_dtype dt, bool reduces,
                              const void *a, const void *b)
{
    if (!c)
        return err_set(STRATA_EINVAL, "%s: comm is NULL", op);
    if (!comm_dtype_bytes(dt))
        return err_set(STRATA_EINVAL, "%s: dtype %d is not a comm_dtype", op, (int)dt);
    if (reduces && dt == COMM_BYTE)
        return err_set(STRATA_EINVAL, "%s: COMM_BYTE cannot be reduced; use a numeric dtype", op);
    /* MPI counts are int; the engine moves large buffers in pieces well below this. */
    if (count * (size_t)c->size > INT_MAX)
        return err_set(STRATA_EINVAL, "%s: %zu elements x %d ranks exceeds %d; split the call", op, count, c->size,
                       INT_MAX);
    if (count && (!a || !b))
        return err_set(STRATA_EINVAL, "%s: a NULL buffer with count %zu", op, count);
    return STRATA_OK;
}

strata_status comm_run_blocking(comm *c, comm_req *r)
{
    ERR_CHECK(comm_enqueue(c, r));
    return comm_req_finish(r);
}

/* Hands a heap copy of r (made with status made) to the caller as a request. */
static strata_status start_async(comm *c, const char *op, strata_status made, const comm_req *tmpl, comm_req **out)
{
    if (!out)
        return err_set(STRATA_EINVAL, "%s: out is NULL", op);
    *out = NULL;
    ERR_CHECK(made);
    comm_req *r = malloc(sizeof *r);
    if (!r)
        return err_set(STRATA_ENOMEM, "%s: out of host memory", op);
    *r = *tmpl;
    strata_status st = comm_enqueue(c, r);
    if (st != STRATA_OK) {
        free(r);
        return st;
    }
    *out = r;
    return STRATA_OK;
}

/* ---------------------------------------------------------------- host collectives */

static strata_status run_allreduce(comm *c, comm_req *r)
{
    return c->ops->allreduce(c, r->op, r->recv, r->count, r->dt, r->rop);
}

static strata_status allreduce(comm *c, const char *op, void *buf, size_t count, comm_dtype dt, comm_op rop,
                               bool counted)
{
    ERR_CHECK(comm_check_args(c, op, count, dt, true, buf, buf));
    if (rop != COMM_SUM && rop != COMM_MAX && rop != COMM_MIN)
        return err_set(STRATA_EINVAL, "%s: op %d is not a comm_op", op, (int)rop);
    comm_req r = {.op = op, .kind = COMM_KIND_ALLREDUCE, .run = run_allreduce, .recv = buf, .count = count, .dt = dt, .rop = rop,
                  .payload_bytes = counted ? 2 * count * comm_dtype_bytes(dt) : 0};
    return comm_run_blocking(c, &r);
}

strata_status comm_allreduce(comm *c, void *buf, size_t count, comm_dtype dt, comm_op op)
{
    return allreduce(c, "comm_allreduce", buf, count, dt, op, true);
}

strata_status comm_allreduce_uncounted(comm *c, void *buf, size_t count, comm_dtype dt, comm_op op)
{
    return allreduce(c, "comm_allreduce_uncounted", buf, count, dt, op, false);
}

static strata_status run_reduce_scatter(comm *c, comm_req *r)
{
    return c->ops->reduce_scatter(c, r->op, r->send, r->recv, r->count, r->dt);
}

strata_status comm_make_reduce_scatter(comm *c, const char *op, const void *send, void *recv, size_t recv_count,
                                       comm_dtype dt, comm_req *r)
{
    ERR_CHECK(comm_check_args(c, op, recv_count, dt, true, send, recv));
    *r = (comm_req){.op = op, .kind = COMM_KIND_REDUCE_SCATTER, .run = run_reduce_scatter, .send = send, .recv = recv, .count = recv_count, .dt = dt,
                    .payload_bytes = (uint64_t)c->size * recv_count * comm_dtype_bytes(dt)};
    return STRATA_OK;
}

strata_status comm_reduce_scatter(comm *c, const void *send, void *recv, size_t recv_count, comm_dtype dt)
{
    comm_req r;
    ERR_CHECK(comm_make_reduce_scatter(c, "comm_reduce_scatter", send, recv, recv_count, dt, &r));
    return comm_run_blocking(c, &r);
}

strata_status comm_start_reduce_scatter(comm *c, const void *send, void *recv, size_t recv_count, comm_dtype dt,
                                        comm_req **out)
{
    const char *op = "comm_start_reduce_scatter";
    comm_req r;
    return start_async(c, op, comm_make_reduce_scatter(c, op, send, recv, recv_count, dt, &r), &r, out);
}

static strata_status run_allgather(comm *c, comm_req *r)
{
    return c->ops->allgather(c, r->op, r->send, r->recv, r->count, r->dt, r->in_place);
}

strata_status comm_make_allgather(comm *c, const char *op, const void *send, void *recv, size_t send_count,
                                  comm_dtype dt, comm_req *r)
{
    ERR_CHECK(comm_check_args(c, op, send_count, dt, false, send, recv));
    size_t block = send_count * comm_dtype_bytes(dt);
    *r = (comm_req){.op = op, .kind = COMM_KIND_ALLGATHER, .run = run_allgather, .send = send, .recv = recv, .count = send_count, .dt = dt,
                    .in_place = send == (const char *)recv + (size_t)c->rank * block,
                    .payload_bytes = (uint64_t)c->size * block};
    return STRATA_OK;
}

strata_status comm_allgather(comm *c, const void *send, void *recv, size_t send_count, comm_dtype dt)
{
    comm_req r;
    ERR_CHECK(comm_make_allgather(c, "comm_allgather", send, recv, send_count, dt, &r));
    return comm_run_blocking(c, &r);
}

strata_status comm_start_allgather(comm *c, const void *send, void *recv, size_t send_count, comm_dtype dt,
                                   comm_req **out)
{
    const char *op = "comm_start_allgather";
    comm_req r;
    return start_async(c, op, comm_make_allgather(c, op, send, recv, send_count, dt, &r), &r, out);
}

static strata_status run_broadcast(comm *c, comm_req *r)
{
    return c->ops->broadcast(c, r->op, r->recv, r->count, r->dt, r->root);
}

strata_status comm_broadcast(comm *c, void *buf, size_t count, comm_dtype dt, int root)
{
    const char *op = "comm_broadcast";
    ERR_CHECK(comm_check_args(c, op, count, dt, false, buf, buf));
    if (root < 0 || root >= c->size)
        return err_set(STRATA_EINVAL, "%s: root = %d is out of range [0, %d)", op, root, c->size);
    comm_req r = {.op = op, .kind = COMM_KIND_BROADCAST, .run = run_broadcast, .recv = buf, .count = count, .dt = dt, .root = root,
                  .payload_bytes = count * comm_dtype_bytes(dt)};
    return comm_run_blocking(c, &r);
}

static strata_status run_barrier(comm *c, comm_req *r)
{
    return c->ops->barrier(c, r->op);
}

strata_status comm_barrier(comm *c)
{
    if (!c)
        return err_set(STRATA_EINVAL, "comm_barrier: comm is NULL");
    comm_req r = {.op = "comm_barrier", .kind = COMM_KIND_BARRIER, .run = run_barrier};
    return comm_run_blocking(c, &r);
}

/* ---------------------------------------------------------------- requests */

strata_status comm_wait(comm_req *r)
{
    if (!r)
        return STRATA_OK;
    strata_status st = comm_req_finish(r);
    free(r);
    return st;
}

bool comm_test(comm_req *r)
{
    if (!r)
        return true;
    pthread_mutex_lock(&r->c->lock);
    bool done = r->done;
    pthread_mutex_unlock(&r->c->lock);
    return done;
}
