/*
 * The strongest property of the engine: where state lives must not change what is computed.
 * The synthetic trainer runs the same seed with everything on the device tier, with the optimizer
 * on the host, with parameters and optimizer on NVMe, and with a device budget so small that every
 * module is fetched from NVMe every time; all must end with bit-identical master weights.
 * Repeated for bf16 parameters, with gradient clipping, with a declared order, and with more optimizer
 * sub-groups than the step keeps in its pinned slots (the steps alternate direction and reuse what the
 * slots still hold: the cached and the re-read sub-groups must give the same bits).
 */
#include <string.h>

#include "synth.h"
#include "testlib.h"

static const char *nvme_dir;

/* The weights must have moved from where they started, element by element, or "identical" proves nothing:
 * the same training run with no step gives each element's initial value. Adam with weight decay moves every
 * weight whose gradient or value is not zero, so nearly all of them must change. */
static void check_trained(const char *label, const synth_opts *trained, const strata_config *c, const float *w,
                          size_t n)
{
    synth_opts o = *trained;
    o.steps = 0;
    float *init = NULL;
    size_t ninit = 0;
    T_OK(synth_train(&o, c, &init, &ninit, NULL, NULL));
    if (!init)
        return;
    T_EQ_INT(ninit, n);
    n = n < ninit ? n : ninit;
    size_t changed = 0, unchanged = n; /* the first element that did not move, if any */
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&w[i], &init[i], sizeof *w) != 0)
            changed++;
        else if (unchanged == n)
            unchanged = i;
    }
    size_t example = unchanged < n ? unchanged : 0;
    printf("%s: %zu of %zu weights changed from their initial values; element %zu: %.9g -> %.9g\n", label, changed,
           n, example, (double)init[example], (double)w[example]);
    T_CHECK(changed >= n - n / 100, "%s: weights did not train: only %zu of %zu changed from their initial values "
            "(at least 99%% must); element %zu: initial %.9g, trained %.9g", label, changed, n, example,
            (double)init[example], (double)w[example]);
    free(init);
}

static void run_family(const char *label, strata_dtype dtype, double clip, bool declare, bool many_sub_groups)
{
    synth_opts o;
    synth_defaults(&o, t_rand_u64());
    o.declare_order = declare;
    if (many_sub_groups) {
        /* 7 modules of one 4096-element block each, one sub-group per block: more than the 4 slots. */
        o.layers = 7;
        int w[] = {24, 80, 48, 64, 16, 40, 56, 8};
        memcpy(o.width, w, sizeof w);
        o.steps = 5;
    }
    float *ref = NULL;
    size_t nref = 0;
    strata_stats st_tiny = {0};
    for (size_t p = 0; p < synth_placement_count; p++) {
        strata_config c = synth_config(dtype);
        c.gradient_clipping = clip;
        if (many_sub_groups)
            c.sub_group_size = 4096;
        synth_placements[p].apply(&c, nvme_dir);
        float *w = NULL;
        size_t n = 0;
        strata_stats stats;
        strata_status st = synth_train(&o, &c, &w, &n, NULL, &stats);
        T_CHECK(st == STRATA_OK, "%s / %s: training failed: %s", label, synth_placements[p].name, strata_status_name(st));
        if (st != STRATA_OK)
            continue;
        if (p == synth_placement_count - 1)
            st_tiny = stats;
        if (!ref) {
            ref = w;
            nref = n;
            check_trained(label, &o, &c, w, n);
            continue;
        }
        T_EQ_INT(n, nref);
        size_t first, diffs = synth_count_diff(ref, w, n < nref ? n : nref, &first);
        T_CHECK(diffs == 0, "%s: %s vs %s: %zu of %zu weights differ; first at %zu: %.9g vs %.9g", label,
                synth_placements[p].name, synth_placements[0].name, diffs, n, first,
                first < n ? (double)ref[first] : 0.0, first < n ? (double)w[first] : 0.0);
        free(w);
    }
    /* With no room to keep anything, every fetch is a demand fetch from NVMe. */
    T_CHECK(st_tiny.nvme_to_host_bytes > 0, "%s: the tiny-budget run read nothing from NVMe", label);
    T_CHECK(st_tiny.prefetch_hits < st_tiny.fetches, "%s: tiny budget: %llu hits of %llu fetches", label,
            (unsigned long long)st_tiny.prefetch_hits, (unsigned long long)st_tiny.fetches);
    free(ref);
}

int main(void)
{
    t_rng_seed();
    nvme_dir = t_scratch_dir("t_engine_equivalence");
    run_family("fp32", STRATA_DTYPE_FP32, 0, false, false);
    run_family("bf16", STRATA_DTYPE_BF16, 0, false, false);
    run_family("fp32 clipped, declared order", STRATA_DTYPE_FP32, 0.05, true, false);
    run_family("fp32, 7 sub-groups", STRATA_DTYPE_FP32, 0, false, true);
    return t_done();
}
