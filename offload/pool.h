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

/* Reserves bytes (rounded up to 4 KiB) of pinned memory from dev and registers it with io when
 * io is not NULL. STRATA_ENOMEM names the size. */
strata_status pool_create(device *dev, nvme_io *io, size_t bytes, pinned_pool **out);

/* Frees the region. Every buffer must be back and no transfer in flight. NULL is a no-op. */
void pool_destroy(pinned_pool *p);

/* Carves a 4 KiB-aligned buffer. STRATA_EBUDGET with the pool's numbers when none fits:
 * what means the engine under-planned, so the message asks for a report. Thread-safe. */
strata_status pool_acquire(pinned_pool *p, size_t bytes, const char *what, void **out);

/* Gives a buffer back. NULL is a no-op. Thread-safe. */
void pool_release(pinned_pool *p, void *buf);

size_t pool_size(const pinned_pool *p);
size_t pool_peak(pinned_pool *p);

#endif
