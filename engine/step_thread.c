/*
 * The optimizer thread of the delayed update (ZeRO-Offload's one-step delay): strata_step hands it
 * the step of iteration i and returns; the trainer computes iteration i+1 with the parameters of i-1
 * while Adam writes the second parameter copy. The next strata_step joins the job before anything
 * else touches the optimizer state.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/log.h"
#include "engine/engine.h"

/* The delayed update runs beside the trainer and must not slow its critical path: it takes the CPU time the
 * trainer leaves. Linux keeps nice values per thread, and the OpenMP team this thread starts inherits it. */
#define OPT_THREAD_NICE 10

static void *opt_main(void *arg)
{
    strata_engine *e = arg;
    if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), OPT_THREAD_NICE) != 0)
        LOG_INFO(LOG_ADAM, "the delayed-update thread keeps the trainer's priority (setpriority: %s)", strerror(errno));
    pthread_mutex_lock(&e->opt_lock);
    for (;;) {
        while (!e->opt_job_pending && !e->opt_quit)
            pthread_cond_wait(&e->opt_cv, &e->opt_lock);
        if (e->opt_quit && !e->opt_job_pending)
            break;
        e->opt_job_pending = false;
        double lr = e->opt_job_lr, scale = e->opt_job_scale;
        int g = e->opt_job_grad, p = e->opt_job_param;
        pthread_mutex_unlock(&e->opt_lock);

        strata_step_result r;
        err_clear();
        strata_status st = step_run(e, lr, scale, g, p, &r);

        pthread_mutex_lock(&e->opt_lock);
        e->opt_job_status = st;
        snprintf(e->opt_job_msg, sizeof e->opt_job_msg, "%s", st != STRATA_OK ? err_last() : "");
        e->opt_job_result = r;
        e->opt_job_done = true;
        pthread_cond_broadcast(&e->opt_cv);
    }
    pthread_mutex_unlock(&e->opt_lock);
    return NULL;
}

strata_status opt_thread_start(strata_engine *e)
{
    int rc = pthread_create(&e->opt_thread, NULL, opt_main, e);
    if (rc != 0) {
        char why[96];
        return err_set(STRATA_ENOMEM, "cannot start the optimizer thread: %s", err_errno_str(rc, why, sizeof why));
    }
    e->opt_thread_running = true;
    return STRATA_OK;
}

void opt_job_submit(strata_engine *e, double lr, double loss_scale, int grad_index, int param_out)
{
    pthread_mutex_lock(&e->opt_lock);
    e->opt_job_lr = lr;
    e->opt_job_scale = loss_scale;
    e->opt_job_grad = grad_index;
    e->opt_job_param = param_out;
    e->opt_job_done = false;
    e->opt_job_pending = true;
    e->opt_job_in_flight = true;
    pthread_cond_broadcast(&e->opt_cv);
    pthread_mutex_unlock(&e->opt_lock);
}

/* Waits for the job in flight, if any; `take` ends it (opt_job_join), otherwise it stays for the next join. */
static strata_status wait_job(strata_engine *e, strata_step_result *res, bool *had_job, bool take)
{
    *had_job = false;
    if (!e->opt_thread_running)
        return STRATA_OK;
    pthread_mutex_lock(&e->opt_lock);
    if (!e->opt_job_in_flight) {
        pthread_mutex_unlock(&e->opt_lock);
        return STRATA_OK;
    }
    while (!e->opt_job_done)
        pthread_cond_wait(&e->opt_cv, &e->opt_lock);
    if (take)
        e->opt_job_in_flight = false;
    strata_status st = e->opt_job_status;
    *res = e->opt_job_result;
    char msg[ERR_MSG_BYTES];
    snprintf(msg, sizeof msg, "%s", e->opt_job_msg);
    pthread_mutex_unlock(&e->opt_lock);
    *had_job = true;
    if (st != STRATA_OK)
        return err_set(st, "delayed optimizer step: %s", msg);
    return STRATA_OK;
}

strata_status opt_job_join(strata_engine *e, strata_step_result *res, bool *had_job)
{
    return wait_job(e, res, had_job, true);
}

strata_status opt_job_settle(strata_engine *e, strata_step_result *res, bool *pending)
{
    return wait_job(e, res, pending, false);
}

void opt_job_restore(strata_engine *e, const strata_step_result *res)
{
    pthread_mutex_lock(&e->opt_lock);
    e->opt_job_pending = false;
    e->opt_job_done = true;
    e->opt_job_in_flight = true;
    e->opt_job_status = STRATA_OK;
    e->opt_job_msg[0] = '\0';
    e->opt_job_result = *res;
    pthread_mutex_unlock(&e->opt_lock);
}

void opt_thread_stop(strata_engine *e)
{
    if (!e->opt_thread_running)
        return;
    pthread_mutex_lock(&e->opt_lock);
    e->opt_quit = true;
    pthread_cond_broadcast(&e->opt_cv);
    pthread_mutex_unlock(&e->opt_lock);
    pthread_join(e->opt_thread, NULL);
    e->opt_thread_running = false;
}
