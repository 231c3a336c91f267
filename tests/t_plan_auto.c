/*
 * Offload device "auto" picks the documented placement (engine/plan/plan_auto.h) for a table of budgets: the
 * fastest that fits, a class the config fixes stays fixed, NVMe only with an nvme_path, parameters on the
 * device below ZeRO stage 3, the optimizer state on the device only where the backend allows it; the plan it
 * returns fits; when nothing fits the error says auto tried them all and what the closest one needs.
 * Then the engine: training with "auto" gives bit-identical weights to training with the placement it chose,
 * named explicitly, and strata_engine_placement reports that placement and why.
 */
#include <string.h>

#include "base/error.h"
#include "engine/plan/plan_auto.h"
#include "synth.h"
#include "testlib.h"

#define MIB ((size_t)1 << 20)
#define D STRATA_TIER_DEVICE
#define H STRATA_TIER_HOST
#define N STRATA_TIER_NVME
#define A STRATA_TIER_AUTO
#define FAILS ((strata_tier)-1)

/* One million bf16 parameters in modules of 64 Ki elements, sub-groups of 64 Ki, a 1 MiB prefetch window. What
 * each placement needs, in MiB (device / host; with the optimizer on NVMe, host with the gradient store in host
 * memory / on NVMe):
 *   params device + optimizer device  14.125 / 4.5       params device + optimizer NVMe  2.125 / 7.5 or 4.75
 *   params device + optimizer host     2.125 / 16.5      params host + optimizer NVMe    1.375 / 9.25 or 6.5
 *   params host + optimizer host       1.375 / 18.25     params NVMe + optimizer NVMe    1.375 / 8.75 or 6.0 */
static plan_input shape(void)
{
    return (plan_input){.total_numel = (size_t)1 << 20, .largest_module_numel = (size_t)1 << 16, .param_bytes = 2,
                        .sub_group_numel = (size_t)1 << 16, .prefetch_bytes = MIB, .max_live_bytes = 4 * MIB,
                        .world_size = 1, .zero_stage = 3};
}

typedef struct row {
    double device_mib, host_mib;
    bool nvme_path, opt_on_device;
    int stage;
    strata_tier ask_param, ask_opt;
    strata_tier param, opt, grad; /* param FAILS: no placement fits (or none may be tried) */
    const char *says;             /* in the reason, or in the error */
} row;

static const row rows[] = {
    {64, 64, true, true, 3, A, A, D, D, H, "the fastest placement auto tries"},
    {64, 64, true, false, 3, A, A, D, H, H, "runs on the CPU"},
    {8, 64, true, true, 3, A, A, D, H, H, "parameters device + optimizer device: needs 14.12 MiB of device memory"},
    {2, 64, true, true, 3, A, A, H, H, H, "parameters device + optimizer host: needs 2.12 MiB of device memory"},
    {8, 17, true, true, 3, A, A, D, H, H, "budget 8.00 MiB"},
    {8, 16, true, true, 3, A, A, D, N, H, "parameters host + optimizer host: needs 18.25 MiB of host memory"},
    {8, 16, false, true, 3, A, A, FAILS, D, D, "NVMe was not tried"},
    {2, 16, true, true, 3, A, A, H, N, H, "host cache mirrors"},
    {2, 8, true, true, 3, A, A, H, N, N, "parameters device + optimizer nvme: needs 2.12 MiB of device memory"},
    {2, 6.25, true, true, 3, A, A, N, N, N, "parameters host + optimizer nvme: needs 6.50 MiB of host memory"},
    {2, 5, true, true, 3, A, A, FAILS, D, D, "tried every placement and none fits"},
    {8, 5, true, true, 3, A, A, D, N, N, "parameters host + optimizer host"},
    {2, 64, true, true, 2, A, A, FAILS, D, D, "parameters leave the device only at ZeRO stage 3"},
    {8, 16, true, true, 2, A, A, D, N, H, "parameters device + optimizer host: needs 16.50 MiB of host memory"},
    {8, 64, true, true, 3, H, A, H, H, H, "parameters host + optimizer device: needs 13.38 MiB of device memory"},
    {16, 64, true, true, 3, H, A, H, D, H, "the fastest placement auto tries"},
    {8, 64, true, true, 3, A, N, D, N, H, "the fastest placement auto tries"},
    {2, 64, true, true, 3, H, H, H, H, H, ""},
    {64, 64, true, false, 3, A, D, FAILS, D, D, "optimizer runs on the CPU"},
};

static void check_row(size_t i, const row *r)
{
    strata_config cfg;
    strata_config_init(&cfg);
    cfg.zero_stage = r->stage;
    cfg.offload_param.device = r->ask_param;
    cfg.offload_optimizer.device = r->ask_opt;
    if (r->nvme_path)
        synth_nvme_path(&cfg, "/unused/by/the/arithmetic", true, true);
    plan_input in = shape();
    in.zero_stage = r->stage;
    size_t dev = (size_t)(r->device_mib * (double)MIB), host = (size_t)(r->host_mib * (double)MIB);
    plan p;
    plan_placement pl;
    strata_status st = plan_place(&cfg, r->opt_on_device, &in, dev, host, &pl, &p);
    printf("row %zu: device %g MiB, host %g MiB, nvme_path %s, stage %d, asked %s/%s -> %s: %s/%s/%s\n   %s\n", i,
           r->device_mib, r->host_mib, r->nvme_path ? "yes" : "no", r->stage, strata_tier_name(r->ask_param),
           strata_tier_name(r->ask_opt), strata_status_name(st), strata_tier_name(pl.param_tier),
           strata_tier_name(pl.opt_tier), strata_tier_name(pl.grad_tier), st == STRATA_OK ? pl.reason : err_last());
    if (r->param == FAILS) {
        T_CHECK(st != STRATA_OK, "row %zu: placed %s/%s, expected no placement to fit", i,
                strata_tier_name(pl.param_tier), strata_tier_name(pl.opt_tier));
        T_CHECK(strstr(err_last(), r->says) != NULL, "row %zu: the error does not say \"%s\": %s", i, r->says,
                err_last());
        T_CHECK(!pl.placed, "row %zu: a failed placement is marked placed", i);
        return;
    }
    T_CHECK(st == STRATA_OK, "row %zu: %s: %s", i, strata_status_name(st), err_last());
    if (st != STRATA_OK)
        return;
    T_EQ_STR(strata_tier_name(pl.param_tier), strata_tier_name(r->param));
    T_EQ_STR(strata_tier_name(pl.opt_tier), strata_tier_name(r->opt));
    T_EQ_STR(strata_tier_name(pl.grad_tier), strata_tier_name(r->grad));
    T_CHECK(in.param_tier == pl.param_tier && in.opt_tier == pl.opt_tier && in.grad_tier == pl.grad_tier,
            "row %zu: plan_input holds %s/%s/%s, the placement %s/%s/%s", i, strata_tier_name(in.param_tier),
            strata_tier_name(in.opt_tier), strata_tier_name(in.grad_tier), strata_tier_name(pl.param_tier),
            strata_tier_name(pl.opt_tier), strata_tier_name(pl.grad_tier));
    T_CHECK(plan_check(&p, &in, dev, host) == STRATA_OK, "row %zu: the chosen plan does not fit: %s", i, err_last());
    bool is_auto = r->ask_param == A || r->ask_opt == A;
    if (!is_auto)
        T_EQ_STR(pl.reason, "");
    else
        T_CHECK(strncmp(pl.reason, "auto: ", 6) == 0 && strstr(pl.reason, r->says),
                "row %zu: the reason does not start with \"auto: \" and say \"%s\": %s", i, r->says, pl.reason);
}

/* The chosen tiers of an engine with cfg, and why. */
static bool placement_of(const synth_opts *o, const strata_config *cfg, strata_tier t[3], char *why, size_t len)
{
    strata_engine *e = NULL;
    strata_status st = synth_engine(o, cfg, &e);
    T_CHECK(st == STRATA_OK, "synth_engine with auto: %s: %s", strata_status_name(st), strata_last_error(e));
    if (st == STRATA_OK)
        T_OK(strata_engine_placement(e, &t[0], &t[1], &t[2], why, len));
    strata_engine_destroy(e);
    return st == STRATA_OK;
}

typedef struct engine_row {
    size_t device_bytes, host_bytes;
    strata_tier param, opt, grad;
} engine_row;

/* The synthetic model in fp32: eight modules of 128 x 128 + 128 elements, padded to 20480 (80 KiB), 640 KiB of
 * parameters; a residency cap of two modules and sub-groups of 4096 elements. Parameters on the device need 720 KiB
 * there, off it 240 KiB; on the host (KiB, with the gradient store in host memory / on NVMe):
 *   params device + optimizer host  2752       params device + optimizer NVMe  1024 / 528
 *   params host + optimizer host    3360       params host + optimizer NVMe    1632 / 1136
 *                                              params NVMe + optimizer NVMe   ~1184 / 688 */
static void check_engine(const char *nvme_dir)
{
    const size_t K = 1024;
    const engine_row erows[] = {
        {4 * MIB, 64 * MIB, D, D, H},
        {1 * MIB, 64 * MIB, D, H, H},
        {256 * K, 64 * MIB, H, H, H},
        {1 * MIB, 1536 * K, D, N, H},
        {256 * K, 1536 * K, H, N, N},
        {256 * K, 1 * MIB, N, N, N},
    };
    synth_opts o;
    synth_defaults(&o, t_rand_u64());
    o.layers = 8;
    for (int l = 0; l <= o.layers; l++)
        o.width[l] = 128;
    for (size_t i = 0; i < sizeof erows / sizeof erows[0]; i++) {
        const engine_row *r = &erows[i];
        strata_config c = synth_config(STRATA_DTYPE_FP32);
        c.device_budget_bytes = r->device_bytes;
        c.host_budget_bytes = r->host_bytes;
        c.sub_group_size = 4096;
        c.prefetch_bytes = 1;
        c.max_live_bytes = 2 * 20480 * 4;
        synth_offload(&c, STRATA_TIER_AUTO, nvme_dir, true, true);
        strata_tier t[3];
        char why[1024];
        if (!placement_of(&o, &c, t, why, sizeof why))
            continue;
        printf("engine row %zu: device %zu KiB, host %zu KiB -> %s/%s/%s\n   %s\n", i, r->device_bytes / K,
               r->host_bytes / K, strata_tier_name(t[0]), strata_tier_name(t[1]), strata_tier_name(t[2]), why);
        T_EQ_STR(strata_tier_name(t[0]), strata_tier_name(r->param));
        T_EQ_STR(strata_tier_name(t[1]), strata_tier_name(r->opt));
        T_EQ_STR(strata_tier_name(t[2]), strata_tier_name(r->grad));
        T_CHECK(strncmp(why, "auto: ", 6) == 0, "engine row %zu: the reason is \"%s\"", i, why);

        float *wa = NULL, *we = NULL;
        size_t na = 0, ne = 0;
        T_OK(synth_train(&o, &c, &wa, &na, NULL, NULL));
        strata_config explicit_cfg = c;
        explicit_cfg.offload_param.device = t[0];
        explicit_cfg.offload_optimizer.device = t[1];
        T_OK(synth_train(&o, &explicit_cfg, &we, &ne, NULL, NULL));
        strata_tier te[3];
        char why_explicit[1024];
        if (placement_of(&o, &explicit_cfg, te, why_explicit, sizeof why_explicit)) {
            T_CHECK(te[0] == t[0] && te[1] == t[1] && te[2] == t[2], "engine row %zu: explicit placement %s/%s/%s",
                    i, strata_tier_name(te[0]), strata_tier_name(te[1]), strata_tier_name(te[2]));
            T_EQ_STR(why_explicit, "");
        }
        if (wa && we) {
            T_EQ_INT(na, ne);
            size_t first, diffs = synth_count_diff(wa, we, na < ne ? na : ne, &first);
            T_CHECK(diffs == 0, "engine row %zu: auto vs explicit %s/%s: %zu of %zu weights differ; first at %zu", i,
                    strata_tier_name(t[0]), strata_tier_name(t[1]), diffs, na, first);
            printf("engine row %zu: auto and explicit %s/%s trained to the same %zu weights (%zu differ)\n", i,
                   strata_tier_name(t[0]), strata_tier_name(t[1]), na, diffs);
        }
        free(wa);
        free(we);
    }

    /* Nothing fits: finalize says so, with the closest placement's numbers, and the engine can be finalized again. */
    strata_config c = synth_config(STRATA_DTYPE_FP32);
    c.device_budget_bytes = 256 * K;
    c.host_budget_bytes = 256 * K;
    c.offload_param.device = c.offload_optimizer.device = STRATA_TIER_AUTO;
    strata_engine *e = NULL;
    strata_module_id m;
    strata_param_id w;
    T_OK(strata_engine_create(&c, &e));
    T_OK(strata_module_add(e, "big", &m));
    T_OK(strata_param_add(e, m, "w", 1 << 20, NULL, NULL, &w));
    for (int attempt = 0; attempt < 2; attempt++) {
        T_STATUS(strata_engine_finalize(e), STRATA_EBUDGET);
        T_CONTAINS(strata_last_error(e), "offload device \"auto\" tried every placement and none fits (NVMe was "
                                         "not tried");
        T_CONTAINS(strata_last_error(e), "budget exceeded: the plan needs");
    }
    printf("nothing fits: %s\n", strata_last_error(e));
    strata_engine_destroy(e);
    e = NULL;

    /* Below ZeRO stage 3 "auto" is a valid choice for the parameters: it keeps them on the device. */
    c = synth_config(STRATA_DTYPE_FP32);
    c.zero_stage = 2;
    c.offload_param.device = STRATA_TIER_AUTO;
    char err[512];
    T_OK(strata_config_validate(&c, err, sizeof err));
    c.offload_param.device = STRATA_TIER_HOST;
    T_STATUS(strata_config_validate(&c, err, sizeof err), STRATA_ECONFIG);
    T_CONTAINS(err, "zero_optimization.offload_param needs zero_optimization.stage = 3");

    /* Before finalize there is no placement to report. */
    c = synth_config(STRATA_DTYPE_FP32);
    T_OK(strata_engine_create(&c, &e));
    strata_tier t;
    T_STATUS(strata_engine_placement(e, &t, NULL, NULL, NULL, 0), STRATA_ESTATE);
    T_CONTAINS(strata_last_error(e), "not finalized");
    strata_engine_destroy(e);
}

int main(void)
{
    t_rng_seed();
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        check_row(i, &rows[i]);
    check_engine(t_scratch_dir("t_plan_auto"));
    return t_done();
}
