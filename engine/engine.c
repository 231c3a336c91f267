/* Engine lifetime: create (validate, choose a backend), destroy, last error. */
#include "engine/engine.h"

#include <stdlib.h>

#include "base/log.h"
#include "gpu/device.h"

/* Opens the device backend the config asks for; AUTO falls back to the host backend when no GPU answers. */
static strata_status open_device(strata_engine *e)
{
    dev_options opt = DEV_OPTIONS_INIT;
    opt.device_id = e->cfg.device_id;
    opt.budget_bytes = e->cfg.device_budget_bytes;
    ERR_CHECK(dev_create(e->cfg.backend, &opt, &e->dev));
    e->backend = dev_kind(e->dev);
    LOG_INFO(LOG_CORE, "engine on %s", dev_name(e->dev));
    return STRATA_OK;
}

STRATA_API strata_status strata_engine_create(const strata_config *cfg, strata_engine **out)
{
    if (!out)
        return err_set(STRATA_EINVAL, "strata_engine_create: out is NULL");
    *out = NULL;
    if (!cfg)
        return err_set(STRATA_EINVAL, "strata_engine_create: cfg is NULL; fill one with strata_config_init()");
    ERR_CHECK(strata_config_validate(cfg, NULL, 0));

    strata_engine *e = calloc(1, sizeof *e);
    if (!e)
        return err_set(STRATA_ENOMEM, "strata_engine_create: out of memory for the engine object");
    e->cfg = *cfg;
    pthread_mutex_init(&e->grad_lock, NULL);
    pthread_mutex_init(&e->fetch_lock, NULL);
    pthread_cond_init(&e->fetch_cv, NULL);
    pthread_mutex_init(&e->opt_lock, NULL);
    pthread_cond_init(&e->opt_cv, NULL);
    strata_status st = open_device(e);
    if (st == STRATA_OK && cfg->trace_path[0])
        st = trace_create(cfg->trace_path, &e->trace);
    if (st != STRATA_OK) {
        strata_engine_destroy(e);
        return st;
    }
    *out = e;
    return STRATA_OK;
}

/* Teardown in reverse order of acquisition. In-flight work is drained first: the optimizer
 * thread's job, gradient hand-offs, fetches, deferred frees. Also tears down a half-finalized engine. */
STRATA_API void strata_engine_destroy(strata_engine *e)
{
    if (!e)
        return;
    strata_step_result unused;
    bool had;
    opt_job_join(e, &unused, &had);
    opt_thread_stop(e);
    if (e->d2h)
        grads_drain(e);
    for (size_t i = 0; i < e->nmodules; i++) {
        eng_module *m = &e->modules[i];
        if (e->dev) {
            fetch_drop(e, m);
            if (m->grad_dev)
                dev_free(e->dev, m->grad_dev);
            dev_event_destroy(m->ready);
            dev_event_destroy(m->grads_written);
        }
        io_wait_destroy(&m->io);
        free(m->params);
    }
    if (e->dev)
        engine_process_frees(e, true); /* buffers dropped above wait for the compute stream */
    step_slots_free(e);
    tier_array *arrays[] = {&e->param[0], &e->param[1], &e->grad[0], &e->grad[1], &e->master, &e->exp_avg,
                            &e->exp_avg_sq};
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++)
        tarr_free(arrays[i], &e->env);
    pool_destroy(e->pool);
    swap_destroy(e->swap);
    nvme_io_destroy(e->io);
    dev_stream_destroy(e->h2d);
    dev_stream_destroy(e->d2h);
    dev_stream_destroy(e->copy);
    dev_stream_destroy(e->upd);
    dev_stream_destroy(e->compute);
    dev_destroy(e->dev);
    trace_finish(e->trace);
    free(e->grad_touched[0]);
    free(e->grad_touched[1]);
    free(e->modules);
    free(e->params);
    free(e->order);
    free(e->rec);
    free(e->frees);
    pthread_mutex_destroy(&e->grad_lock);
    pthread_mutex_destroy(&e->fetch_lock);
    pthread_cond_destroy(&e->fetch_cv);
    pthread_mutex_destroy(&e->opt_lock);
    pthread_cond_destroy(&e->opt_cv);
    free(e);
}

STRATA_API strata_backend_kind strata_engine_backend(const strata_engine *e)
{
    return e ? e->backend : STRATA_BACKEND_AUTO;
}

STRATA_API const char *strata_last_error(const strata_engine *e)
{
    return e ? e->err.msg : err_last();
}
