/*
 * Buffers that become free once the device has passed them: a module's device copy after the
 * trainer's compute stream is done with it, a gradient buffer after its copy off the device. Each
 * entry waits on an event recorded on the stream that last uses the buffer; engine calls poll the
 * list (or wait on it when they need the memory).
 */
#include <stdlib.h>

#include "engine/engine.h"

strata_status engine_defer_free(strata_engine *e, void *ptr, bool pinned, dev_stream *after_stream)
{
    if (e->nfrees == e->frees_cap) {
        size_t ncap = e->frees_cap ? e->frees_cap * 2 : 32;
        deferred_free *n = realloc(e->frees, ncap * sizeof *n);
        if (!n)
            return err_set(STRATA_ENOMEM, "out of memory for the deferred-free list");
        e->frees = n;
        e->frees_cap = ncap;
    }
    deferred_free *f = &e->frees[e->nfrees];
    f->ptr = ptr;
    f->pinned = pinned;
    ERR_CHECK(dev_event_create(e->dev, &f->after));
    strata_status st = dev_event_record(f->after, after_stream);
    if (st != STRATA_OK) {
        dev_event_destroy(f->after);
        return st;
    }
    e->nfrees++;
    return STRATA_OK;
}

strata_status engine_process_frees(strata_engine *e, bool wait)
{
    strata_status first = STRATA_OK;
    size_t kept = 0;
    for (size_t i = 0; i < e->nfrees; i++) {
        deferred_free *f = &e->frees[i];
        bool done = true;
        strata_status st = wait ? dev_event_sync(f->after) : dev_event_query(f->after, &done);
        if (st != STRATA_OK && first == STRATA_OK)
            first = st; /* the copy failed: the buffer is still ours to free */
        if (!done && st == STRATA_OK) {
            e->frees[kept++] = *f;
            continue;
        }
        if (f->pinned)
            pool_release(e->pool, f->ptr);
        else
            dev_free(e->dev, f->ptr);
        dev_event_destroy(f->after);
    }
    e->nfrees = kept;
    return first;
}
