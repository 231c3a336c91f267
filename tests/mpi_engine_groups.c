/*
 * Parameter groups across ranks: N ranks that each train one micro-batch per step, with three optimizer groups whose
 * lrs follow a schedule from their own bases, end with the weights of one rank accumulating the same N micro-batches,
 * at stages 1 to 3 (the optimizer's shard view cuts modules, and so groups, where the ranks' shards meet). The
 * gradients sit on mpi_engine_ranks.c's exact grid, so any difference is the engine's. The same with a frozen
 * layer between trained ones (its module partitioned and gathered like any other, with no gradients to reduce). Ranks whose groups differ
 * are refused at finalize, and a step where one rank set a group otherwise fails on every rank, naming it.
 */
#include <math.h>
#include <string.h>

#include "synth.h"
#include "synth_oracle.h"
#include "testlib.h"
#include "world.h"

static t_world w;

static synth_opts model(const synth_groups *g)
{
    synth_opts o;
    synth_defaults(&o, w.seed);
    const int widths[] = {128, 256, 256, 128};
    memcpy(o.width, widths, sizeof widths);
    o.layers = 3;
    o.steps = 3;
    o.micro_batches = 1;
    o.comm = w.comm;
    o.exact_sums = true;
    o.lr_decay = 0.7;
    o.groups = g;
    return o;
}

static void against_one_rank(int stage, uint32_t frozen_layers)
{
    char what[128];
    snprintf(what, sizeof what, "stage %d, 3 groups, %s, %d ranks", stage,
             frozen_layers ? "layer 1 frozen" : "all trained", w.size);
    synth_groups g = synth_three_groups(3);
    synth_opts o = model(&g);
    o.frozen_layers = frozen_layers;
    strata_config c = synth_config(STRATA_DTYPE_FP32);
    c.zero_stage = stage;
    c.cpu_threads = 1;
    float *mine = NULL, *ref = NULL;
    size_t n = 0, nref = 0;
    T_CHECK(synth_train(&o, &c, &mine, &n, NULL, NULL) == STRATA_OK, "%s: training failed", what);
    synth_opts one = o;
    one.comm = NULL;
    one.micro_batches = w.size;
    T_CHECK(synth_train(&one, &c, &ref, &nref, NULL, NULL) == STRATA_OK && n == nref, "%s: one rank failed", what);
    if (mine && ref) {
        size_t first, d = synth_count_diff(mine, ref, n, &first);
        T_CHECK(d == 0, "%s: %zu of %zu weights differ from one rank; first %zu: %.9g vs %.9g", what, d, n, first,
                d ? (double)mine[first] : 0.0, d ? (double)ref[first] : 0.0);
        t_world_agree(w.comm, what, mine, n);
    }
    free(mine);
    free(ref);
}

static void refusals(void)
{
    if (w.size == 1)
        return;
    strata_config c = synth_config(STRATA_DTYPE_FP32);
    c.zero_stage = 2;
    /* Rank 1 made group 2 with another eps: every rank's finalize fails, naming the group, the field and both
     * values. */
    synth_groups g = synth_three_groups(3);
    if (w.rank == 1)
        g.hp[1].eps = 1e-7;
    synth_opts o = model(&g);
    strata_engine *e = NULL;
    strata_status st = synth_engine(&o, &c, &e);
    const char *msg = strata_last_error(NULL);
    T_CHECK(st == STRATA_ECONFIG && strstr(msg, "\"group2\" has eps = 9.9999999999999995e-07 on rank 0 but "
                                           "9.9999999999999995e-08 on rank 1"),
            "rank %d: groups that differ are refused at finalize, naming the group and the value: %s %s", w.rank,
            strata_status_name(st), msg);
    strata_engine_destroy(e);

    /* The same groups, but rank 1 put layer 0's bias in group 1: named too. */
    g = synth_three_groups(3);
    if (w.rank == 1)
        g.of_param[1] = 1;
    o = model(&g);
    st = synth_engine(&o, &c, &e);
    msg = strata_last_error(NULL);
    T_CHECK(st == STRATA_ECONFIG && strstr(msg, "\"layer0.bias\" is in group \"group2\" on rank 0 but in \"group1\""),
            "rank %d: a parameter in another group is named: %s %s", w.rank, strata_status_name(st), msg);
    strata_engine_destroy(e);

    /* The same groups, then rank 1 sets group 1's lr otherwise before a step: that step fails everywhere. */
    g = synth_three_groups(3);
    o = model(&g);
    T_OK(synth_engine(&o, &c, &e));
    if (w.rank == 1) {
        strata_group_hparams hp;
        T_OK(strata_group_get(e, 1, &hp));
        hp.lr *= 2;
        T_OK(strata_group_set(e, 1, &hp));
    }
    st = strata_step(e, NULL, NULL);
    T_CHECK(st == STRATA_ECONFIG && strstr(strata_last_error(e), "parameter groups differ at step"),
            "rank %d: a step with groups set otherwise on one rank fails: %s %s", w.rank, strata_status_name(st),
            strata_last_error(e));
    strata_engine_destroy(e);
}

int main(void)
{
    w = t_world_open();
    for (int stage = 1; stage <= 3; stage++) {
        against_one_rank(stage, 0);
        against_one_rank(stage, 1u << 1);
    }
    refusals();
    strata_comm_destroy(w.comm);
    return t_done();
}
