/*
 * Misuse of the engine API is an error with a message, never a crash: one case each, the message
 * checked. Budgets that cannot hold the plan fail at finalize with the numbers. A fetch order that
 * changes mid-training is re-recorded, and training stays correct.
 */
#include <math.h>

#include "synth.h"
#include "testlib.h"

static strata_status fill(void *ctx, strata_param_id p, size_t off, size_t n, float *out)
{
    (void)ctx;
    (void)p;
    for (size_t i = 0; i < n; i++)
        out[i] = (float)(off + i) * 1e-3f;
    return STRATA_OK;
}

static strata_config host_config(void)
{
    strata_config c;
    strata_config_init(&c);
    c.backend = STRATA_BACKEND_HOST;
    c.device_budget_bytes = 32u << 20;
    c.offload_optimizer.device = STRATA_TIER_HOST;
    c.offload_param.device = STRATA_TIER_HOST;
    return c;
}

static void test_misuse(void)
{
    strata_config c = host_config();
    strata_engine *e;
    T_OK(strata_engine_create(&c, &e));
    strata_module_id a, b, bad;
    strata_param_id pa, pb, badp;
    T_OK(strata_module_add(e, "attn", &a));
    T_OK(strata_module_add(e, "mlp", &b));
    T_STATUS(strata_module_add(e, "attn", &bad), STRATA_EINVAL);
    T_EQ_INT(bad, STRATA_INVALID_ID); /* out-params are reset on failure */
    T_EQ_STR(strata_last_error(e), "strata_module_add: a module named \"attn\" already exists (id 0)");
    T_STATUS(strata_param_add(e, a, "w", 0, NULL, NULL, &badp), STRATA_EINVAL);
    T_EQ_STR(strata_last_error(e), "strata_param_add(\"attn.w\"): numel is 0; a parameter needs at least one element");
    T_STATUS(strata_param_add(e, 7, "w", 4, NULL, NULL, &badp), STRATA_ESTATE);
    T_EQ_STR(strata_last_error(e), "strata_param_add: module id 7 is unknown (the engine has 2 modules, ids 0..1)");
    T_OK(strata_param_add(e, a, "w", 1000, fill, NULL, &pa));
    T_OK(strata_param_add(e, b, "w", 3000, fill, NULL, &pb));

    T_STATUS(strata_fetch(e, a), STRATA_ESTATE);
    T_EQ_STR(strata_last_error(e), "strata_fetch: the engine is not finalized yet; call strata_engine_finalize() "
                                   "after adding every module and parameter");
    T_OK(strata_engine_finalize(e));
    T_STATUS(strata_engine_finalize(e), STRATA_ESTATE);
    T_STATUS(strata_module_add(e, "late", &bad), STRATA_ESTATE);
    T_EQ_STR(strata_last_error(e), "strata_module_add(\"late\"): the engine is already finalized; add every module "
                                   "before strata_engine_finalize()");

    /* fetch an unknown module */
    T_STATUS(strata_fetch(e, 42), STRATA_ESTATE);
    T_EQ_STR(strata_last_error(e), "strata_fetch: module id 42 is unknown (the engine has 2 modules, ids 0..1)");
    /* parameters of a module that is not fetched */
    T_CHECK(strata_param_data(e, pa) == NULL, "param_data of an unfetched module is not NULL");
    T_EQ_STR(strata_last_error(e), "strata_param_data(\"attn.w\"): module \"attn\" is not fetched; call strata_fetch "
                                   "first");
    /* grads_ready without a backward fetch */
    T_STATUS(strata_grads_ready(e, a), STRATA_ESTATE);
    T_EQ_STR(strata_last_error(e), "strata_grads_ready(\"attn\"): the module is not fetched; fetch it for backward, "
                                   "write its gradients into strata_grad_data, then call strata_grads_ready");
    T_OK(strata_fetch(e, a));
    T_CHECK(strata_param_data(e, pa) != NULL, "param_data of a fetched module: %s", strata_last_error(e));
    T_STATUS(strata_fetch(e, a), STRATA_ESTATE);
    T_EQ_STR(strata_last_error(e), "strata_fetch(\"attn\"): the module is already held; release it before fetching "
                                   "it again");
    /* grads_ready of a fetched module that has no gradient buffers */
    T_STATUS(strata_grads_ready(e, a), STRATA_ESTATE);
    T_EQ_STR(strata_last_error(e), "strata_grads_ready(\"attn\"): the module has no gradient buffers this step; take "
                                   "them with strata_grad_data and write the gradients first");
    /* a step while a module is held */
    T_STATUS(strata_step(e, NULL, NULL), STRATA_ESTATE);
    T_EQ_STR(strata_last_error(e), "strata_step: module \"attn\" is still held; release every module before the "
                                   "optimizer step");
    T_OK(strata_release(e, a));
    /* double release */
    T_STATUS(strata_release(e, a), STRATA_ESTATE);
    T_EQ_STR(strata_last_error(e), "strata_release(\"attn\"): the module is not held (released twice, or never "
                                   "fetched)");
    /* the engine still works after every misuse */
    T_OK(strata_fetch(e, b));
    float *g = strata_grad_data(e, pb);
    T_CHECK(g != NULL, "grad_data: %s", strata_last_error(e));
    if (g)
        for (int i = 0; i < 3000; i++)
            g[i] = 1.0f;
    T_OK(strata_grads_ready(e, b));
    T_OK(strata_release(e, b));
    strata_step_result r;
    strata_step_args bad_lr = {.lr = -1e-3};
    T_STATUS(strata_step(e, &bad_lr, &r), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(e), "lr = -0.001; a learning rate is finite and >= 0");
    bad_lr.lr = NAN;
    T_STATUS(strata_step(e, &bad_lr, &r), STRATA_EINVAL);
    T_OK(strata_step(e, NULL, &r)); /* the refused steps changed nothing: this is step 1 */
    T_EQ_INT(r.step, 1);
    float w0;
    T_OK(strata_param_read_master(e, pb, 0, 1, &w0));
    T_CHECK(w0 < 0, "the weight with a positive gradient did not decrease: %g", (double)w0);
    T_STATUS(strata_param_read_master(e, pb, 2999, 2, &w0), STRATA_EINVAL);
    strata_engine_destroy(e);
}

static void test_budgets(void)
{
    /* Everything on a device too small for the parameters. */
    strata_config c = host_config();
    c.offload_param.device = STRATA_TIER_DEVICE;
    c.device_budget_bytes = 1u << 20;
    strata_engine *e;
    T_OK(strata_engine_create(&c, &e));
    strata_module_id m;
    strata_param_id p;
    T_OK(strata_module_add(e, "big", &m));
    T_OK(strata_param_add(e, m, "w", 300000, NULL, NULL, &p));
    T_STATUS(strata_engine_finalize(e), STRATA_EBUDGET);
    T_EQ_STR(strata_last_error(e),
             "device budget exceeded: the plan needs 2.31 MiB (parameters 1.16 MiB, gradient buffers of one module "
             "1.16 MiB) but strata.device_budget_bytes allows 1.00 MiB; raise strata.device_budget_bytes, or set "
             "zero_optimization.offload_param.device to \"cpu\" or \"nvme\"");
    strata_engine_destroy(e);

    /* A host budget too small for the optimizer state. */
    c = host_config();
    c.host_budget_bytes = 4u << 20;
    T_OK(strata_engine_create(&c, &e));
    T_OK(strata_module_add(e, "big", &m));
    T_OK(strata_param_add(e, m, "w", 1u << 20, NULL, NULL, &p));
    T_STATUS(strata_engine_finalize(e), STRATA_EBUDGET);
    T_CONTAINS(strata_last_error(e), "host budget exceeded: the plan needs ");
    T_CONTAINS(strata_last_error(e), "master weights + Adam moments (fp32) 12.00 MiB");
    T_CONTAINS(strata_last_error(e), "but strata.host_budget_bytes allows 4.00 MiB; raise strata.host_budget_bytes");
    strata_engine_destroy(e);
}

static int warnings;
static void count_warnings(strata_log_level level, const char *sub, const char *msg, void *user)
{
    (void)user;
    if (level == STRATA_LOG_WARN && strcmp(sub, "sched") == 0 && strstr(msg, "fetch order diverged"))
        warnings++;
}

static void test_divergence(void)
{
    synth_opts o;
    synth_defaults(&o, t_rand_u64());
    o.steps = 6;
    strata_config c = host_config();
    c.device_budget_bytes = 64u << 20;
    c.prefetch_bytes = 64u << 10;
    float *plain = NULL, *diverged = NULL;
    size_t n1 = 0, n2 = 0;
    strata_stats s1, s2;
    T_OK(synth_train(&o, &c, &plain, &n1, NULL, &s1));
    o.diverge_at_step = 3;
    strata_log_set_callback(count_warnings, NULL);
    T_OK(synth_train(&o, &c, &diverged, &n2, NULL, &s2));
    strata_log_set_callback(NULL, NULL);
    T_EQ_INT(warnings, 1);
    T_EQ_INT(n1, n2);
    if (plain && diverged && n1 == n2)
        T_CHECK(memcmp(plain, diverged, n1 * 4) == 0, "a divergent fetch order changed the trained weights");
    /* The order was re-recorded: later steps prefetch again. */
    T_CHECK(s2.prefetch_hits > s2.fetches / 2, "after re-recording only %llu of %llu fetches were prefetched",
            (unsigned long long)s2.prefetch_hits, (unsigned long long)s2.fetches);
    free(plain);
    free(diverged);
}

int main(void)
{
    t_rng_seed();
    test_misuse();
    test_budgets();
    test_divergence();
    return t_done();
}
