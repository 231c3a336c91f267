/*
 * strata_step's driver: the fp16 loss scale, the delayed update's hand-offs and buffer swaps, and the
 * counts of steps. Private to train_step.c; a checkpoint saves and restores its progress.
 */
#ifndef STRATA_ENGINE_TRAIN_STEP_H
#define STRATA_ENGINE_TRAIN_STEP_H

#include <stdint.h>

#include "strata.h"

/* What a checkpoint keeps of the driver. */
typedef struct train_progress {
    int64_t iterations;            /* strata_step calls */
    uint64_t steps, skipped_steps; /* updates published / skipped on an fp16 overflow */
    double loss_scale;
    int good_steps, hysteresis_left;
} train_progress;

typedef struct step_driver step_driver;

/* The initial loss scale and hysteresis of cfg. */
strata_status driver_create(const strata_config *cfg, step_driver **out);
void driver_destroy(step_driver *d);

void driver_progress(const step_driver *d, train_progress *out);
void driver_restore(step_driver *d, const train_progress *p);
/* Time spent in strata_step. */
uint64_t driver_step_ns(const step_driver *d);

#endif
