/*
 * The collective contract (comm/comm.h) on every rank of the world it was launched in: a plain run is world
 * 1 (comm_single.c), under mpirun (tests/helpers/mpi.sh) the MPI comm. Rank 0 draws the seed and broadcasts
 * it, so every rank can compute every rank's input and the exact expected output (the scalar oracle below).
 *
 * The values are small integers (|v| <= 1000), also in f32: every partial sum of at most a few thousand of
 * them is an integer below 2^24, exact in f32 whatever order MPI adds them in, so results compare exactly.
 */
#include <stdio.h>
#include <string.h>

#include "comm/comm.h"
#include "testlib.h"

static comm *c;
static int rank, size;
static uint64_t seed;
static uint64_t want_bytes; /* the Counting formula over the calls made */

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Element i of rank r's input for the call tagged tag: an integer in [-1000, 1000]. */
static int val(int tag, int r, size_t i)
{
    return (int)(mix(seed ^ ((uint64_t)tag << 56) ^ ((uint64_t)r << 40) ^ i) % 2001) - 1000;
}

/* Compares n elements of dt; prints the first difference with both values and the count of differences. */
static void same(const char *what, const void *got, const void *want, size_t n, comm_dtype dt)
{
    size_t eb = comm_dtype_bytes(dt), bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)got + i * eb, (const char *)want + i * eb, eb) && !bad++)
            first = i;
    char g[64] = "", w[64] = "";
    if (bad) {
        const char *gp = (const char *)got + first * eb, *wp = (const char *)want + first * eb;
        switch (dt) {
        case COMM_F32: snprintf(g, sizeof g, "%.9g", *(const float *)gp); snprintf(w, sizeof w, "%.9g", *(const float *)wp); break;
        case COMM_F64: snprintf(g, sizeof g, "%.17g", *(const double *)gp); snprintf(w, sizeof w, "%.17g", *(const double *)wp); break;
        case COMM_U64: snprintf(g, sizeof g, "%llu", *(const unsigned long long *)gp); snprintf(w, sizeof w, "%llu", *(const unsigned long long *)wp); break;
        case COMM_I32: snprintf(g, sizeof g, "%d", *(const int *)gp); snprintf(w, sizeof w, "%d", *(const int *)wp); break;
        case COMM_BYTE: snprintf(g, sizeof g, "%u", *(const unsigned char *)gp); snprintf(w, sizeof w, "%u", *(const unsigned char *)wp); break;
        }
    }
    T_CHECK(!bad, "rank %d of %d: %s: %zu of %zu elements differ; first at %zu: got %s, expected %s", rank, size, what,
            bad, n, first, g, w);
}

static void test_allgather(size_t n, int tag)
{
    float *send = malloc(n * sizeof *send), *recv = malloc(n * size * sizeof *recv), *want = malloc(n * size * sizeof *want);
    for (size_t i = 0; i < n; i++)
        send[i] = (float)val(tag, rank, i);
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < n; i++)
            want[r * n + i] = (float)val(tag, r, i);
    T_OK(comm_allgather(c, send, recv, n, COMM_F32));
    want_bytes += n * size * 4;
    same("allgather", recv, want, n * size, COMM_F32);

    /* In place: this rank's block already sits in recv. */
    memset(recv, 0, n * size * sizeof *recv);
    memcpy(recv + rank * n, send, n * sizeof *send);
    T_OK(comm_allgather(c, recv + rank * n, recv, n, COMM_F32));
    want_bytes += n * size * 4;
    same("allgather in place", recv, want, n * size, COMM_F32);
    free(send), free(recv), free(want);
}

static void fill_reduce_scatter(size_t n, int tag, float *send, float *want)
{
    for (size_t i = 0; i < n * size; i++)
        send[i] = (float)val(tag, rank, i);
    for (size_t i = 0; i < n; i++) {
        long sum = 0;
        for (int r = 0; r < size; r++)
            sum += val(tag, r, rank * n + i);
        want[i] = (float)sum;
    }
}

static void test_reduce_scatter(size_t n, int tag)
{
    float *send = malloc(n * size * sizeof *send), *recv = malloc(n * sizeof *recv), *want = malloc(n * sizeof *want);
    fill_reduce_scatter(n, tag, send, want);
    T_OK(comm_reduce_scatter(c, send, recv, n, COMM_F32));
    want_bytes += n * size * 4;
    same("reduce_scatter f32 sum", recv, want, n, COMM_F32);
    free(send), free(recv), free(want);
}

static void test_allreduce(size_t n, int tag)
{
    static const comm_op ops[] = {COMM_SUM, COMM_MAX, COMM_MIN};
    static const char *const names[] = {"sum", "max", "min"};
    double *d = malloc(n * sizeof *d), *dw = malloc(n * sizeof *dw);
    uint64_t *u = malloc(n * sizeof *u), *uw = malloc(n * sizeof *uw);
    for (int k = 0; k < 3; k++) {
        for (size_t i = 0; i < n; i++) {
            long acc = val(tag + k, 0, i);
            for (int r = 1; r < size; r++) {
                long v = val(tag + k, r, i);
                acc = ops[k] == COMM_SUM ? acc + v : ops[k] == COMM_MAX ? (v > acc ? v : acc) : (v < acc ? v : acc);
            }
            d[i] = val(tag + k, rank, i);
            dw[i] = (double)acc;
            /* u64: shifted to be non-negative, and large, so that a truncation to 32 bits shows. */
            u[i] = ((uint64_t)1 << 40) + (uint64_t)(val(tag + k, rank, i) + 1000);
            uw[i] = ops[k] == COMM_SUM ? ((uint64_t)1 << 40) * size + (uint64_t)(acc + 1000L * size)
                                       : ((uint64_t)1 << 40) + (uint64_t)(acc + 1000);
        }
        char what[64];
        snprintf(what, sizeof what, "allreduce f64 %s", names[k]);
        T_OK(comm_allreduce(c, d, n, COMM_F64, ops[k]));
        same(what, d, dw, n, COMM_F64);
        snprintf(what, sizeof what, "allreduce u64 %s", names[k]);
        T_OK(comm_allreduce(c, u, n, COMM_U64, ops[k]));
        same(what, u, uw, n, COMM_U64);
        want_bytes += 2 * (2 * n * 8);
    }
    free(d), free(dw), free(u), free(uw);
}

static void test_broadcast(size_t n, int tag)
{
    int root = size - 1; /* not rank 0 whenever the world has more than one rank */
    int *buf = malloc(n * sizeof *buf), *want = malloc(n * sizeof *want);
    for (size_t i = 0; i < n; i++) {
        buf[i] = val(tag, rank, i);
        want[i] = val(tag, root, i);
    }
    T_OK(comm_broadcast(c, buf, n, COMM_I32, root));
    want_bytes += n * 4;
    same("broadcast from the last rank", buf, want, n, COMM_I32);
    free(buf), free(want);
}

/* Two requests in flight at once, completed in the order they were queued. */
static void test_async(size_t n, int tag)
{
    float *ag_send = malloc(n * sizeof(float)), *ag_recv = malloc(n * size * sizeof(float)),
          *ag_want = malloc(n * size * sizeof(float));
    float *rs_send = malloc(n * size * sizeof(float)), *rs_recv = malloc(n * sizeof(float)), *rs_want = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        ag_send[i] = (float)val(tag, rank, i);
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < n; i++)
            ag_want[r * n + i] = (float)val(tag, r, i);
    fill_reduce_scatter(n, tag + 1, rs_send, rs_want);
    comm_req *a = NULL, *b = NULL;
    T_OK(comm_start_allgather(c, ag_send, ag_recv, n, COMM_F32, &a));
    T_OK(comm_start_reduce_scatter(c, rs_send, rs_recv, n, COMM_F32, &b));
    while (!comm_test(b))
        ;
    T_CHECK(comm_test(a), "rank %d: the first request is not done when the second (queued after it) is", rank);
    T_OK(comm_wait(a));
    T_OK(comm_wait(b));
    want_bytes += 2 * n * size * 4;
    same("async allgather", ag_recv, ag_want, n * size, COMM_F32);
    same("async reduce_scatter", rs_recv, rs_want, n, COMM_F32);
    T_OK(comm_wait(NULL));
    free(ag_send), free(ag_recv), free(ag_want), free(rs_send), free(rs_recv), free(rs_want);
}

/* The device forms on the host backend, where device memory is host memory. */
static void test_device_host(size_t n, int tag)
{
    device *dev = NULL;
    dev_options opt = DEV_OPTIONS_INIT;
    opt.budget_bytes = 8u << 20;
    T_OK(dev_create(STRATA_BACKEND_HOST, &opt, &dev));
    if (!dev)
        return;
    dev_stream *s = NULL;
    T_OK(dev_stream_create(dev, "compute", &s));
    float *send, *recv, *want = malloc(n * size * sizeof *want);
    T_OK(dev_alloc(dev, n * size * sizeof(float), (void **)&send));
    T_OK(dev_alloc(dev, n * size * sizeof(float), (void **)&recv));
    for (size_t i = 0; i < n; i++)
        send[i] = (float)val(tag, rank, i);
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < n; i++)
            want[r * n + i] = (float)val(tag, r, i);
    T_OK(comm_dev_allgather(c, dev, s, send, recv, n, COMM_F32));
    want_bytes += n * size * 4;
    same("dev_allgather (host backend)", recv, want, n * size, COMM_F32);

    fill_reduce_scatter(n, tag + 1, send, want);
    T_OK(comm_dev_reduce_scatter(c, dev, s, send, recv, n, COMM_F32));
    want_bytes += n * size * 4;
    same("dev_reduce_scatter (host backend)", recv, want, n, COMM_F32);

    comm_detach_device(c, dev);
    free(want);
    dev_stream_destroy(s);
    dev_destroy(dev);
}

/* Mistakes a caller can make get a message that names the call and the value. */
static void test_misuse(void)
{
    int x = 0;
    T_STATUS(comm_broadcast(c, &x, 1, COMM_I32, size), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "root");
    T_STATUS(comm_allreduce(c, &x, 1, COMM_BYTE, COMM_SUM), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "COMM_BYTE cannot be reduced");
    T_STATUS(comm_allgather(c, NULL, &x, 1, COMM_I32), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "NULL buffer");
    T_STATUS(comm_attach_nccl(c, NULL, NULL), STRATA_EINVAL);
}

int main(void)
{
    T_OK(comm_create_from_env(&c));
    if (!c)
        return t_done();
    rank = comm_rank(c);
    size = comm_size(c);
    T_EQ_STR(comm_kind_name(c), size == 1 ? "single" : "mpi");
    T_CHECK(comm_local_rank(c) < comm_local_size(c), "local rank %d >= local size %d", comm_local_rank(c),
            comm_local_size(c));

    seed = t_rng_seed();
    T_OK(comm_broadcast(c, &seed, 1, COMM_U64, 0));
    want_bytes += 8;
    if (rank == 0)
        printf("world %d, seed %llu (every rank uses rank 0's)\n", size, (unsigned long long)seed);

    /* 1 element, and 997: prime, so no world size divides it and no block lands on a round boundary. */
    static const size_t sizes[] = {1, 997};
    for (int k = 0; k < 2; k++) {
        size_t n = sizes[k];
        int tag = 16 * k;
        test_allgather(n, tag + 0);
        test_reduce_scatter(n, tag + 1);
        test_allreduce(n, tag + 2);
        test_broadcast(n, tag + 5);
        T_OK(comm_barrier(c));
        test_async(n, tag + 6);
        test_device_host(n, tag + 8);
    }
    /* Uncounted: the engine's scalar checks. */
    uint64_t one = 1;
    T_OK(comm_allreduce_uncounted(c, &one, 1, COMM_U64, COMM_SUM));
    T_EQ_INT(one, size);
    test_misuse();
    T_EQ_INT(comm_bytes(c), want_bytes);
    comm_destroy(c);
    return t_done();
}
