/*
 * The pinned pool: one page-locked host region, reserved once at finalize and carved into the
 * swap and transfer buffers the engine needs (fetch staging, gradient staging, optimizer
 * sub-group buffers). Its size counts against the host budget, so pinned memory is bounded
 * (DeepSpeed users hit OOM from unbudgeted pinned buffers). It is registered once with the
 * device backend (it comes from dev_host_alloc) and, best effort, with io_uring as fixed buffers.
 */
#ifndef STRATA_OFFLOAD_POOL_H
#define STRATA_OFFLOAD_POOL_H

#include <stddef.h>

#include "gpu/device.h"
#include "nvme/io.h"

typedef struct pinned_pool pinned_pool;

/* The pool is split into one slice per consumer, each sized by the plan, so that consumers running
 * at the same time (the delayed optimizer step and the trainer's fetches and gradient hand-offs)
 * can never starve one another; each slice is carved on its own. */
typedef enum pool_part {
    POOL_FETCH = 0,  /* NVMe fetch staging */
    POOL_GRAD,       /* gradient staging (device -> host copies) */
    POOL_ACCUM,      /* the fp32 read-add-write buffer of an NVMe gradient store (one at a time) */
    POOL_STEP,       /* the optimizer's sub-group slots and updated-parameter staging */
    POOL_PARTS
} pool_part;

/* Reserves the slices (each rounded up to 4 KiB) of pinned memory from dev, NUMA-local to the GPU
 * when there is one. STRATA_ENOMEM names the size. */
strata_status pool_create(device *dev, nvme_io *io, const size_t part_bytes[POOL_PARTS], pinned_pool **out);

/* Frees the region. Every buffer must be back and no transfer in flight. NULL is a no-op. */
void pool_destroy(pinned_pool *p);

/* Carves a 4 KiB-aligned buffer from a slice. STRATA_EBUDGET with the slice's numbers when none fits
 * (callers that can wait for buffers in flight do so and retry). Thread-safe. */
strata_status pool_acquire(pinned_pool *p, pool_part part, size_t bytes, const char *what, void **out);

/* Gives a buffer back. NULL is a no-op. Thread-safe. */
void pool_release(pinned_pool *p, void *buf);

size_t pool_size(const pinned_pool *p);
size_t pool_peak(pinned_pool *p);

#endif
