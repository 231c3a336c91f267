/* The delayed update's optimizer thread; see opt_thread.h. */
#include "engine/step/opt_thread.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/latch.h"
#include "base/log.h"
#include "engine/engine.h"
#include "engine/step/step.h"

/* The delayed update runs beside the trainer and must not slow its critical path: it takes the CPU time the
 * trainer leaves. Linux keeps nice values per thread, and the OpenMP team this thread starts inherits it. */
#define OPT_THREAD_NICE 10

struct opt_thread {
    strata_engine *e;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cv;
    bool job_pending, job_done, job_in_flight, quit;
    step_job job;
    err_latch job_failed;          /* the job's failure, until the next job (or a restore) */
    strata_step_result job_result;
};

static void *opt_main(void *arg)
{
    opt_thread *t = arg;
    if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), OPT_THREAD_NICE) != 0)
        LOG_INFO(LOG_ADAM, "the delayed-update thread keeps the trainer's priority (setpriority: %s)", strerror(errno));
    adam_cores_use(node_adam_cores(t->e->node)); /* the teams this thread starts run on this rank's cores */
    pthread_mutex_lock(&t->lock);
    for (;;) {
        while (!t->job_pending && !t->quit)
            pthread_cond_wait(&t->cv, &t->lock);
        if (t->quit && !t->job_pending)
            break;
        t->job_pending = false;
        step_job job = t->job;
        pthread_mutex_unlock(&t->lock);

        strata_step_result r;
        err_clear();
        strata_status st = step_run(t->e, &job, &r);
        err_latch_set_last(&t->job_failed, st);

        pthread_mutex_lock(&t->lock);
        t->job_result = r;
        t->job_done = true;
        pthread_cond_broadcast(&t->cv);
    }
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

strata_status opt_thread_start(strata_engine *e, opt_thread **out)
{
    opt_thread *t = calloc(1, sizeof *t);
    if (!t)
        return err_set(STRATA_ENOMEM, "cannot start the optimizer thread: out of memory");
    t->e = e;
    err_latch_init(&t->job_failed);
    pthread_mutex_init(&t->lock, NULL);
    pthread_cond_init(&t->cv, NULL);
    int rc = pthread_create(&t->thread, NULL, opt_main, t);
    if (rc != 0) {
        err_latch_destroy(&t->job_failed);
        pthread_mutex_destroy(&t->lock);
        pthread_cond_destroy(&t->cv);
        free(t);
        char why[96];
        return err_set(STRATA_ENOMEM, "cannot start the optimizer thread: %s", err_errno_str(rc, why, sizeof why));
    }
    *out = t;
    return STRATA_OK;
}

void opt_job_submit(opt_thread *t, const step_job *job)
{
    err_latch_take_copy(&t->job_failed, NULL, 0); /* the last job's failure was reported by its join */
    pthread_mutex_lock(&t->lock);
    t->job = *job;
    t->job_done = false;
    t->job_pending = true;
    t->job_in_flight = true;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->lock);
}

/* Waits for the job in flight, if any; `take` ends it (opt_job_join), otherwise it stays for the next join. */
static strata_status wait_job(opt_thread *t, strata_step_result *res, bool *had_job, bool take)
{
    *had_job = false;
    if (!t)
        return STRATA_OK;
    pthread_mutex_lock(&t->lock);
    if (!t->job_in_flight) {
        pthread_mutex_unlock(&t->lock);
        return STRATA_OK;
    }
    while (!t->job_done)
        pthread_cond_wait(&t->cv, &t->lock);
    if (take)
        t->job_in_flight = false;
    *res = t->job_result;
    pthread_mutex_unlock(&t->lock);
    *had_job = true;
    return err_latch_raise(&t->job_failed, "delayed optimizer step");
}

strata_status opt_job_join(opt_thread *t, strata_step_result *res, bool *had_job)
{
    return wait_job(t, res, had_job, true);
}

strata_status opt_job_settle(opt_thread *t, strata_step_result *res, bool *pending)
{
    return wait_job(t, res, pending, false);
}

void opt_job_restore(opt_thread *t, const strata_step_result *res)
{
    if (!t)
        return;
    err_latch_take_copy(&t->job_failed, NULL, 0); /* the restored update did not fail */
    pthread_mutex_lock(&t->lock);
    t->job_pending = false;
    t->job_done = true;
    t->job_in_flight = true;
    t->job_result = *res;
    pthread_mutex_unlock(&t->lock);
}

void opt_thread_stop(opt_thread *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->lock);
    t->quit = true;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->lock);
    pthread_join(t->thread, NULL);
    err_latch_destroy(&t->job_failed);
    pthread_mutex_destroy(&t->lock);
    pthread_cond_destroy(&t->cv);
    free(t);
}
