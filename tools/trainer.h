/*
 * The training loop of `strata train`: builds an engine from a config, registers the GPT model, and runs
 * steps of grad_accum micro-batches with a warmup + cosine learning rate, a live progress line, a JSONL log,
 * periodic checkpoints (DIR/step-N, the last `keep` kept) and a summary. SIGINT/SIGTERM finish the current
 * step, save when a save directory is set, and stop.
 */
#ifndef STRATA_MODEL_TRAINER_H
#define STRATA_MODEL_TRAINER_H

#include <stdbool.h>
#include <stdint.h>

#include "model/data.h"
#include "model/gpt.h"

typedef struct trainer_opts {
    gpt_dims dims;
    int batch, grad_accum, seq;
    int64_t steps;
    double lr, min_lr;         /* peak and final learning rate */
    int64_t warmup;            /* steps of linear warmup */
    uint64_t seed;
    const gpt_data *data;
    const char *log_jsonl;     /* NULL = none */
    const char *dump_weights;  /* raw fp32 master weights at the end; NULL = none */
    const char *save_dir;      /* checkpoints DIR/step-N; NULL = none */
    int64_t save_every;        /* 0 = only at the end (and on a signal) */
    int keep;                  /* checkpoints kept in save_dir (directories without a manifest are never removed) */
    const char *resume_dir;    /* a checkpoint, or a directory holding them (the latest is taken); NULL = fresh */
    bool quiet;                /* no progress line */
} trainer_opts;

/* The learning rate of step s (0-based): linear warmup to lr, then cosine down to min_lr at the last step. */
double trainer_lr(const trainer_opts *o, int64_t s);

/* Trains with cfg (its activation_bytes is raised to what the model needs). Errors are printed to stderr.
 * Returns the process exit code: 0 done, 1 failed, 128 + the signal when SIGINT/SIGTERM stopped it. */
int trainer_run(const trainer_opts *o, strata_config *cfg);

#endif
