/*
 * Partial optimizer offload (offload_optimizer.ratio) across ranks: each rank's device share is the tail of its own
 * slice of the optimizer partition, and N ranks at ratios 0, 0.3 and 0.5 end with the weights of the same N ranks at
 * ratio 1, bit for bit, at every ZeRO stage (the parameters offloaded at stage 3, on the host and on NVMe), with
 * gradient clipping (a global norm) and with the delayed update. Every rank also holds what rank 0 holds. A
 * checkpoint the world saved at one ratio, resumed at another, gives the weights of the run that never stopped.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "comm/comm.h"
#include "synth.h"
#include "testlib.h"
#include "world.h"

static t_world world;     /* this process's: its comm, rank, size and seed */
static const char *mine;  /* this rank's scratch directory (NVMe swap files) */
static char shared[512]; /* rank 0's: the world's checkpoints go there */

static void model(synth_opts *o)
{
    synth_defaults(o, world.seed);
    /* Modules of 8 and 16 blocks: cut into shards, each rank's slice still has several 4096-element sub-groups. */
    const int widths[] = {128, 256, 256, 256, 128};
    memcpy(o->width, widths, sizeof widths);
    o->layers = 4;
    o->steps = 3;
    o->comm = world.comm;
}

static bool train(const char *what, const synth_opts *o, const strata_config *cfg, float **w, size_t *n)
{
    *w = NULL;
    strata_status st = synth_train(o, cfg, w, n, NULL, NULL);
    T_CHECK(st == STRATA_OK, "%s: training failed: %s: %s", what, strata_status_name(st), strata_last_error(NULL));
    if (st == STRATA_OK)
        t_world_agree(world.comm, what, *w, *n);
    return st == STRATA_OK;
}

static void compare(const char *what, const float *ref, size_t nref, const float *w, size_t n)
{
    T_EQ_INT(n, nref);
    size_t first, diffs = synth_count_diff(ref, w, n < nref ? n : nref, &first);
    T_CHECK(diffs == 0, "%s: %zu of %zu weights differ from ratio 1's; first at %zu: ratio 1 %.9g, this %.9g", what,
            diffs, n, first, first < n ? (double)ref[first] : 0.0, first < n ? (double)w[first] : 0.0);
}

/* Stage 1 (each rank's optimizer state is its slice): saved after 2 steps at ratio 0.5, resumed at 0.3 for 2. */
static void run_resume(void)
{
    synth_opts o;
    model(&o);
    o.steps = 4;
    strata_config cfg = synth_config(STRATA_DTYPE_BF16);
    synth_placements[1].apply(&cfg, mine);
    cfg.zero_stage = 1;
    cfg.cpu_threads = 1;
    cfg.sub_group_size = 4096;
    float *ref, *w;
    size_t nref, n;
    char what[128], dir[600];
    snprintf(what, sizeof what, "stage 1, %d ranks, saved at ratio 0.5, resumed at 0.3", world.size);
    snprintf(dir, sizeof dir, "%s/ckpt-np%d", shared, world.size);
    if (!train(what, &o, &cfg, &ref, &nref))
        return;
    synth_opts first = o, second = o;
    first.steps = 2;
    first.save_dir = dir;
    first.save_after = 2;
    cfg.offload_optimizer_ratio = 0.5;
    if (train(what, &first, &cfg, &w, &n)) {
        free(w);
        second.first_step = 2;
        second.steps = 2;
        second.load_dir = dir;
        cfg.offload_optimizer_ratio = 0.3;
        if (train(what, &second, &cfg, &w, &n))
            compare(what, ref, nref, w, n);
        free(w);
    }
    if (world.rank == 0)
        printf("%s: checked\n", what);
    free(ref);
}

static void run_case(int stage, const synth_placement *pl, double clip, bool delayed)
{
    synth_opts o;
    model(&o);
    float *ref = NULL;
    size_t nref = 0;
    const double ratios[] = {1.0, 0.5, 0.3, 0.0};
    for (size_t r = 0; r < ARRAY_LEN(ratios); r++) {
        strata_config cfg = synth_config(STRATA_DTYPE_BF16);
        pl->apply(&cfg, mine);
        cfg.zero_stage = stage;
        cfg.cpu_threads = 1;
        cfg.sub_group_size = 4096;
        cfg.gradient_clipping = clip;
        cfg.delayed_update = delayed;
        cfg.delayed_warmup_steps = 1;
        cfg.offload_optimizer_ratio = ratios[r];
        char what[256];
        snprintf(what, sizeof what, "stage %d, %s%s%s, %d ranks, ratio %g", stage, pl->name,
                 clip > 0 ? ", clipped" : "", delayed ? ", delayed update" : "", world.size, ratios[r]);
        float *w;
        size_t n;
        if (!train(what, &o, &cfg, &w, &n))
            continue;
        if (!ref) {
            ref = w, nref = n;
            continue;
        }
        compare(what, ref, nref, w, n);
        free(w);
    }
    if (world.rank == 0)
        printf("stage %d, %s%s%s, %d ranks: ratios 0.5, 0.3, 0 match ratio 1\n", stage, pl->name,
               clip > 0 ? ", clipped" : "", delayed ? ", delayed update" : "", world.size);
    free(ref);
}

int main(void)
{
    world = t_world_open();
    mine = t_world_scratch(world.comm, "mpi_twin_flow", shared, sizeof shared);
    for (int stage = 0; stage <= 2; stage++)
        run_case(stage, &synth_placements[1], 0, false); /* the optimizer on the host */
    run_case(3, &synth_placements[2], 0.05, false);        /* parameters and optimizer on the host */
    run_case(3, &synth_placements[3], 0, true);            /* on NVMe, the gradient store in host memory */
    run_case(1, &synth_placements[1], 0.05, true);
    run_resume();
    t_scratch_cleanup();
    strata_comm_destroy(world.comm);
    return t_done();
}
