/*
 * What gpu/device.c (devices, memory) and gpu/stream.c (streams, events) share: the generic objects
 * that wrap a backend's own. Private to gpu/.
 */
#ifndef STRATA_GPU_DEVICE_INTERNAL_H
#define STRATA_GPU_DEVICE_INTERNAL_H

#include <pthread.h>

#include "base/latch.h"
#include "gpu/arena.h"
#include "gpu/device.h"

/* Pinned buffers and registrations the caller owns, kept so that misuse is caught and destroy frees them. */
typedef struct host_block host_block;
struct host_block {
    void *ptr;
    size_t bytes;
    bool registered; /* dev_host_register() rather than dev_host_alloc() */
    host_block *next;
};

struct dev_stream {
    device *dev;
    dev_impl_stream *impl;
    char name[32];
    bool wrapped; /* the caller's native stream: forgotten, not destroyed */
    dev_stream *prev, *next;
    /* Serialises enqueues so that sequence numbers follow queue order. */
    pthread_mutex_t lock;
    uint64_t seq;       /* items queued so far */
    /* The first failure of queued work, at its sequence number, kept until dev_stream_sync() reports
     * it. Apart from `lock`: a failing host function latches it on the backend's thread, while an
     * enqueue holding `lock` may be blocked inside CUDA until that very thread moves on. */
    err_latch err;
};

struct dev_event {
    device *dev;
    dev_impl_event *impl;
    dev_stream *stream; /* where it was last recorded; NULL once that stream is gone */
    uint64_t seq;       /* its position there */
    dev_event *prev, *next;
};

struct device {
    const dev_ops *ops;
    dev_impl *impl;
    char name[96];
    int ordinal; /* dev_options.device_id on CUDA, -1 on the host backend */
    bool poison;
    /* Guards the arena and every list below. */
    pthread_mutex_t lock;
    arena *arena;
    char *base;
    size_t budget;
    dev_stream *streams;
    dev_event *events;
    host_block *host_blocks;
    size_t pinned_bytes, registered_bytes;
};

#endif
