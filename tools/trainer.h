/*
 * The training loop of `strata train`: builds an engine from a config as one rank of a world, registers the GPT
 * model, and runs steps of grad_accum micro-batches per rank with a warmup + cosine learning rate (every optimizer
 * parameter group's: train_groups.h), a live progress
 * line, a JSONL log, periodic checkpoints (DIR/step-N, the last `keep` kept) and a summary. In a world of N ranks,
 * rank r's micro-batch m of a step is the data stream's micro-batch m * N + r, and the engine sums the ranks'
 * gradients: N ranks with grad_accum k train as one rank with N * k. World 1: SIGINT/SIGTERM finish the current
 * step, save when a save directory is set, and stop; with more ranks a signal ends the rank at once (the ranks could
 * not agree on the step to stop after, and there is no checkpoint to save). The ordinary schedule runs one
 * micro-batch at a time through all modules; the layer-wise one runs a rank's grad_accum micro-batches through each
 * module before the next is fetched (gpt_pass.h): the same weights bit for bit, grad_accum times fewer fetches,
 * grad_accum times the activations.
 */
#ifndef STRATA_MODEL_TRAINER_H
#define STRATA_MODEL_TRAINER_H

#include <stdbool.h>
#include <stdint.h>

#include "model/data.h"
#include "model/gpt.h"
#include "tools/decay_recipe.h"

typedef struct trainer_opts {
    gpt_dims dims;
    int batch, grad_accum, seq;
    bool layerwise;            /* --schedule layerwise: the step's micro-batches pass each module together */
    gpt_act_mode act_mode;     /* --activation-checkpointing, --offload-activations */
    int64_t steps;
    double lr, min_lr;         /* peak and final learning rate */
    int64_t warmup;            /* steps of linear warmup */
    decay_recipe decay;        /* the weight decay and which parameters it applies to (settled) */
    uint64_t seed;
    const gpt_data *data;
    strata_comm *comm;         /* the world this process trains in (strata_comm_create) */
    const char *log_jsonl;     /* NULL = none; in a world of ranks rank 0 writes it, rank r > 0 log_jsonl.rank<r> */
    const char *dump_weights;  /* raw fp32 master weights at the end; NULL = none */
    const char *save_dir;      /* checkpoints DIR/step-N; NULL = none */
    int64_t save_every;        /* 0 = only at the end (and on a signal) */
    int keep;                  /* checkpoints kept in save_dir (directories without a manifest are never removed) */
    const char *resume_dir;    /* a checkpoint, or a directory holding them (the latest is taken); NULL = fresh */
    const char *init_from;     /* safetensors weights to start from (model/gpt_weights.h); NULL = --seed's */
    bool quiet;                /* no progress line */
} trainer_opts;

/* Micro-batches that go through the modules together: grad_accum for the layer-wise schedule, else 1. */
int trainer_pass_micro_batches(const trainer_opts *o);

/* The learning rate of step s (0-based): linear warmup to lr, then cosine down to min_lr at the last step. */
double trainer_lr(const trainer_opts *o, int64_t s);

/* Trains with cfg (its activation_bytes is raised to what the model needs) as this process's rank of o->comm.
 * Errors are printed to stderr (train_err). Returns the process exit code: 0 done, 1 failed (also when training
 * went well but the trace, the log or the weights file was not written, on any rank, or a save found the disk full
 * and training went on, train_saves.h), 2 a file the user named cannot be opened (or the --save root is unusable or
 * held by another run), 128 + the signal when SIGINT/SIGTERM stopped it. *world_done is set when every rank got
 * through the run and agreed on the exit code: there is no rank left to tell of a failure (strata_comm_abort). */
int trainer_run(const trainer_opts *o, strata_config *cfg, bool *world_done);

#endif
