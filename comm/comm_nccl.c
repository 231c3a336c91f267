/*
 * Device collectives over NCCL (comm.h "nccl"); the only file that includes nccl.h. Everything here runs on
 * the comm's worker thread.
 *
 * The communicator is the embedder's, or one made over the comm's MPI world: rank 0's ncclGetUniqueId is
 * broadcast with the MPI implementation's own broadcast (on this same thread, so MPI stays serialised). A
 * collective runs on a comm-owned CUDA stream that first waits for the caller's `after` event, and is then
 * polled like an MPI collective: a peer's abort message or the deadline ends the wait, and a communicator
 * strata made is aborted (ncclCommAbort), which frees the stream of the kernel that would otherwise never
 * finish. An embedder's communicator is left to the embedder.
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"

struct comm_nccl {
    ncclComm_t nc;
    bool owned;   /* strata made it: destroyed (or aborted) here */
    bool aborted; /* ncclCommAbort already freed it */
    device *dev;
    dev_stream *stream;
    dev_event *done;
};

static strata_status nccl_fail(const char *op, const char *call, ncclResult_t rc)
{
    return err_set(STRATA_ECOMM, "%s: %s failed: %s", op, call, ncclGetErrorString(rc));
}

static strata_status set_device(const char *op, device *dev)
{
    cudaError_t e = cudaSetDevice(dev_ordinal(dev));
    if (e != cudaSuccess)
        return err_set(STRATA_EDEVICE, "%s: cudaSetDevice(%d) failed: %s", op, dev_ordinal(dev), cudaGetErrorString(e));
    return STRATA_OK;
}

static ncclDataType_t nccl_type(comm_dtype dt)
{
    switch (dt) {
    case COMM_F32: return ncclFloat32;
    case COMM_F64: return ncclFloat64;
    case COMM_U64: return ncclUint64;
    case COMM_I32: return ncclInt32;
    default: return ncclUint8;
    }
}

void comm_nccl_release(comm *c)
{
    comm_nccl *n = c->nccl;
    if (!n)
        return;
    dev_event_destroy(n->done);
    dev_stream_destroy(n->stream);
    if (n->owned && !n->aborted)
        ncclCommDestroy(n->nc);
    free(n);
    c->nccl = NULL;
    c->nccl_dev = NULL;
}

/* A communicator over c's MPI world: rank 0's unique id, broadcast with whether making it worked, so that a
 * failure on rank 0 fails every rank instead of leaving them in ncclCommInitRank. */
static strata_status make_comm(comm *c, const char *op, ncclComm_t *out)
{
    struct {
        ncclUniqueId id;
        int ok;
    } boot;
    memset(&boot, 0, sizeof boot);
    ncclResult_t rc = ncclSuccess;
    if (c->rank == 0) {
        rc = ncclGetUniqueId(&boot.id);
        boot.ok = rc == ncclSuccess;
    }
    ERR_CHECK(c->ops->broadcast(c, op, &boot, sizeof boot, COMM_BYTE, 0));
    if (rc != ncclSuccess)
        return nccl_fail(op, "ncclGetUniqueId", rc);
    if (!boot.ok)
        return err_set(STRATA_ECOMM, "%s: rank 0's ncclGetUniqueId failed (see its log)", op);
    rc = ncclCommInitRank(out, c->size, boot.id, c->rank);
    if (rc != ncclSuccess)
        return nccl_fail(op, "ncclCommInitRank", rc);
    return STRATA_OK;
}

strata_status comm_nccl_attach(comm *c, device *dev, void *nccl_comm)
{
    const char *op = "comm_attach_nccl";
    if (c->nccl)
        return err_set(STRATA_ESTATE, "%s: NCCL is already attached (for device %s)", op, dev_name(c->nccl_dev));
    if (!nccl_comm && strcmp(c->ops->name, "mpi") != 0)
        return err_set(STRATA_EUNSUPPORTED, "%s: making an NCCL communicator needs an MPI comm (this one is %s)", op,
                       c->ops->name);
    ERR_CHECK(set_device(op, dev));
    comm_nccl *n = calloc(1, sizeof *n);
    if (!n)
        return err_set(STRATA_ENOMEM, "%s: out of host memory", op);
    n->dev = dev;
    c->nccl = n;
    c->nccl_dev = dev;
    strata_status st = STRATA_OK;
    if (nccl_comm) {
        n->nc = (ncclComm_t)nccl_comm;
        int count = 0, rank = 0;
        ncclCommCount(n->nc, &count);
        ncclCommUserRank(n->nc, &rank);
        if (count != c->size || rank != c->rank)
            st = err_set(STRATA_EINVAL, "%s: the NCCL communicator is rank %d of %d, the comm rank %d of %d", op, rank,
                         count, c->rank, c->size);
    } else {
        st = make_comm(c, op, &n->nc);
        n->owned = st == STRATA_OK;
    }
    if (st == STRATA_OK)
        st = dev_stream_create(dev, "nccl", &n->stream);
    if (st == STRATA_OK)
        st = dev_event_create(dev, &n->done);
    if (st != STRATA_OK)
        comm_nccl_release(c);
    return st;
}

/* Polls the collective queued on n->stream (see the top of the file). */
static strata_status wait_bounded(comm *c, comm_nccl *n, const char *op)
{
    ERR_CHECK(dev_event_record(n->done, n->stream));
    uint64_t deadline = comm_deadline_ns(c);
    unsigned spins = 0;
    for (;;) {
        bool done = false;
        ERR_CHECK(dev_event_query(n->done, &done));
        if (done)
            break;
        strata_status st = comm_poll_check(c, op, deadline);
        if (st != STRATA_OK) {
            if (n->owned) {
                ncclCommAbort(n->nc);
                n->aborted = true;
            }
            return st;
        }
        comm_poll_pause(&spins);
    }
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(n->nc, &async);
    if (async != ncclSuccess) {
        nccl_fail(op, "the NCCL kernel", async);
        return comm_mark_broken(c, op, err_last());
    }
    return STRATA_OK;
}

strata_status comm_nccl_collective(comm *c, comm_req *r, bool reduce_scatter)
{
    comm_nccl *n = c->nccl;
    if (n->aborted)
        return err_set(STRATA_ECOMM, "%s: the NCCL communicator was aborted after an earlier failure", r->op);
    ERR_CHECK(set_device(r->op, n->dev));
    ERR_CHECK(dev_stream_wait_event(n->stream, r->after));
    cudaStream_t s = dev_stream_native(n->stream);
    ncclResult_t rc = reduce_scatter
                          ? ncclReduceScatter(r->send, r->recv, r->count, nccl_type(r->dt), ncclSum, n->nc, s)
                          : ncclAllGather(r->send, r->recv, r->count, nccl_type(r->dt), n->nc, s);
    if (rc != ncclSuccess)
        return nccl_fail(r->op, reduce_scatter ? "ncclReduceScatter" : "ncclAllGather", rc);
    return wait_bounded(c, n, r->op);
}
