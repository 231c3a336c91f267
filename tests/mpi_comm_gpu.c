/*
 * The device collectives on a CUDA device (skipped without one): the MPI staging path (pinned buffers, a
 * comm-owned stream ordered after the caller's) at world 1 and under mpirun -np 2, where both ranks may share
 * one GPU, and the NCCL path when every rank has its own GPU. Results compare exactly: integer-valued floats.
 */
#include "comm/comm.h"
#include "testlib.h"

static int rank, size;

static float val(int r, size_t i)
{
    return (float)((int)((i * 2654435761u + (size_t)r * 40503u) % 2001) - 1000);
}

/* An all-gather and a reduce-scatter of n floats on dev, checked against the scalar oracle. */
static void round_trip(comm *c, device *dev, dev_stream *s, size_t n, const char *path)
{
    size_t world = n * size;
    float *host = malloc(world * sizeof *host), *want = malloc(world * sizeof *want);
    void *send = NULL, *recv = NULL;
    T_OK(dev_alloc(dev, world * sizeof(float), &send));
    T_OK(dev_alloc(dev, world * sizeof(float), &recv));
    for (size_t i = 0; i < world; i++)
        host[i] = val(rank, i);
    /* Queued on s, which the collective must wait for. */
    T_OK(dev_memcpy_async(s, send, host, n * sizeof(float)));
    T_OK(comm_dev_allgather(c, dev, s, send, recv, n, COMM_F32));
    T_OK(dev_memcpy_async(s, host, recv, world * sizeof(float)));
    T_OK(dev_stream_sync(s));
    size_t bad = 0;
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < n; i++)
            bad += host[r * n + i] != val(r, i);
    T_CHECK(!bad, "rank %d: %s dev_allgather: %zu of %zu elements differ", rank, path, bad, world);

    for (size_t i = 0; i < world; i++)
        host[i] = val(rank, i);
    T_OK(dev_memcpy_async(s, send, host, world * sizeof(float)));
    T_OK(comm_dev_reduce_scatter(c, dev, s, send, recv, n, COMM_F32));
    T_OK(dev_memcpy_async(s, host, recv, n * sizeof(float)));
    T_OK(dev_stream_sync(s));
    bad = 0;
    for (size_t i = 0; i < n; i++) {
        float sum = 0;
        for (int r = 0; r < size; r++)
            sum += val(r, rank * n + i);
        bad += host[i] != sum;
    }
    T_CHECK(!bad, "rank %d: %s dev_reduce_scatter: %zu of %zu elements differ", rank, path, bad, n);
    dev_free(dev, send);
    dev_free(dev, recv);
    free(host), free(want);
}

int main(void)
{
    char why[256];
    if (dev_probe(STRATA_BACKEND_CUDA, why, sizeof why) != STRATA_OK)
        t_skip("%s", why);
    comm *c = NULL;
    T_OK(comm_create_from_env(&c));
    if (!c)
        return t_done();
    rank = comm_rank(c);
    size = comm_size(c);
    device *dev = NULL;
    dev_options opt = DEV_OPTIONS_INIT;
    opt.budget_bytes = 64u << 20;
    opt.device_id = comm_local_rank(c);
    uint64_t shared = 0;
    if (dev_create(STRATA_BACKEND_CUDA, &opt, &dev) != STRATA_OK) {
        shared = 1;
        opt.device_id = 0; /* fewer GPUs than ranks: share the first */
        T_OK(dev_create(STRATA_BACKEND_CUDA, &opt, &dev));
    }
    dev_stream *s = NULL;
    T_OK(dev_stream_create(dev, "compute", &s));
    round_trip(c, dev, s, 1, "staged");
    round_trip(c, dev, s, 100003, "staged");

    /* Every rank must agree whether to attach: it is collective. */
    T_OK(comm_allreduce_uncounted(c, &shared, 1, COMM_U64, COMM_MAX));
    if (size == 1) {
        T_STATUS(comm_attach_nccl(c, dev, NULL), STRATA_EUNSUPPORTED);
        T_CONTAINS(strata_last_error(NULL), "world of 1");
    } else if (shared) {
        printf("rank %d: ranks share a GPU; NCCL needs one per rank, so only the staged path ran\n", rank);
    } else {
        T_OK(comm_attach_nccl(c, dev, NULL));
        T_EQ_STR(comm_kind_name(c), "mpi+nccl");
        round_trip(c, dev, s, 1, "nccl");
        round_trip(c, dev, s, 100003, "nccl");
    }
    comm_detach_device(c, dev);
    dev_stream_destroy(s);
    dev_destroy(dev);
    comm_destroy(c);
    return t_done();
}
