/*
 * Device buffers that become free once the device has passed them: a module's device copy after the
 * trainer's compute stream is done with it, a gradient buffer after its copy off the device. Each entry
 * waits on an event recorded on the stream that last uses the buffer; engine calls poll the list (or wait
 * on it when they need the memory). Private to deferred_free.c.
 */
#ifndef STRATA_ENGINE_DEFERRED_FREE_H
#define STRATA_ENGINE_DEFERRED_FREE_H

#include <stdbool.h>

#include "gpu/device.h"

typedef struct deferred_frees deferred_frees;

strata_status deferred_create(device *dev, deferred_frees **out);
/* Waits for every entry, frees it, then the list. NULL is a no-op. */
void deferred_destroy(deferred_frees *d);

/* Frees ptr (device memory) once after_stream has passed this point. On failure nothing was queued and
 * the buffer is still the caller's (dev_free_after_sync frees it the slow way). */
strata_status deferred_add(deferred_frees *d, void *ptr, dev_stream *after_stream);
/* Frees ptr once after_stream has passed this point; if that cannot be queued, waits for the stream and
 * frees it now. */
void deferred_free_after(deferred_frees *d, void *ptr, dev_stream *after_stream);
/* Frees the entries whose streams are past (wait: all of them, waiting). Returns the first failure of a
 * stream an entry waited on; its buffer is freed all the same. */
strata_status deferred_process(deferred_frees *d, bool wait);
/* Entries still waiting. */
size_t deferred_pending(const deferred_frees *d);

#endif
