/*
 * A failing rank never leaves the others hanging (comm/comm.h "Failures"), under mpirun with 2 and 3 ranks:
 *   (a) rank 1 calls comm_abort_world instead of its next collective: every other rank's collective fails
 *       with STRATA_ECOMM naming rank 1 and its reason within seconds, and the next call fails at once;
 *   (b) rank 0 skips a barrier and destroys its comm: the others' barrier fails at once, naming rank 0 as gone
 *       after the collectives it ran (not a deadline);
 *   (c) rank 0 skips a barrier but keeps its comm (it is stuck): the others' barrier fails at the deadline;
 *   (d) rank 0 calls an all-reduce where the others call an all-gather: every rank fails at once with one message
 *       that names collective #2, both calls and the ranks (never an MPI error or a deadline).
 * Each case runs on its own comm over MPI_COMM_WORLD, so a broken one does not affect the next; a healthy
 * comm made first (which initialised MPI) lines the ranks up at the end. A plain run (world 1) skips.
 */
#include <time.h>

#include "comm/comm.h"
#include "testlib.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void abort_world(comm *world, int rank)
{
    comm *c = NULL;
    T_OK(comm_create_mpi(NULL, &c));
    if (!c)
        return;
    /* Longer than the test may take: the abort message, not the deadline, must end the wait. */
    comm_set_timeout(c, 30000);
    /* Static: the all-gather that fails below stays posted in MPI (a collective cannot be cancelled), and the
     * peers' parts of it may still arrive while later cases use MPI; its buffers must outlive it. The engine's
     * answer is the same: a process whose world failed exits without touching MPI again. */
    static int x, all[4];
    x = rank;
    T_OK(comm_allgather(c, &x, all, 1, COMM_I32));
    /* A rank's part of a collective can be done before its peers' parts are: without this barrier (on another
     * comm), rank 1's abort could reach a peer still finishing the all-gather above and fail that one. */
    T_OK(comm_barrier(world));
    if (rank == 1) {
        comm_abort_world(c, "disk on fire");
        T_STATUS(comm_barrier(c), STRATA_ECOMM);
        T_CONTAINS(strata_last_error(NULL), "rank 1 failed: disk on fire");
    } else {
        double t0 = now_s();
        T_STATUS(comm_allgather(c, &x, all, 1, COMM_I32), STRATA_ECOMM);
        double waited = now_s() - t0;
        const char *msg = strata_last_error(NULL);
        T_CONTAINS(msg, "comm_allgather");
        T_CONTAINS(msg, "rank 1");
        T_CONTAINS(msg, "disk on fire");
        T_CHECK(waited < 10, "rank %d: the failed all-gather took %.1f s (limit 10 s)", rank, waited);
        t0 = now_s();
        T_STATUS(comm_barrier(c), STRATA_ECOMM);
        waited = now_s() - t0;
        T_CONTAINS(strata_last_error(NULL), "disk on fire");
        T_CHECK(waited < 0.5, "rank %d: a call on the broken comm took %.3f s instead of failing at once", rank,
                waited);
    }
    comm_destroy(c);
}

static void left_world(int rank)
{
    comm *c = NULL;
    T_OK(comm_create_mpi(NULL, &c));
    if (!c)
        return;
    comm_set_timeout(c, 30000); /* the message, not the deadline, must end the wait */
    if (rank != 0) {
        double t0 = now_s();
        T_STATUS(comm_barrier(c), STRATA_ECOMM);
        double waited = now_s() - t0;
        T_CONTAINS(strata_last_error(NULL), "comm_barrier: rank 0 left the world after 0 collectives");
        T_CONTAINS(strata_last_error(NULL), "waits in collective #1");
        T_CHECK(waited < 5, "rank %d: the barrier failed after %.2f s (limit 5 s)", rank, waited);
        T_STATUS(comm_barrier(c), STRATA_ECOMM);
    }
    comm_destroy(c);
}

static void stuck_rank(comm *world, int rank)
{
    comm *c = NULL;
    T_OK(comm_create_mpi(NULL, &c));
    if (!c)
        return;
    comm_set_timeout(c, 1500);
    if (rank != 0) {
        double t0 = now_s();
        T_STATUS(comm_barrier(c), STRATA_ECOMM);
        double waited = now_s() - t0;
        T_CONTAINS(strata_last_error(NULL), "comm_barrier: timed out after 1500 ms");
        T_CONTAINS(strata_last_error(NULL), "strata.comm_timeout_s");
        T_CHECK(waited >= 1.4 && waited < 10, "rank %d: the barrier failed after %.2f s (expected 1.5 s, < 10 s)",
                rank, waited);
        T_STATUS(comm_barrier(c), STRATA_ECOMM);
    }
    /* Rank 0 stays in the world until the others have given up on it (the world comm lines them up). */
    T_OK(comm_barrier(world));
    comm_destroy(c);
}

static void other_collective(int rank)
{
    comm *c = NULL;
    T_OK(comm_create_mpi(NULL, &c));
    if (!c)
        return;
    comm_set_timeout(c, 30000);
    static double v[3];
    static int x, all[4];
    T_OK(comm_allreduce(c, v, 3, COMM_F64, COMM_SUM));
    double t0 = now_s();
    if (rank == 0)
        T_STATUS(comm_allreduce(c, v, 3, COMM_F64, COMM_SUM), STRATA_ECOMM);
    else
        T_STATUS(comm_allgather(c, &x, all, 1, COMM_I32), STRATA_ECOMM);
    double waited = now_s() - t0;
    const char *msg = strata_last_error(NULL);
    T_CONTAINS(msg, "the ranks are in different collectives: collective #2 is comm_allreduce (all-reduce of 3 f64) "
                    "on rank 0 but comm_allgather (all-gather of 1 i32 per rank) on rank 1");
    T_CHECK(waited < 5, "rank %d: the mismatch was reported after %.2f s (limit 5 s)", rank, waited);
    comm_destroy(c);
}

int main(void)
{
    comm *world = NULL;
    T_OK(comm_create_from_env(&world));
    if (!world)
        return t_done();
    int rank = comm_rank(world), size = comm_size(world);
    if (size < 2) {
        comm_destroy(world);
        t_skip("world of 1: a peer's failure needs peers (run under mpirun, tests/helpers/mpi.sh)");
    }
    abort_world(world, rank);
    left_world(rank);
    stuck_rank(world, rank);
    other_collective(rank);
    /* Everyone is past both cases before MPI is finalised. */
    T_OK(comm_barrier(world));
    comm_destroy(world);
    return t_done();
}
