/*
 * A failed strata_engine_finalize leaves nothing half-built and can be called again: an init callback that
 * fails once (late in finalize, after the streams, the NVMe swap space, the pinned pool and the gradient store
 * exist) makes finalize fail with the callback's message; the next finalize succeeds, and training from there
 * gives bit-identical weights to an engine whose first finalize succeeded (the oracle). A budget failure (early,
 * in the plan) repeats with the same message. Under AddressSanitizer the unwinding is also checked for leaks.
 */
#include <stdlib.h>
#include <string.h>

#include "synth.h"
#include "testlib.h"

#define MODULES 3
#define PARAMS_PER_MODULE 2

typedef struct init_ctx {
    uint64_t seed;
    int fail_left;              /* calls that fail before the init succeeds */
} init_ctx;

static const size_t sizes[PARAMS_PER_MODULE] = {5000, 300};

static float value(uint64_t seed, strata_param_id id, size_t i)
{
    uint64_t z = seed ^ ((uint64_t)id << 40) ^ (i * 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull;
    return (float)((double)(z >> 40) / (double)(1ull << 24) - 0.5);
}

static strata_status init(void *ctx, strata_param_id id, size_t offset, size_t count, float *out)
{
    init_ctx *c = ctx;
    /* The last module's parameters: finalize is past every allocation when it gets here. */
    if (id >= (MODULES - 1) * PARAMS_PER_MODULE && c->fail_left > 0) {
        c->fail_left--;
        return STRATA_EIO;
    }
    for (size_t i = 0; i < count; i++)
        out[i] = value(c->seed, id, offset + i);
    return STRATA_OK;
}

static strata_engine *build(const strata_config *cfg, init_ctx *ctx)
{
    strata_engine *e = NULL;
    T_OK(strata_engine_create(cfg, &e));
    if (!e)
        return NULL;
    for (int m = 0; m < MODULES; m++) {
        char name[16];
        snprintf(name, sizeof name, "m%d", m);
        strata_module_id mid;
        T_OK(strata_module_add(e, name, &mid));
        for (int p = 0; p < PARAMS_PER_MODULE; p++) {
            strata_param_id pid;
            T_OK(strata_param_add(e, mid, p ? "b" : "w", sizes[p], init, ctx, &pid));
        }
    }
    return e;
}

/* Two steps with gradients drawn from seed; returns every parameter's master weights (malloc'd). */
static float *train(strata_engine *e, uint64_t seed, size_t *n)
{
    size_t total = MODULES * (sizes[0] + sizes[1]);
    float *w = calloc(total, sizeof *w);
    for (int step = 0; step < 2; step++) {
        for (strata_module_id m = 0; m < MODULES; m++) {
            T_OK(strata_fetch(e, m));
            for (int p = 0; p < PARAMS_PER_MODULE; p++) {
                strata_param_id id = m * PARAMS_PER_MODULE + (strata_param_id)p;
                float *g = strata_grad_data(e, id);
                T_CHECK(g != NULL, "strata_grad_data(%u): %s", id, strata_last_error(e));
                for (size_t i = 0; g && i < sizes[p]; i++)
                    g[i] = value(seed + (uint64_t)step + 1, id, i);
            }
            T_OK(strata_grads_ready(e, m));
            T_OK(strata_release(e, m));
        }
        T_OK(strata_step(e, NULL, NULL));
    }
    size_t pos = 0;
    for (strata_param_id id = 0; id < MODULES * PARAMS_PER_MODULE; id++) {
        T_OK(strata_param_read_master(e, id, 0, sizes[id % PARAMS_PER_MODULE], w + pos));
        pos += sizes[id % PARAMS_PER_MODULE];
    }
    *n = pos;
    return w;
}

static void retry_after_init_failure(const char *label, strata_config cfg)
{
    uint64_t seed = t_rand_u64();
    init_ctx good = {.seed = seed}, flaky = {.seed = seed, .fail_left = 1};
    strata_engine *ref = build(&cfg, &good), *e = build(&cfg, &flaky);
    if (!ref || !e)
        goto out;
    T_OK(strata_engine_finalize(ref));

    T_STATUS(strata_engine_finalize(e), STRATA_EIO);
    T_CONTAINS(strata_last_error(e), "init of parameter \"m2.");
    /* Not finalized: the calls that need a finalized engine say so. */
    T_STATUS(strata_fetch(e, 0), STRATA_ESTATE);
    T_CONTAINS(strata_last_error(e), "not finalized");
    T_OK(strata_engine_finalize(e));

    size_t n_ref = 0, n = 0;
    float *w_ref = train(ref, seed, &n_ref), *w = train(e, seed, &n);
    T_EQ_INT(n, n_ref);
    size_t first, diffs = synth_count_diff(w_ref, w, n, &first);
    T_CHECK(diffs == 0, "%s: %zu of %zu weights differ after a retried finalize; first at %zu: %.9g vs %.9g", label,
            diffs, n, first, first < n ? (double)w_ref[first] : 0.0, first < n ? (double)w[first] : 0.0);
    /* The steps moved the weights away from their initial values, or "identical" proves little. */
    size_t moved = 0;
    for (size_t i = 0; i < sizes[0]; i++)
        moved += w[i] != value(seed, 0, i);
    T_CHECK(moved > sizes[0] / 2, "%s: only %zu of %zu weights of m0.w moved (e.g. %.9g, initially %.9g)", label,
            moved, sizes[0], (double)w[0], (double)value(seed, 0, 0));
    free(w_ref);
    free(w);
out:
    strata_engine_destroy(ref);
    strata_engine_destroy(e);
}

static void budget_failure_repeats(void)
{
    strata_config cfg = synth_config(STRATA_DTYPE_FP32);
    cfg.device_budget_bytes = 64 << 10; /* far below the parameters */
    init_ctx ctx = {.seed = t_rand_u64()};
    strata_engine *e = build(&cfg, &ctx);
    if (!e)
        return;
    T_STATUS(strata_engine_finalize(e), STRATA_EBUDGET);
    char first[1024];
    snprintf(first, sizeof first, "%s", strata_last_error(e));
    T_CONTAINS(first, "device budget exceeded");
    T_STATUS(strata_engine_finalize(e), STRATA_EBUDGET);
    T_EQ_STR(strata_last_error(e), first);
    strata_engine_destroy(e);
}

int main(void)
{
    t_rng_seed();
    const char *dir = t_scratch_dir("t_engine_finalize_retry");

    retry_after_init_failure("all on the device tier", synth_config(STRATA_DTYPE_FP32));

    strata_config nvme = synth_config(STRATA_DTYPE_FP32);
    synth_use_nvme(&nvme, dir, true, true);
    retry_after_init_failure("everything on NVMe", nvme);

    strata_config delayed = synth_config(STRATA_DTYPE_FP32);
    synth_use_nvme(&delayed, dir, false, true);
    delayed.delayed_update = true;
    delayed.delayed_warmup_steps = 0;
    retry_after_init_failure("delayed update, optimizer on NVMe", delayed);
    T_EQ_INT(t_dir_entries(dir), 0); /* swap files are private: nothing left behind by the failed finalize */

    budget_failure_repeats();
    return t_done();
}
