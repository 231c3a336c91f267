/*
 * Device buffers (comm.h "Device buffers"). Three paths, picked per call:
 *   host backend   device memory is host memory: sync `after`, run the host collective;
 *   NCCL attached  comm_nccl.c runs it on its own stream (comm_nccl_collective);
 *   otherwise      stage through pinned host memory the comm owns: copy in on a comm-owned stream ordered
 *                  after `after` by an event, run the host collective, copy back, sync.
 * The staging state belongs to the worker thread, so it needs no lock; comm_detach_device frees it on the
 * worker before the embedder destroys the device.
 */
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"

struct comm_dev_state {
    device *dev;
    dev_stream *stream; /* the staging copies */
    void *pinned;
    size_t pinned_bytes;
};

void comm_dev_release(comm *c)
{
    comm_dev_state *s = c->dev_state;
    if (!s)
        return;
    dev_stream_destroy(s->stream);
    dev_host_free(s->dev, s->pinned);
    free(s);
    c->dev_state = NULL;
}

/* The staging state for dev with at least bytes of pinned memory; a different device replaces it. */
static strata_status staging(comm *c, device *dev, size_t bytes, comm_dev_state **out)
{
    if (c->dev_state && c->dev_state->dev != dev)
        comm_dev_release(c);
    comm_dev_state *s = c->dev_state;
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s)
            return err_set(STRATA_ENOMEM, "comm: out of host memory for the staging state");
        s->dev = dev;
        c->dev_state = s;
        ERR_CHECK(dev_stream_create(dev, "comm", &s->stream));
    }
    if (s->pinned_bytes < bytes) {
        /* Grows by doubling, so a run of rising sizes re-pins a logarithmic number of times. */
        size_t want = s->pinned_bytes * 2 > bytes ? s->pinned_bytes * 2 : bytes;
        dev_host_free(dev, s->pinned);
        s->pinned = NULL;
        s->pinned_bytes = 0;
        ERR_CHECK(dev_host_alloc(dev, want, &s->pinned));
        s->pinned_bytes = want;
    }
    *out = s;
    return STRATA_OK;
}

static strata_status run_staged(comm *c, comm_req *r)
{
    size_t block = r->count * comm_dtype_bytes(r->dt), world = block * (size_t)c->size;
    /* All-gather: the pinned buffer is the whole output, this rank's block copied in, gathered in place.
     * Reduce-scatter: the whole input, then this rank's output block after it. */
    size_t in_bytes = r->reduce_scatter ? world : block, out_bytes = r->reduce_scatter ? block : world;
    comm_dev_state *s = NULL;
    ERR_CHECK(staging(c, r->dev, r->reduce_scatter ? world + block : world, &s));
    char *in = (char *)s->pinned + (r->reduce_scatter ? 0 : (size_t)c->rank * block);
    char *out = r->reduce_scatter ? (char *)s->pinned + world : s->pinned;
    ERR_CHECK(dev_stream_wait_event(s->stream, r->after));
    ERR_CHECK(dev_memcpy_async(s->stream, in, r->send, in_bytes));
    ERR_CHECK(dev_stream_sync(s->stream));
    if (r->reduce_scatter)
        ERR_CHECK(c->ops->reduce_scatter(c, r->op, in, out, r->count, r->dt));
    else
        ERR_CHECK(c->ops->allgather(c, r->op, in, out, r->count, r->dt, true));
    ERR_CHECK(dev_memcpy_async(s->stream, r->recv, out, out_bytes));
    return dev_stream_sync(s->stream);
}

static strata_status run_device(comm *c, comm_req *r)
{
    if (c->nccl && c->nccl_dev == r->dev)
        return comm_nccl_collective(c, r, r->reduce_scatter);
    return run_staged(c, r);
}

/* The device form of r (already made by comm_make_*): see the three paths above. */
static strata_status dev_collective(comm *c, device *dev, dev_stream *after, comm_req *r)
{
    if (!dev)
        return err_set(STRATA_EINVAL, "%s: dev is NULL", r->op);
    if (dev_kind(dev) == STRATA_BACKEND_HOST) {
        if (after)
            ERR_CHECK(dev_stream_sync(after));
        return comm_run_blocking(c, r);
    }
    /* The event is recorded now, on the caller's thread: "after the work queued on `after` so far" means at
     * the call, not when the worker reaches the request. */
    dev_event *ev;
    ERR_CHECK(dev_event_create(dev, &ev));
    strata_status st = after ? dev_event_record(ev, after) : STRATA_OK;
    r->run = run_device;
    r->dev = dev;
    r->after = ev;
    if (st == STRATA_OK)
        st = comm_run_blocking(c, r);
    dev_event_destroy(ev);
    return st;
}

strata_status comm_dev_allgather(comm *c, device *dev, dev_stream *after, const void *send, void *recv,
                                 size_t send_count, comm_dtype dt)
{
    comm_req r;
    ERR_CHECK(comm_make_allgather(c, "comm_dev_allgather", send, recv, send_count, dt, &r));
    return dev_collective(c, dev, after, &r);
}

strata_status comm_dev_reduce_scatter(comm *c, device *dev, dev_stream *after, const void *send, void *recv,
                                      size_t recv_count, comm_dtype dt)
{
    comm_req r;
    ERR_CHECK(comm_make_reduce_scatter(c, "comm_dev_reduce_scatter", send, recv, recv_count, dt, &r));
    r.reduce_scatter = true;
    return dev_collective(c, dev, after, &r);
}

static strata_status run_detach(comm *c, comm_req *r)
{
    if (c->dev_state && c->dev_state->dev == r->dev)
        comm_dev_release(c);
    if (c->nccl_dev == r->dev)
        comm_nccl_release(c);
    return STRATA_OK;
}

void comm_detach_device(comm *c, device *dev)
{
    if (!c || !dev)
        return;
    comm_req r = {.op = "comm_detach_device", .run = run_detach, .runs_when_broken = true, .dev = dev};
    if (comm_enqueue(c, &r) == STRATA_OK)
        comm_req_finish(&r);
}

static strata_status run_attach(comm *c, comm_req *r)
{
    return comm_nccl_attach(c, r->dev, r->arg);
}

strata_status comm_attach_nccl(comm *c, device *dev, void *nccl_comm)
{
    const char *op = "comm_attach_nccl";
    if (!c || !dev)
        return err_set(STRATA_EINVAL, "%s: comm and dev must not be NULL", op);
    if (dev_kind(dev) != STRATA_BACKEND_CUDA)
        return err_set(STRATA_EUNSUPPORTED, "%s: device %s is not a CUDA device; NCCL needs one", op, dev_name(dev));
    if (!nccl_comm && c->size == 1)
        return err_set(STRATA_EUNSUPPORTED, "%s: a world of 1 needs no NCCL (device collectives are copies)", op);
    /* On the worker: the bootstrap broadcasts over MPI, which only the worker calls. */
    comm_req r = {.op = op, .kind = COMM_KIND_ATTACH_NCCL, .run = run_attach, .dev = dev, .arg = nccl_comm};
    return comm_run_blocking(c, &r);
}
