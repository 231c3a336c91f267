/*
 * World 1 (comm.h): no dependency. A collective over one rank is a copy (all-gather and reduce-scatter when
 * not in place) or nothing, and still counts its payload, so that a 1-rank run reports the same formula.
 */
#include <string.h>

#include "comm/comm_internal.h"

static strata_status single_allreduce(comm *c, const char *op, void *buf, size_t count, comm_dtype dt,
                                      comm_op rop)
{
    return STRATA_OK;
}

static strata_status single_reduce_scatter(comm *c, const char *op, const void *send, void *recv,
                                           size_t recv_count, comm_dtype dt)
{
    if (send != recv)
        memmove(recv, send, recv_count * comm_dtype_bytes(dt));
    return STRATA_OK;
}

static strata_status single_allgather(comm *c, const char *op, const void *send, void *recv, size_t send_count,
                                      comm_dtype dt, bool in_place)
{
    if (!in_place)
        memmove(recv, send, send_count * comm_dtype_bytes(dt));
    return STRATA_OK;
}

static strata_status single_broadcast(comm *c, const char *op, void *buf, size_t count, comm_dtype dt, int root)
{
    return STRATA_OK;
}

static strata_status single_barrier(comm *c, const char *op)
{
    return STRATA_OK;
}

/* Nobody else to tell: comm_abort_world has already marked this rank's comm broken. */
static void single_abort_world(comm *c, const char *msg)
{
}

static void single_destroy(comm *c)
{
}

static const comm_ops single_ops = {
    .name = "single",
    .allreduce = single_allreduce,
    .reduce_scatter = single_reduce_scatter,
    .allgather = single_allgather,
    .broadcast = single_broadcast,
    .barrier = single_barrier,
    .abort_world = single_abort_world,
    .peer_failed = NULL,
    .destroy = single_destroy,
};

strata_status comm_create_single(comm **out)
{
    if (!out)
        return err_set(STRATA_EINVAL, "comm_create_single: out is NULL");
    return comm_start(&single_ops, NULL, 0, 1, 0, 1, out);
}
