/*
 * A rank that fails takes the world down with a message naming it, and nobody hangs: a budget refused on one
 * rank at finalize, configs or models that differ between ranks. (A failure during training aborts the world
 * too — an NVMe error on one rank gave the others STRATA_ECOMM naming it within a second — but a process that
 * then destroys the broken world can crash inside MPI_Finalize, so that case is not in the suite yet.) Every case is bounded in time (the comm's default wait is 120 s; these must end in seconds).
 * The last rank is the one that fails (rank 0 is what a launcher's output shows first).
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"
#include "synth.h"
#include "testlib.h"

static strata_comm *world;
static int rank, size;
static uint64_t seed;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Finalize with a config and model that may differ on the last rank; every rank must fail with what. */
static void expect_finalize_fails(const char *what, strata_config *cfg, synth_opts *o, strata_status on_culprit,
                                  const char *needle)
{
    strata_engine *e = NULL;
    double t0 = now_s();
    strata_status st = synth_engine(o, cfg, &e);
    double took = now_s() - t0;
    const char *msg = strata_last_error(NULL);
    strata_status want = rank == size - 1 ? on_culprit : (on_culprit == STRATA_ECONFIG ? STRATA_ECONFIG : STRATA_ECOMM);
    T_CHECK(st == want, "%s: rank %d got %s (%s), expected %s", what, rank, strata_status_name(st), msg,
            strata_status_name(want));
    T_CHECK(rank == size - 1 && on_culprit != STRATA_ECONFIG ? true : strstr(msg, needle) != NULL,
            "%s: rank %d's message does not name the culprit (\"%s\" not in \"%s\")", what, rank, needle, msg);
    T_CHECK(took < 20, "%s: rank %d took %.1f s to fail", what, rank, took);
    strata_engine_destroy(e);
}

int main(void)
{
    T_CHECK(strata_comm_create(&world) == STRATA_OK, "strata_comm_create: %s", strata_last_error(NULL));
    rank = strata_comm_rank(world);
    size = strata_comm_size(world);
    if (size < 2) {
        strata_comm_destroy(world);
        t_skip("needs at least 2 ranks (run under mpirun)");
    }
    seed = t_rng_seed();
    T_OK(comm_broadcast(world, &seed, 1, COMM_U64, 0));
    char culprit[32];
    snprintf(culprit, sizeof culprit, "rank %d", size - 1);

    synth_opts o;
    synth_defaults(&o, seed);
    o.comm = world;

    /* A device budget the last rank's plan cannot hold. */
    strata_config cfg = synth_config(STRATA_DTYPE_FP32);
    if (rank == size - 1)
        cfg.device_budget_bytes = 4096;
    expect_finalize_fails("a budget on one rank", &cfg, &o, STRATA_EBUDGET, culprit);

    /* A config that changes the arithmetic. */
    cfg = synth_config(STRATA_DTYPE_FP32);
    if (rank == size - 1)
        cfg.weight_decay = 0.5f;
    expect_finalize_fails("a config that differs", &cfg, &o, STRATA_ECONFIG, "config differs");

    /* A model that differs. */
    cfg = synth_config(STRATA_DTYPE_FP32);
    synth_opts other = o;
    if (rank == size - 1)
        other.width[1] += 8;
    expect_finalize_fails("a model that differs", &cfg, &other, STRATA_ECONFIG, "model differs");

    t_scratch_cleanup();
    strata_comm_destroy(world);
    return t_done();
}
