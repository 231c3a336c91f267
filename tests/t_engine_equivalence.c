/*
 * The strongest property of the engine: where state lives must not change what is computed.
 * The synthetic trainer runs the same seed with everything on the device tier, with the optimizer
 * on the host, with parameters and optimizer on NVMe, and with a device budget so small that every
 * module is fetched from NVMe every time; all must end with bit-identical master weights.
 * Repeated for bf16 parameters, with gradient clipping, and with a declared order.
 */
#include <math.h>

#include "synth.h"
#include "testlib.h"

static const char *nvme_dir;

static strata_config base_config(strata_dtype dtype)
{
    strata_config c;
    strata_config_init(&c);
    c.backend = STRATA_BACKEND_HOST;
    c.device_budget_bytes = 64u << 20;
    c.host_budget_bytes = 1u << 30;
    c.param_dtype = dtype;
    c.sub_group_size = 12288; /* several sub-groups, so the pipeline really pipelines */
    c.cpu_threads = 2;
    c.lr = 1e-2f;
    c.weight_decay = 0.05f;
    c.aio.block_size = 64 << 10;
    return c;
}

static void use_nvme(strata_offload_config *o)
{
    o->device = STRATA_TIER_NVME;
    snprintf(o->nvme_path[0], STRATA_PATH_BYTES, "%s", nvme_dir);
    o->nvme_path_count = 1;
}

typedef struct placement {
    const char *name;
    void (*apply)(strata_config *c);
} placement;

static void all_device(strata_config *c) { (void)c; }
static void opt_host(strata_config *c) { c->offload_optimizer.device = STRATA_TIER_HOST; }
static void param_host(strata_config *c)
{
    c->offload_optimizer.device = STRATA_TIER_HOST;
    c->offload_param.device = STRATA_TIER_HOST;
}
static void all_nvme(strata_config *c)
{
    use_nvme(&c->offload_optimizer);
    use_nvme(&c->offload_param);
}
static void nvme_tiny_budget(strata_config *c)
{
    all_nvme(c);
    /* Room for two of the largest module (80*48 + 48 elements, padded to 4096-element blocks) and
     * one gradient buffer: nothing can stay resident, nothing is prefetched. */
    size_t big = 8192 * (c->param_dtype == STRATA_DTYPE_FP32 ? 4 : 2);
    c->prefetch_bytes = 1;
    c->max_live_bytes = 2 * big;
    c->device_budget_bytes = 3 * big;
}

static const placement placements[] = {
    {"all on the device tier", all_device},
    {"optimizer on host", opt_host},
    {"parameters and optimizer on host", param_host},
    {"parameters and optimizer on NVMe", all_nvme},
    {"NVMe with a device budget of two modules", nvme_tiny_budget},
};

static void compare(const char *what, const float *a, const float *b, size_t n)
{
    size_t diffs = 0, first = n;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], 4) != 0) {
            if (first == n)
                first = i;
            diffs++;
        }
    T_CHECK(diffs == 0, "%s: %zu of %zu weights differ; first at %zu: %.9g vs %.9g", what, diffs, n, first,
            first < n ? (double)a[first] : 0.0, first < n ? (double)b[first] : 0.0);
}

static void run_family(const char *label, strata_dtype dtype, double clip, bool declare)
{
    synth_opts o;
    synth_defaults(&o, t_rand_u64());
    o.declare_order = declare;
    float *ref = NULL;
    size_t nref = 0;
    strata_stats st_tiny = {0};
    for (size_t p = 0; p < sizeof placements / sizeof placements[0]; p++) {
        strata_config c = base_config(dtype);
        c.gradient_clipping = clip;
        placements[p].apply(&c);
        float *w = NULL;
        size_t n = 0;
        strata_stats stats;
        strata_status st = synth_train(&o, &c, &w, &n, NULL, &stats);
        T_CHECK(st == STRATA_OK, "%s / %s: training failed: %s", label, placements[p].name, strata_status_name(st));
        if (st != STRATA_OK)
            continue;
        if (p == sizeof placements / sizeof placements[0] - 1)
            st_tiny = stats;
        if (!ref) {
            ref = w;
            nref = n;
            /* The weights must have moved, or "identical" proves nothing. */
            size_t moved = 0;
            for (size_t i = 0; i < n; i++)
                moved += fabsf(w[i] - synth_init_value(o.seed, 0, 0)) > 0; /* cheap sanity */
            T_CHECK(moved > n / 2, "%s: weights did not train", label);
            continue;
        }
        char what[160];
        snprintf(what, sizeof what, "%s: %s vs %s", label, placements[p].name, placements[0].name);
        T_EQ_INT(n, nref);
        compare(what, ref, w, n < nref ? n : nref);
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
    run_family("fp32", STRATA_DTYPE_FP32, 0, false);
    run_family("bf16", STRATA_DTYPE_BF16, 0, false);
    run_family("fp32 clipped, declared order", STRATA_DTYPE_FP32, 0.05, true);
    return t_done();
}
