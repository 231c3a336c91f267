/* What `strata train` shows while and after it trains: the live progress line (one updating line on a
 * terminal, plain lines otherwise), one JSON object per step in a log file, and the closing summary. In a world
 * of ranks, every rank logs its own steps and only rank 0 prints. */
#ifndef STRATA_MODEL_TRAIN_REPORT_H
#define STRATA_MODEL_TRAIN_REPORT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "strata.h"

typedef struct train_report {
    int64_t first_step, last_step, total_steps;
    int64_t tokens_per_step;
    double flops_per_token;              /* model FLOPs of forward + backward, for the TFLOPS figure; 0 = not shown */
    double first_loss, last_loss, tail_loss_sum;
    int tail_count;
    double wall_s, compute_s;            /* since the first step of this run; compute includes stalls */
    double startup_s;                    /* before the first step (the caller's): plan, allocation, initial state */
    double last_print_s;                 /* wall_s at the last progress line */
    strata_stats start, now;             /* stats at the first step of this run, and the latest */
    bool tty, quiet;
    bool speculating;                    /* step in backward with clipping: the summary counts the redone steps */
    int64_t print_every;
    FILE *jsonl;                         /* the --log-jsonl stream (the caller's), or NULL */
    const char *jsonl_path;
    char jsonl_error[512];               /* why the log could not be written; "" while it can */
} train_report;

void report_begin(train_report *r, int64_t first_step, int64_t total_steps, int64_t tokens_per_step,
                  const strata_stats *start, bool quiet, FILE *jsonl, const char *jsonl_path);
/* Records step `step` (0-based) and prints the progress line when due. A log line that cannot be written is
 * warned about (the file and strerror) once, in jsonl_error, and the log ends there. */
void report_step(train_report *r, int64_t step, double loss, double lr, double step_wall_s, double compute_s,
                 const strata_stats *now, const strata_step_result *res);
/* Closes the log (r->jsonl is NULL after); false, with a warning and jsonl_error set, when it was not all
 * written. */
bool report_close_log(train_report *r);

/* Ends the progress line and prints the summary to stdout: the trace at trace_path ("" = none) to open, or, with
 * trace_error, why it was not written; the log's failure, if any. */
void report_summary(train_report *r, const char *trace_path, const char *trace_error);

/* "1.23 GiB" style; buf of at least 32 bytes. */
const char *report_bytes(double bytes, char *buf, size_t len);

#endif
