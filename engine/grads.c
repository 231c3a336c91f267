/*
 * Gradients: the device buffers the trainer writes during backward, and their hand-off. A module's
 * gradients are copied off the device on the d2h stream into pinned staging, then a host function
 * in the same stream order accumulates them (fp32) into the gradient store — host memory, or NVMe
 * (read, add, write) when the optimizer state lives there. The device buffer is freed once the
 * copy is done. Accumulation failures are kept and reported by the next engine call.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/util.h"
#include "engine/engine.h"
#include "offload/accum.h"

static void record_failure(strata_engine *e, strata_status st, const char *msg)
{
    pthread_mutex_lock(&e->grad_lock);
    if (e->grad_status == STRATA_OK) {
        e->grad_status = st;
        snprintf(e->grad_msg, sizeof e->grad_msg, "%s", msg);
    }
    pthread_mutex_unlock(&e->grad_lock);
}

/* Runs on the d2h stream after the copy into job->staging. */
static strata_status accumulate(void *arg)
{
    grad_job *job = arg;
    strata_engine *e = job->engine;
    eng_module *m = job->module;
    tier_array *store = job->store;
    strata_status st = STRATA_OK;
    float *host = tarr_host_ptr(store, &e->env, m->offset);
    if (host) {
        accum_add(host, job->staging, e->cfg.param_dtype, m->numel, job->first);
    } else {
        /* NVMe store: read-add-write through a pinned fp32 buffer. */
        float *buf = NULL;
        io_wait w;
        io_wait_init(&w);
        st = pool_acquire(e->pool, POOL_ACCUM, m->numel * 4, "gradient accumulation", (void **)&buf);
        if (st == STRATA_OK && !job->first) {
            st = tarr_read(store, &e->env, m->offset, m->numel, buf, &w);
            if (st == STRATA_OK)
                st = io_wait_wait(&w);
            atomic_fetch_add(&e->ctr.nvme_to_host, m->numel * 4);
        }
        if (st == STRATA_OK) {
            accum_add(buf, job->staging, e->cfg.param_dtype, m->numel, job->first);
            st = tarr_write(store, &e->env, m->offset, m->numel, buf, &w);
            if (st == STRATA_OK)
                st = io_wait_wait(&w);
            atomic_fetch_add(&e->ctr.host_to_nvme, m->numel * 4);
        }
        pool_release(e->pool, buf);
        io_wait_destroy(&w);
    }
    if (st != STRATA_OK) {
        char msg[ERR_MSG_BYTES];
        snprintf(msg, sizeof msg, "gradients of module \"%s\": %s", m->name, err_last());
        record_failure(e, st, msg);
    }
    trace_event(e->trace, TRACK_D2H, "gradients", m->name, job->submit_ns, now_ns());
    pool_release(e->pool, job->staging);
    free(job);
    return st;
}

/* Waits for every hand-off and reports the first failure since the last call. */
strata_status grads_drain(strata_engine *e)
{
    strata_status st = dev_stream_sync(e->d2h);
    pthread_mutex_lock(&e->grad_lock);
    strata_status gst = e->grad_status;
    char msg[ERR_MSG_BYTES];
    snprintf(msg, sizeof msg, "%s", e->grad_msg);
    e->grad_status = STRATA_OK;
    pthread_mutex_unlock(&e->grad_lock);
    if (gst != STRATA_OK)
        return err_set(gst, "%s", msg);
    return st;
}

STRATA_API void *strata_grad_data(strata_engine *e, strata_param_id param)
{
    if (!e)
        return NULL;
    eng_param *p = engine_held_param(e, param, "strata_grad_data");
    if (!p) {
        err_copy(&e->err, err_last_status());
        return NULL;
    }
    eng_module *m = &e->modules[p->module];
    strata_status st;
    if (!m->grad_dev) {
        size_t bytes = m->numel * e->param_bytes;
        while ((st = dev_alloc(e->dev, bytes, &m->grad_dev)) == STRATA_EBUDGET) {
            /* Buffers of earlier hand-offs may still be waiting for their copies. */
            if (e->nfrees == 0)
                break;
            engine_process_frees(e, true);
        }
        /* Zeroed in the compute stream's order, before the trainer's backward writes it. */
        if (st == STRATA_OK)
            st = dev_memset_async(e->compute, m->grad_dev, 0, bytes);
        if (st != STRATA_OK) {
            if (m->grad_dev)
                dev_free(e->dev, m->grad_dev);
            m->grad_dev = NULL;
            err_copy(&e->err, st);
            return NULL;
        }
    }
    return (char *)m->grad_dev + (p->offset - m->offset) * e->param_bytes;
}

static strata_status grads_ready(strata_engine *e, strata_module_id id)
{
    ERR_CHECK(engine_require_finalized(e, "strata_grads_ready"));
    eng_module *m = engine_module(e, id, "strata_grads_ready");
    if (!m)
        return STRATA_ESTATE;
    if (!m->held)
        return err_set(STRATA_ESTATE, "strata_grads_ready(\"%s\"): the module is not fetched; fetch it for backward, "
                       "write its gradients into strata_grad_data, then call strata_grads_ready", m->name);
    if (!m->grad_dev)
        return err_set(STRATA_ESTATE, "strata_grads_ready(\"%s\"): the module has no gradient buffers this step; "
                       "take them with strata_grad_data and write the gradients first", m->name);
    size_t bytes = m->numel * e->param_bytes;
    grad_job *job = calloc(1, sizeof *job);
    if (!job)
        return err_set(STRATA_ENOMEM, "strata_grads_ready: out of memory");
    strata_status st = pool_acquire(e->pool, POOL_GRAD, bytes, "gradient staging", &job->staging);
    if (st == STRATA_EBUDGET) {
        /* Earlier hand-offs hold the staging: wait for them, then try again. */
        err_clear();
        st = grads_drain(e);
        if (st == STRATA_OK)
            st = pool_acquire(e->pool, POOL_GRAD, bytes, "gradient staging", &job->staging);
    }
    if (st != STRATA_OK) {
        free(job);
        return st;
    }
    job->engine = e;
    job->module = m;
    job->store = &e->grad[e->grad_front];
    job->first = !e->grad_touched[e->grad_front][id];
    job->submit_ns = now_ns();
    /* The copy off the device waits for the trainer's backward kernels on the compute stream. */
    st = dev_event_record(m->grads_written, e->compute);
    if (st == STRATA_OK)
        st = dev_stream_wait_event(e->d2h, m->grads_written);
    if (st == STRATA_OK)
        st = dev_memcpy_async(e->d2h, job->staging, m->grad_dev, bytes);
    if (st == STRATA_OK)
        st = dev_host_fn(e->d2h, accumulate, job);
    if (st != STRATA_OK) {
        /* Nothing was queued that owns the job: undo. */
        dev_stream_sync(e->d2h);
        pool_release(e->pool, job->staging);
        free(job);
        return st;
    }
    e->grad_touched[e->grad_front][id] = 1;
    atomic_fetch_add(&e->ctr.device_to_host, bytes);
    void *buf = m->grad_dev;
    m->grad_dev = NULL;
    return engine_defer_free(e, buf, false, e->d2h);
}

STRATA_API strata_status strata_grads_ready(strata_engine *e, strata_module_id module)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_grads_ready: engine is NULL");
    return err_copy(&e->err, grads_ready(e, module));
}
