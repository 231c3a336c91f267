/*
 * Every fetch from NVMe delivers exactly the bytes of its module, however its read is split:
 * parameters striped over two paths in 4 KiB blocks (so each read is many requests that complete
 * while later ones are still being queued), fetched again and again with prefetching and eviction.
 * The oracle is the init function: the fp32 parameters must read back bit for bit.
 * This caught a race (about 1 run in 12 at 60 rounds) where a fetch's device copy could start once the
 * first parts of its read had landed but before the last part was queued.
 */
#include <sys/stat.h>

#include "testlib.h"

#define MODULES 6

static float value(size_t module, size_t i)
{
    return (float)(module * 1000003u + i) * 0x1p-20f;
}

static strata_status init(void *ctx, strata_param_id p, size_t off, size_t n, float *out)
{
    size_t module = (size_t)(uintptr_t)ctx;
    (void)p;
    for (size_t i = 0; i < n; i++)
        out[i] = value(module, off + i);
    return STRATA_OK;
}

int main(void)
{
    t_rng_seed();
    const char *root = t_scratch_dir("t_engine_fetch_stress");
    char a[STRATA_PATH_BYTES], b[STRATA_PATH_BYTES];
    snprintf(a, sizeof a, "%s/a", root);
    snprintf(b, sizeof b, "%s/b", root);
    mkdir(a, 0700);
    mkdir(b, 0700);
    strata_config c;
    strata_config_init(&c);
    c.backend = STRATA_BACKEND_HOST;
    c.offload_param.device = STRATA_TIER_NVME;
    c.offload_optimizer.device = STRATA_TIER_HOST;
    snprintf(c.offload_param.nvme_path[0], STRATA_PATH_BYTES, "%s", a);
    snprintf(c.offload_param.nvme_path[1], STRATA_PATH_BYTES, "%s", b);
    c.offload_param.nvme_path_count = 2;
    c.aio.block_size = 4096;
    c.aio.queue_depth = 4;
    c.device_budget_bytes = 16u << 20;
    c.weight_decay = 0; /* steps without gradients must leave the parameters as they were */
    size_t numel[MODULES];
    strata_engine *e;
    T_OK(strata_engine_create(&c, &e));
    strata_module_id m[MODULES];
    strata_param_id p[MODULES];
    for (size_t i = 0; i < MODULES; i++) {
        char name[16];
        snprintf(name, sizeof name, "m%zu", i);
        numel[i] = t_rand_range(20000, 120000);
        T_OK(strata_module_add(e, name, &m[i]));
        T_OK(strata_param_add(e, m[i], "w", numel[i], init, (void *)(uintptr_t)i, &p[i]));
    }
    T_OK(strata_engine_finalize(e));
    size_t bad = 0, checked = 0;
    for (int round = 0; round < 150 && t_failures == 0; round++) {
        for (size_t k = 0; k < MODULES; k++) {
            size_t i = k; /* one order: the prefetcher keeps several reads in flight */
            T_OK(strata_fetch(e, m[i]));
            const float *w = strata_param_data(e, p[i]);
            for (size_t j = 0; w && j < numel[i]; j++, checked++)
                if (memcmp(&w[j], &(float){value(i, j)}, 4) != 0 && bad++ == 0)
                    t_fail(__FILE__, __LINE__, "round %d, module %zu, element %zu: got %.9g, expected %.9g", round, i,
                           j, (double)w[j], (double)value(i, j));
            T_OK(strata_release(e, m[i]));
        }
        T_OK(strata_step(e, NULL, NULL)); /* no gradients: nothing changes, but fetches start over */
    }
    T_CHECK(bad == 0, "%zu of %zu fetched elements were wrong", bad, checked);
    strata_engine_destroy(e);
    return t_done();
}
