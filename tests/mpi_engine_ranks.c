/*
 * ZeRO across ranks: N ranks that each train one micro-batch per step end with the weights of one rank that
 * accumulates the same N micro-batches, for every stage and placement, and they move what the stage says.
 *
 * Oracle: the one-rank run of the same model, data and config (run on every rank, in-process, world 1), and the
 * comparison is bit for bit. The N ranks add the micro-batches' fp32 gradients in the order the reduce-scatter adds
 * them, the one rank in micro-batch order, and fp32 addition is not associative: with free gradients the sums differ
 * in the last bits, and Adam (which moves a weight by about lr whatever its gradient's size) turns an element whose
 * micro-batch gradients nearly cancel into a visible difference, which then spreads through the network (one such
 * weight after step 1 became 50930 of 460672 after step 3, seed 1269151028618867 before this rule). So the trainer
 * puts its gradients on a grid where every such sum is exact (synth_opts.exact_sums: multiples of 2^-26 within
 * +-2^-6), and any difference left is the engine's. Between ranks: bit-identical too (each shard is updated once, by
 * its owner, and all-gathered; stage 0's all-reduce gives every rank the same sums).
 *
 * Communication per step (gradient accumulation 1), with Psi the padded partition (every module cut into N equal
 * 4 KiB-aligned shards): gradients move as fp32 (so the sums are the one rank's, up to order), parameters in
 * their dtype. Stage 0: an all-reduce of Psi fp32, counted as a reduce-scatter plus an all-gather (2 Psi * 4);
 * stages 1 and 2: Psi * 4 reduce-scattered + Psi * param_bytes all-gathered; stage 3: Psi * 4 + 2 Psi *
 * param_bytes (gathered in forward and again in backward). With k micro-batches per step stages 2 and 3
 * reduce-scatter k times (k Psi * 4) and stage 3 gathers 2k times; stages 0 and 1 exchange once per step.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "comm/comm.h"
#include "engine/plan/plan.h"
#include "synth.h"
#include "testlib.h"
#include "world.h"

static strata_comm *world;
static int rank, size;
static uint64_t seed; /* rank 0's, so every rank trains the same model on the same data */

/* The padded partition of synth's model in a world of n: per module, n shards of 4 KiB-aligned elements. */
static size_t padded_psi(const synth_opts *o, int n)
{
    size_t psi = 0;
    for (int l = 0; l < o->layers; l++) {
        size_t sizes[2] = {(size_t)o->width[l + 1] * o->width[l], (size_t)o->width[l + 1]};
        size_t one = plan_module_layout(sizes, NULL, 2, NULL, NULL);
        size_t shard = (one + (size_t)n - 1) / (size_t)n;
        shard = (shard + PLAN_MODULE_ALIGN - 1) / PLAN_MODULE_ALIGN * PLAN_MODULE_ALIGN;
        psi += shard * (size_t)n;
    }
    return psi;
}

/* The largest module of synth's default model in a world of n, in elements. */
static size_t largest_module(const synth_opts *o, int n)
{
    size_t big = 0;
    for (int l = 0; l < o->layers; l++) {
        synth_opts one = *o;
        one.layers = 1;
        one.width[0] = o->width[l];
        one.width[1] = o->width[l + 1];
        size_t m = padded_psi(&one, n);
        big = m > big ? m : big;
    }
    return big;
}

static uint64_t want_comm_bytes(int stage, size_t psi, size_t pb, int k)
{
    switch (stage) {
    case 0: return 2 * psi * 4;
    case 1: return psi * 4 + psi * pb;
    case 2: return (uint64_t)k * psi * 4 + psi * pb;
    default: return (uint64_t)k * psi * 4 + 2 * (uint64_t)k * psi * pb;
    }
}

/* Each rank's tiers shrink as the stage says, against one rank with the same micro-batches per step: the host
 * tier (optimizer state from stage 1, gradients from stage 2) and, at stage 3 with parameters on NVMe, the
 * bytes read from NVMe per rank (bandwidth-centric: each rank reads only its shards). */
static void check_memory(const char *what, int stage, const strata_config *cfg, const synth_opts *o,
                         const strata_stats *st, int k)
{
    if (size == 1 || stage == 0)
        return;
    synth_opts one = *o;
    one.comm = NULL;
    one.micro_batches = k;
    float *w = NULL;
    size_t n;
    strata_stats st1;
    T_OK(synth_train(&one, cfg, &w, &n, NULL, &st1));
    free(w);
    double shard = (double)padded_psi(o, size) / size / (double)padded_psi(o, 1);
    /* From stage 1 the optimizer state (12 bytes an element) is split. Stage 1 also keeps the whole fp32 gradient
     * store and adds two shard copies (the reduced gradients, the updated parameters: 8 bytes an element over N),
     * so at 2 ranks it saves 2 bytes an element, which this small model's collective scratch (a few modules)
     * outweighs: its host tier shrinks from 3 ranks on. From stage 2 the gradients are split too. */
    if (cfg->offload_optimizer.device == STRATA_TIER_HOST && (stage >= 2 || (stage == 1 && size >= 3)))
        T_CHECK(st->host_peak_bytes < st1.host_peak_bytes, "%s: host tier %zu bytes per rank, one rank %zu", what,
                st->host_peak_bytes, st1.host_peak_bytes);
    /* With one micro-batch per step both runs fetch every module twice; with more (or with the delayed update's
     * prefetch across the step), which modules stay resident depends on their (padded, larger) size. */
    if (stage == 3 && cfg->offload_param.device == STRATA_TIER_NVME && k == 1 && !cfg->delayed_update &&
        !cfg->host_cache) { /* with the host cache the drive serves (next to) nothing: no ratio to take */
        double ratio = (double)st->nvme_to_host_bytes / (double)st1.nvme_to_host_bytes;
        /* At most the shard's part of the model (padding makes it a little more than 1/N; the optimizer's own
         * reads shrink the ratio below it). And each rank copies a module to the device as often as the one rank
         * does: re-reading every module in backward, a bug once, doubled that ratio. */
        T_CHECK(ratio <= shard, "%s: NVMe read %llu bytes per rank, one rank %llu: ratio %.3f, more than the shard's "
                "%.3f of the model", what, (unsigned long long)st->nvme_to_host_bytes,
                (unsigned long long)st1.nvme_to_host_bytes, ratio, shard);
        double h2d = (double)st->host_to_device_bytes / (double)st1.host_to_device_bytes;
        T_CHECK(h2d <= shard * 1.01, "%s: host->device %llu bytes per rank, one rank %llu: ratio %.3f, more than "
                "the shard's %.3f", what, (unsigned long long)st->host_to_device_bytes,
                (unsigned long long)st1.host_to_device_bytes, h2d, shard);
        if (rank == 0)
            printf("%s: NVMe read per rank / one rank = %.3f (shard %.3f)\n", what, ratio, shard);
    }
}

typedef struct variant {
    const char *name;
    void (*apply)(strata_config *c);
} variant;

static void plain(strata_config *c) { (void)c; }
static void delayed(strata_config *c) { c->delayed_update = true; c->delayed_warmup_steps = 1; }
static void clipped(strata_config *c) { c->gradient_clipping = 0.05; }
static void fp16(strata_config *c) { c->param_dtype = STRATA_DTYPE_FP16; c->initial_scale_power = 12; }
static void checksummed(strata_config *c) { c->swap_checksum = true; }

static void run_case(int stage, const synth_placement *pl, int k, const variant *v)
{
    char name[64], what[256];
    snprintf(name, sizeof name, "mpi_ranks_%d_r%d", size, rank);
    const char *dir = t_scratch_dir(name);
    snprintf(what, sizeof what, "stage %d, %s, %d micro-batch%s per rank%s%s, %d ranks", stage, pl->name, k,
             k == 1 ? "" : "es", v->name[0] ? ", " : "", v->name, size);
    strata_config cfg = synth_config(STRATA_DTYPE_FP32);
    pl->apply(&cfg, dir);
    v->apply(&cfg);
    cfg.zero_stage = stage;
    cfg.cpu_threads = 1;
    synth_opts o;
    synth_defaults(&o, seed);
    /* Modules of 8 and 16 blocks of 4096 elements: cut into 2, 3 or 4 shards they shrink (a module smaller than
     * N blocks would be all padding, and no rank's memory would shrink); eight of them, so that the collectives'
     * scratch (a few modules' worth, per rank) is small beside the state the ranks split. */
    const int widths[] = {128, 256, 256, 256, 256, 256, 256, 256, 128};
    memcpy(o.width, widths, sizeof widths);
    o.layers = 8;
    o.steps = 3;
    o.micro_batches = k;
    o.comm = world;
    o.exact_sums = true;
    if (cfg.prefetch_bytes == 1) {
        /* The two-module device budget, for this world's modules (cut into N 4 KiB-aligned shards, they grow). */
        size_t big = largest_module(&o, size) * 4;
        cfg.max_live_bytes = 2 * big;
        cfg.device_budget_bytes = 3 * big;
    }

    float *w = NULL, *ref = NULL;
    size_t n = 0, nref = 0;
    strata_stats st, st_ref;
    strata_status s = synth_train(&o, &cfg, &w, &n, NULL, &st);
    T_CHECK(s == STRATA_OK, "%s: training failed: %s", what, strata_status_name(s));
    synth_opts one = o;
    one.comm = NULL;
    one.micro_batches = k * size;
    s = synth_train(&one, &cfg, &ref, &nref, NULL, &st_ref);
    T_CHECK(s == STRATA_OK && n == nref, "%s: the one-rank reference failed: %s", what, strata_status_name(s));
    if (!w || !ref) {
        free(w);
        free(ref);
        return;
    }
    size_t first, differ = synth_count_diff(w, ref, n, &first);
    T_CHECK(differ == 0, "%s: %zu of %zu weights differ from one rank accumulating; the first, weight %zu, is %.9g "
            "with %d ranks and %.9g with one rank", what, differ, n, first, differ ? (double)w[first] : 0.0, size,
            differ ? (double)ref[first] : 0.0);
    t_world_agree(world, what, w, n);

    uint64_t want = want_comm_bytes(stage, padded_psi(&o, size), strata_dtype_bytes(cfg.param_dtype), k) *
                    (uint64_t)o.steps;
    T_CHECK(size == 1 || st.comm_bytes == want, "%s: comm_bytes %llu, the formula gives %llu", what,
            (unsigned long long)st.comm_bytes, (unsigned long long)want);
    T_CHECK(st.rank == rank && st.world_size == size, "%s: stats say rank %d of %d", what, st.rank, st.world_size);
    check_memory(what, stage, &cfg, &o, &st, k);
    free(w);
    free(ref);
}

int main(void)
{
    static const variant none = {"", plain};
    t_world w = t_world_open();
    world = w.comm;
    rank = w.rank;
    size = w.size;
    seed = w.seed;
    for (int stage = 0; stage <= 3; stage++) {
        for (size_t p = 0; p < synth_placement_count; p++) {
            strata_config probe = synth_config(STRATA_DTYPE_FP32);
            synth_placements[p].apply(&probe, "/tmp");
            if (probe.offload_param.device != STRATA_TIER_DEVICE && stage != 3)
                continue; /* parameters are only offloaded when they are partitioned */
            run_case(stage, &synth_placements[p], 1, &none);
        }
    }
    /* Gradient accumulation; and the features whose decisions are global or whose state is split. */
    run_case(2, &synth_placements[1], 2, &none);
    run_case(3, &synth_placements[3], 2, &none);
    static const variant features[] = {{"delayed update", delayed}, {"gradient clipping", clipped},
                                       {"fp16 with dynamic loss scaling", fp16}, {"swap checksums", checksummed}};
    for (size_t f = 0; f < sizeof features / sizeof features[0]; f++)
        for (int stage = 1; stage <= 3; stage += 2)
            run_case(stage, &synth_placements[3 - (stage == 1 ? 2 : 0)], 1, &features[f]);
    t_scratch_cleanup();
    strata_comm_destroy(world);
    return t_done();
}
