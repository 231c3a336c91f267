/*
 * Step in backward across ranks (stages 2 and 3): each module's gradients are reduce-scattered as they are handed
 * over and its update takes this rank's part, during backward. N ranks end with the weights, and report the
 * gradient norms, of the same N ranks' ordinary step, bit for bit: without clipping, with clipping that is certain
 * from the first hand-over, and with a threshold between the steps' norms (some steps redone), in host memory and
 * on NVMe; in fp16 with a loss scale that overflows the first steps (skipped alike); and with strata.norm_pass (the
 * world's norm measured by a first backward, nothing redone). Every rank holds what rank 0 holds. With several
 * ranks stages 0 and 1 are refused with the stage named (STRATA_ECONFIG, or STRATA_ECOMM with the refusing rank's
 * message on the others); one rank runs them.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "synth.h"
#include "testlib.h"
#include "world.h"

static t_world world;
static const char *mine; /* this rank's scratch directory (NVMe swap files) */

enum { STEPS = 4 };

static void model(synth_opts *o)
{
    synth_defaults(o, world.seed);
    const int widths[] = {128, 256, 256, 128};
    memcpy(o->width, widths, sizeof widths);
    o->layers = 3;
    o->steps = STEPS;
    o->micro_batches = 1; /* step in backward: gradient accumulation 1 */
    o->comm = world.comm;
}

static bool train(const char *what, const synth_opts *o, const strata_config *cfg, float **w, size_t *n,
                  strata_stats *stats)
{
    *w = NULL;
    strata_status st = synth_train(o, cfg, w, n, NULL, stats);
    T_CHECK(st == STRATA_OK, "%s: training failed: %s: %s", what, strata_status_name(st), strata_last_error(NULL));
    if (st == STRATA_OK)
        t_world_agree(world.comm, what, *w, *n);
    return st == STRATA_OK;
}

/* A threshold halfway between the smallest and the largest norm of an unclipped ordinary run (same data). */
static double probe_clip(const synth_opts *o, strata_config c)
{
    double norms[STEPS] = {0}, lo = 1e300, hi = 0;
    synth_opts p = *o;
    p.grad_norms = norms;
    c.gradient_clipping = 1e30;
    float *w;
    size_t n;
    if (train("probe", &p, &c, &w, &n, NULL))
        free(w);
    for (int s = 0; s < STEPS; s++) {
        if (!isfinite(norms[s]))
            continue; /* fp16 overflow */
        lo = norms[s] < lo ? norms[s] : lo;
        hi = norms[s] > hi ? norms[s] : hi;
    }
    return (lo + hi) / 2;
}

static void run_case(int stage, const synth_placement *pl, int clip_mode, strata_dtype dtype, bool norm_pass)
{
    synth_opts o;
    model(&o);
    strata_config cfg = synth_config(dtype);
    /* fp16: a loss scale that overflows the first steps' gradients (skipped on every rank alike), then halves. */
    cfg.initial_scale_power = 18;
    cfg.hysteresis = 1;
    pl->apply(&cfg, mine);
    cfg.zero_stage = stage;
    cfg.cpu_threads = 1;
    cfg.sub_group_size = 4096;
    cfg.gradient_clipping = clip_mode == 0 ? 0 : clip_mode == 1 ? 1e-6 : probe_clip(&o, cfg);
    char what[256];
    snprintf(what, sizeof what, "%s, stage %d, %s, clipping %g%s, %d ranks", strata_dtype_name(dtype), stage,
             pl->name, cfg.gradient_clipping, norm_pass ? ", norm pass" : "", world.size);
    double norms[2][STEPS];
    float *w[2] = {NULL, NULL};
    size_t n[2] = {0, 0};
    strata_stats stats[2] = {{0}};
    for (int sib = 0; sib < 2; sib++) {
        cfg.step_in_backward = sib;
        cfg.norm_pass = sib && norm_pass;
        o.grad_norms = norms[sib];
        if (!train(what, &o, &cfg, &w[sib], &n[sib], &stats[sib]))
            goto out;
    }
    T_EQ_INT(n[1], n[0]);
    size_t first, diffs = synth_count_diff(w[0], w[1], MIN(n[0], n[1]), &first);
    T_CHECK(diffs == 0, "%s: %zu of %zu weights differ from the ordinary step's; first at %zu: %.9g vs %.9g", what,
            diffs, n[0], first, first < n[0] ? (double)w[0][first] : 0.0, first < n[1] ? (double)w[1][first] : 0.0);
    uint64_t clipped = 0;
    for (int s = 0; s < STEPS; s++) {
        T_CHECK(memcmp(&norms[0][s], &norms[1][s], sizeof norms[0][s]) == 0, "%s: step %d's norm %.17g in "
                "backward, %.17g by the ordinary step", what, s, norms[1][s], norms[0][s]);
        clipped += cfg.gradient_clipping > 0 && isfinite(norms[0][s]) && norms[0][s] > cfg.gradient_clipping;
    }
    if (norm_pass) /* decided before the updates: nothing redone */
        clipped = 0;
    T_CHECK(stats[1].steps_redone == clipped, "%s: %llu steps redone, %llu expected", what,
            (unsigned long long)stats[1].steps_redone, (unsigned long long)clipped);
    T_CHECK(stats[1].norm_passes == (norm_pass ? (uint64_t)STEPS : 0), "%s: %llu norm passes", what,
            (unsigned long long)stats[1].norm_passes);
    T_CHECK(stats[1].skipped_steps == stats[0].skipped_steps, "%s: %llu steps skipped, the ordinary step %llu", what,
            (unsigned long long)stats[1].skipped_steps, (unsigned long long)stats[0].skipped_steps);
    if (world.rank == 0)
        printf("%s: %zu weights bit-identical to the ordinary step; %llu of %d steps redone (clipped), %llu skipped\n",
               what, n[0], (unsigned long long)stats[1].steps_redone, STEPS,
               (unsigned long long)stats[1].skipped_steps);
out:
    free(w[0]);
    free(w[1]);
}

static void refused(int stage)
{
    synth_opts o;
    model(&o);
    strata_config cfg = synth_config(STRATA_DTYPE_BF16);
    cfg.zero_stage = stage;
    cfg.step_in_backward = true;
    strata_engine *e = NULL;
    strata_status st = synth_engine(&o, &cfg, &e);
    if (world.size == 1) { /* one rank reduces nothing: every stage is the single-rank step */
        T_CHECK(st == STRATA_OK, "stage %d, 1 rank: %s", stage, strata_last_error(NULL));
        strata_engine_destroy(e);
        return;
    }
    /* The rank that refuses says why; the others fail with its message (finalize's outcome is agreed). */
    T_CHECK(st == STRATA_ECONFIG || st == STRATA_ECOMM, "stage %d: finalize gave %s", stage, strata_status_name(st));
    T_CONTAINS(strata_last_error(NULL), "strata.step_in_backward = true with");
    T_CONTAINS(strata_last_error(NULL), "set zero_optimization.stage to 2 or 3");
    if (world.rank == 0)
        printf("stage %d refused: %s\n", stage, strata_last_error(NULL));
    strata_engine_destroy(e);
}

int main(void)
{
    world = t_world_open();
    mine = t_world_scratch(world.comm, "mpi_step_in_backward", NULL, 0);
    refused(0);
    refused(1);
    for (int clip = 0; clip < 3; clip++) {
        run_case(2, &synth_placements[1], clip, STRATA_DTYPE_BF16, false); /* the optimizer on the host */
        run_case(3, &synth_placements[2], clip, STRATA_DTYPE_BF16, false); /* parameters and optimizer on the host */
        run_case(3, &synth_placements[3], clip, STRATA_DTYPE_BF16, false); /* on NVMe */
    }
    run_case(3, &synth_placements[3], 2, STRATA_DTYPE_FP16, false); /* overflows skip steps, the rest some clipped */
    run_case(2, &synth_placements[1], 0, STRATA_DTYPE_FP16, false);
    /* The norm pass: the world's norm summed at strata_norm_pass_end, the updates run once, clipped. */
    run_case(2, &synth_placements[1], 2, STRATA_DTYPE_BF16, true);
    run_case(3, &synth_placements[3], 2, STRATA_DTYPE_BF16, true);
    run_case(3, &synth_placements[3], 2, STRATA_DTYPE_FP16, true);
    t_scratch_cleanup();
    strata_comm_destroy(world.comm);
    return t_done();
}
