/* Engine lifetime through the public API: backend choice, config rejected with its message, NULL handling. */
#include "gpu/device.h"
#include "testlib.h"

int main(void)
{
    strata_config cfg;
    strata_config_init(&cfg);
    cfg.backend = STRATA_BACKEND_HOST;
    cfg.device_budget_bytes = 64u << 20;
    strata_engine *e = (strata_engine *)&cfg; /* must be reset to NULL on failure */

    T_OK(strata_engine_create(&cfg, &e));
    T_CHECK(e != NULL, "engine is NULL after success");
    T_EQ_INT(strata_engine_backend(e), STRATA_BACKEND_HOST);
    T_EQ_STR(strata_last_error(e), "");
    strata_engine_destroy(e);
    strata_engine_destroy(NULL);

    /* AUTO resolves to a real backend, and the one dev_probe says is usable. */
    cfg.backend = STRATA_BACKEND_AUTO;
    T_OK(strata_engine_create(&cfg, &e));
    char detail[512];
    strata_backend_kind want = dev_probe(STRATA_BACKEND_CUDA, detail, sizeof detail) == STRATA_OK
                                   ? STRATA_BACKEND_CUDA : STRATA_BACKEND_HOST;
    T_EQ_INT(strata_engine_backend(e), want);
    strata_engine_destroy(e);

    /* Forcing CUDA where it cannot run fails with the reason and leaves *out NULL. */
    if (want == STRATA_BACKEND_HOST) {
        cfg.backend = STRATA_BACKEND_CUDA;
        e = (strata_engine *)&cfg;
        strata_status st = strata_engine_create(&cfg, &e);
        T_CHECK(st == STRATA_EDEVICE || st == STRATA_EUNSUPPORTED, "forced cuda without a GPU gave %s",
                strata_status_name(st));
        T_CHECK(e == NULL, "out not reset on failure");
        T_CONTAINS(strata_last_error(NULL), "cuda");
        cfg.backend = STRATA_BACKEND_HOST;
    }

    /* An invalid config is refused with the same message the loader would give. */
    cfg.aio.queue_depth = 5000;
    e = (strata_engine *)&cfg;
    T_STATUS(strata_engine_create(&cfg, &e), STRATA_ECONFIG);
    T_CHECK(e == NULL, "out not reset on failure");
    T_EQ_STR(strata_last_error(NULL), "config: aio.queue_depth = 5000 is out of range [1, 1024]");
    cfg.aio.queue_depth = 32;

    T_STATUS(strata_engine_create(NULL, &e), STRATA_EINVAL);
    T_STATUS(strata_engine_create(&cfg, NULL), STRATA_EINVAL);
    T_EQ_STR(strata_status_str(STRATA_EIO), "I/O error");
    T_EQ_STR(strata_status_name(STRATA_EBUDGET), "STRATA_EBUDGET");
    T_EQ_STR(strata_status_str((strata_status)999), "unknown status");
    T_EQ_STR(strata_version(), "0.1.0");
    T_EQ_INT(STRATA_VERSION_CODE, 100);
    return t_done();
}
