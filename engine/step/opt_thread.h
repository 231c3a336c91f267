/*
 * The optimizer thread of the delayed update (ZeRO-Offload's one-step delay): strata_step hands it the
 * step of iteration i and returns; the trainer computes iteration i+1 with the parameters of i-1 while
 * Adam writes the second parameter copy. The next strata_step joins the job before anything else touches
 * the optimizer state. Private to opt_thread.c; a NULL thread (no delayed update) has never a job.
 */
#ifndef STRATA_ENGINE_OPT_THREAD_H
#define STRATA_ENGINE_OPT_THREAD_H

#include <stdbool.h>

#include "engine/step/step.h"
#include "strata.h"

typedef struct opt_thread opt_thread;
struct strata_engine;

strata_status opt_thread_start(struct strata_engine *e, opt_thread **out);
/* Lets the job in flight finish, stops the thread and frees it. NULL is a no-op. */
void opt_thread_stop(opt_thread *t);

void opt_job_submit(opt_thread *t, const step_job *job);
/* Waits for the job in flight (if any); its result goes to res, its failure to the thread's error. */
strata_status opt_job_join(opt_thread *t, strata_step_result *res, bool *had_job);
/* Waits for the job in flight (if any) without taking it: it stays for the next opt_job_join, which
 * publishes it (a checkpoint must not make an update visible early). *pending says whether there was one. */
strata_status opt_job_settle(opt_thread *t, strata_step_result *res, bool *pending);
/* Makes a finished job with result res wait for the next opt_job_join, as if it had just run (strata_load). */
void opt_job_restore(opt_thread *t, const strata_step_result *res);

#endif
