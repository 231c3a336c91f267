/* `strata estimate`'s speed block: whether the CPU's Adam hides behind the GPU's compute. ZeRO-Offload's step runs
 * the model on the GPU and Adam on the host's cores; Adam's time is fixed by the elements in host memory, compute's
 * grows with the batch, so past some batch Adam costs nothing where a mode overlaps it with compute. The options
 * (--tflops, --adam-rate) are the two measured rates; the block prints the seconds of each and, for each way strata
 * orders the update, what it overlaps and the smallest batch at which that overlap holds all of Adam. */
#ifndef STRATA_TOOLS_ESTIMATE_SPEED_H
#define STRATA_TOOLS_ESTIMATE_SPEED_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "tools/options.h"

/* The CPU Adam's rate --adam-rate assumes: b_adam_moments' fp32 step on all 16 cores of the H200 machine measured
 * 5386 and 5634 million elements per second (benchmarks/RESULTS.md); the default rounds it down. */
#define ESTIMATE_ADAM_MELEM_S_DEFAULT 5000.0

typedef struct estimate_speed {
    bool active;         /* --tflops or --adam-rate was given: print the block */
    double tflops;       /* the GPU's achieved TFLOP/s per rank; 0 = not given (no compute, no batch) */
    double adam_melem_s; /* the CPU Adam's rate, million elements per second */
} estimate_speed;

#define ESTIMATE_SPEED_INIT {.adam_melem_s = ESTIMATE_ADAM_MELEM_S_DEFAULT}

#define ESTIMATE_SPEED_NOPTS 2
extern const cli_opt estimate_speed_opts[ESTIMATE_SPEED_NOPTS];
#define ESTIMATE_SPEED_GROUP(base)                                                                                  \
    {estimate_speed_opts, ESTIMATE_SPEED_NOPTS, (base), true, (base) + offsetof(estimate_speed, active),            \
     "Speed (the batch at which the CPU's Adam hides behind the GPU's compute):"}

/* One rank's step as the block sees it. */
typedef struct speed_step {
    double params;     /* N in 6·N flops per token: the model's parameters */
    double adam_numel; /* elements the CPU's Adam updates per step: this rank's optimizer state in host memory or on
                          NVMe, less Twin-Flow's device share */
    int seq;           /* tokens per sequence */
    int batch;         /* sequences per micro-batch (the batch asked about) */
    size_t tokens;     /* tokens per micro-batch when --tokens says so; 0 = batch x seq */
    int grad_accum;    /* micro-batches per optimizer step */
    bool recompute;    /* activation checkpointing: backward runs each block's forward again, 8 flops not 6 */
} speed_step;

/* The three orders of the update, as the block names them. */
enum { SPEED_PLAIN, SPEED_IN_BACKWARD, SPEED_DELAYED, SPEED_NMODES };

typedef struct speed_numbers {
    double flops_per_token;  /* 6·N, or 8·N with the recompute */
    double compute_s;        /* forward and backward of the step's micro-batches */
    double backward_share;   /* of compute: 4 of 6 flops, or 6 of 8 with the recompute */
    double adam_s;           /* adam_numel / rate */
    double step_s[SPEED_NMODES];  /* the step's seconds at the asked batch, each mode */
    long long hide_batch[SPEED_NMODES]; /* the smallest batch at which the mode's overlap is at least Adam */
} speed_numbers;

/* The numbers of step at s's rates; with no --tflops only adam_s is set. */
void estimate_speed_compute(const estimate_speed *s, const speed_step *step, speed_numbers *out);

/* Prints the block. on_gpu false (the host backend: the CPU runs the model too) prints why nothing overlaps instead. */
void estimate_speed_print(const estimate_speed *s, const speed_step *step, bool on_gpu);

/* The same numbers as a JSON object for --json (a new reference). */
json_t *estimate_speed_json(const estimate_speed *s, const speed_step *step, bool on_gpu);

#endif
