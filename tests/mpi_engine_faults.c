/*
 * A rank that fails takes the world down with a message naming it, and nobody hangs: a budget refused on one
 * rank at finalize, configs, models or initial weights that differ between ranks, and steps whose arguments
 * differ (the lr, the micro-batches handed over, a rank in another collective). (A failure during training aborts the world
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

/* Trains with a config or options that differ on the last rank: every rank must fail with STRATA_ECONFIG or
 * STRATA_ECOMM, its message containing needle, within seconds. */
static void expect_train_fails(const char *what, const strata_config *cfg, const synth_opts *o, const char *needle)
{
    float *w = NULL;
    size_t n = 0;
    double t0 = now_s();
    strata_status st = synth_train(o, cfg, &w, &n, NULL, NULL);
    double took = now_s() - t0;
    const char *msg = strata_last_error(NULL);
    T_CHECK(st == STRATA_ECONFIG || st == STRATA_ECOMM, "%s: rank %d got %s (%s), expected ECONFIG or ECOMM", what,
            rank, strata_status_name(st), msg);
    T_CHECK(strstr(msg, needle) != NULL, "%s: rank %d's message does not say \"%s\": \"%s\"", what, rank, needle,
            msg);
    T_CHECK(took < 20, "%s: rank %d took %.1f s to fail", what, rank, took);
    free(w);
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
    expect_finalize_fails("a config that differs", &cfg, &o, STRATA_ECONFIG,
                          "configs differ: optimizer.params.weight_decay is");
    cfg = synth_config(STRATA_DTYPE_FP32);
    if (rank == size - 1)
        cfg.lr = (float)(cfg.lr_exact = 2e-2);
    expect_finalize_fails("an lr that differs", &cfg, &o, STRATA_ECONFIG, "optimizer.params.lr is 0.0099999997764825821 on rank 0 but 0.02 on rank");

    /* Initial weights that differ (another seed): the module is named. */
    cfg = synth_config(STRATA_DTYPE_FP32);
    synth_opts seeded = o;
    if (rank == size - 1)
        seeded.seed = o.seed + 1;
    expect_finalize_fails("weights that differ", &cfg, &seeded, STRATA_ECONFIG,
                          "initial weights differ between ranks: module \"layer0\"");

    /* A model that differs. */
    cfg = synth_config(STRATA_DTYPE_FP32);
    synth_opts other = o;
    if (rank == size - 1)
        other.width[1] += 8;
    expect_finalize_fails("a model that differs", &cfg, &other, STRATA_ECONFIG, "model differs");

    /* Steps whose arguments differ fail every rank at that step, naming the field and both values. */
    cfg = synth_config(STRATA_DTYPE_FP32);
    synth_opts decayed = o;
    decayed.steps = 3;
    decayed.lr_decay = rank == size - 1 ? 0.5 : 0.9;
    expect_train_fails("a schedule that differs", &cfg, &decayed, "learning rates differ at step 2");
    cfg.zero_stage = 1; /* hand-overs are local below stage 2: the step's check is the first to see them */
    synth_opts accum = o;
    accum.steps = 2;
    accum.micro_batches = rank == size - 1 ? 3 : 2;
    expect_train_fails("accumulation that differs (stage 1)", &cfg, &accum, "micro-batches on rank 0 but 3 on");
    /* At stage 3 every hand-over reduce-scatters: the rank with more is in another collective. That breaks the comm
     * it ran on, so it runs on a comm of its own. */
    strata_comm *own = NULL;
    T_OK(strata_comm_create_mpi(NULL, &own));
    cfg.zero_stage = 3;
    accum.comm = own;
    if (own)
        expect_train_fails("accumulation that differs (stage 3)", &cfg, &accum,
                           "the ranks are in different collectives: collective #");
    strata_comm_destroy(own);

    t_scratch_cleanup();
    strata_comm_destroy(world);
    return t_done();
}
