/*
 * Chrome trace-event JSON (open it in Perfetto or chrome://tracing): one track per stream and
 * thread, so the overlap of fetches, gradient hand-offs, NVMe I/O and Adam can be seen.
 * Events are kept in memory (a few dozen bytes each) and written by strata_trace_write or, failing that, when the
 * engine is destroyed, so recording costs a lock and a copy, never file I/O in the training loop.
 */
#ifndef STRATA_ENGINE_TRACE_H
#define STRATA_ENGINE_TRACE_H

#include <stdint.h>

#include "strata.h"

typedef struct trace trace;

typedef enum trace_track {
    TRACK_TRAINER = 0, /* the caller's thread: fetch stalls, steps */
    TRACK_H2D,         /* parameter fetches to the device */
    TRACK_D2H,         /* gradient hand-offs and accumulation */
    TRACK_OPTIMIZER,   /* CPU Adam per sub-group */
    TRACK_NVME,        /* NVMe reads and writes of the optimizer pipeline */
    TRACK_UPDATE,      /* updated parameters copied to the device */
    TRACK_DEVICE_ADAM, /* the optimizer's device share (offload_optimizer.ratio < 1) */
    TRACK_ACTIVATIONS, /* offloaded activations: copies off the device and restores (act_store.c) */
    TRACK_COUNT
} trace_track;

/* Creates a trace that will be written to path; the file is created now (so a bad path fails
 * early, with its name and errno). */
strata_status trace_create(const char *path, trace **out);

/* Records a complete event [t0_ns, t1_ns] (now_ns clock) named "name detail". Thread-safe.
 * NULL trace: no-op. */
void trace_event(trace *t, trace_track track, const char *name, const char *detail, uint64_t t0_ns, uint64_t t1_ns);

/* Writes the JSON now, with the events recorded so far, and closes the file; events recorded later are dropped.
 * STRATA_OK, or the write's error (STRATA_ENOSPC for a full disk, else STRATA_EIO) naming the file and errno, the
 * same for every later call. Thread-safe; NULL: STRATA_OK. (strata_trace_write) */
strata_status trace_write(trace *t);

/* Writes the JSON unless trace_write did, and frees the trace; NULL is a no-op. A failure here is logged as a
 * warning: the engine is going, with no caller left to tell. */
void trace_finish(trace *t);

#endif
