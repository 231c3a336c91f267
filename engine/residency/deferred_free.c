/* Device buffers freed once the stream that last uses them is past; see deferred_free.h. */
#include "engine/residency/deferred_free.h"

#include <stdlib.h>

#include "base/error.h"

typedef struct deferred_entry {
    void *ptr;
    dev_event *after;
} deferred_entry;

struct deferred_frees {
    device *dev;
    deferred_entry *list;
    size_t n, cap;
};

strata_status deferred_create(device *dev, deferred_frees **out)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return err_set(STRATA_ENOMEM, "out of memory for the deferred-free list");
    (*out)->dev = dev;
    return STRATA_OK;
}

void deferred_destroy(deferred_frees *d)
{
    if (!d)
        return;
    deferred_process(d, true);
    free(d->list);
    free(d);
}

strata_status deferred_add(deferred_frees *d, void *ptr, dev_stream *after_stream)
{
    if (d->n == d->cap) {
        size_t ncap = d->cap ? d->cap * 2 : 32;
        deferred_entry *n = realloc(d->list, ncap * sizeof *n);
        if (!n)
            return err_set(STRATA_ENOMEM, "out of memory for the deferred-free list");
        d->list = n;
        d->cap = ncap;
    }
    deferred_entry *f = &d->list[d->n];
    f->ptr = ptr;
    ERR_CHECK(dev_event_create(d->dev, &f->after));
    strata_status st = dev_event_record(f->after, after_stream);
    if (st != STRATA_OK) {
        dev_event_destroy(f->after);
        return st;
    }
    d->n++;
    return STRATA_OK;
}

void deferred_free_after(deferred_frees *d, void *ptr, dev_stream *after_stream)
{
    if (deferred_add(d, ptr, after_stream) == STRATA_OK)
        return;
    dev_stream_sync(after_stream);
    dev_free(d->dev, ptr);
}

strata_status deferred_process(deferred_frees *d, bool wait)
{
    strata_status first = STRATA_OK;
    size_t kept = 0;
    for (size_t i = 0; i < d->n; i++) {
        deferred_entry *f = &d->list[i];
        bool done = true;
        strata_status st = wait ? dev_event_sync(f->after) : dev_event_query(f->after, &done);
        if (st != STRATA_OK && first == STRATA_OK)
            first = st; /* the copy failed: the buffer is still ours to free */
        if (!done && st == STRATA_OK) {
            d->list[kept++] = *f;
            continue;
        }
        dev_free(d->dev, f->ptr);
        dev_event_destroy(f->after);
    }
    d->n = kept;
    return first;
}

size_t deferred_pending(const deferred_frees *d)
{
    return d->n;
}
