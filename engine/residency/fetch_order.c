/* The fetch order: declared, or recorded during a step; see fetch_order.h. */
#include "engine/residency/fetch_order.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "base/util.h"

struct fetch_order {
    strata_module_id *order;        /* the fetch order of one step (declared or recorded) */
    size_t len, cap;
    bool declared, valid, warned;
    size_t pos;                     /* this step's position in the order */
    strata_module_id *rec;          /* this step's fetches so far */
    size_t rec_len, rec_cap;
};

strata_status fetch_order_create(fetch_order **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? STRATA_OK : err_set(STRATA_ENOMEM, "out of memory for the fetch order");
}

void fetch_order_destroy(fetch_order *o)
{
    if (!o)
        return;
    free(o->order);
    free(o->rec);
    free(o);
}

strata_status fetch_order_declare(fetch_order *o, const strata_module_id *ids, size_t count)
{
    if (!array_grow((void **)&o->order, &o->cap, count, sizeof *o->order))
        return err_set(STRATA_ENOMEM, "strata_module_order: out of memory");
    memcpy(o->order, ids, count * sizeof *ids);
    o->len = count;
    o->declared = true;
    o->valid = true;
    return STRATA_OK;
}

void fetch_order_track(fetch_order *o, const registry *reg, strata_module_id id)
{
    if (array_grow((void **)&o->rec, &o->rec_cap, o->rec_len + 1, sizeof *o->rec))
        o->rec[o->rec_len++] = id;
    if (!o->valid)
        return;
    if (o->pos == o->len && o->order[0] == id)
        o->pos = 0; /* the next micro-batch repeats the order */
    if (o->pos < o->len && o->order[o->pos] == id) {
        o->pos++;
        return;
    }
    if (!o->warned)
        LOG_WARN(LOG_SCHED, "fetch order diverged at position %zu (module \"%s\", expected \"%s\"); prefetching "
                 "stops until the order of a whole step has been recorded again", o->pos,
                 registry_module(reg, id)->name,
                 o->pos < o->len ? registry_module(reg, o->order[o->pos])->name : "(end of step)");
    o->warned = true;
    o->valid = false;
    o->declared = false;
}

/* Makes the recorded order the order. */
static void adopt_recording(fetch_order *o)
{
    if (o->rec_len == 0 || !array_grow((void **)&o->order, &o->cap, o->rec_len, sizeof *o->order))
        return;
    memcpy(o->order, o->rec, o->rec_len * sizeof *o->rec);
    o->len = o->rec_len;
    o->valid = true;
}

void fetch_order_step_boundary(fetch_order *o)
{
    bool incomplete = o->valid && o->pos != o->len && o->rec_len > 0;
    if (incomplete && !o->warned) {
        LOG_WARN(LOG_SCHED, "the step fetched %zu modules, the order has %zu; re-recording", o->pos, o->len);
        o->warned = true;
    }
    if ((!o->valid && !o->declared) || incomplete)
        adopt_recording(o);
    o->rec_len = 0;
    o->pos = 0;
}

bool fetch_order_valid(const fetch_order *o)
{
    return o->valid;
}

bool fetch_order_step_has_more(const fetch_order *o)
{
    return o->valid && o->pos < o->len;
}

bool fetch_order_step_fetches_again(const fetch_order *o, strata_module_id id)
{
    for (size_t k = o->pos; o->valid && k < o->len; k++)
        if (o->order[k] == id)
            return true;
    return false;
}

size_t fetch_order_step_left(const fetch_order *o)
{
    return o->valid && o->pos < o->len ? o->len - o->pos : 0;
}

size_t fetch_order_len(const fetch_order *o)
{
    return o->len;
}

strata_module_id fetch_order_ahead(const fetch_order *o, size_t k)
{
    return o->order[(o->pos + k) % o->len];
}

size_t fetch_order_next_use(const fetch_order *o, strata_module_id id)
{
    if (!o->valid)
        return SIZE_MAX;
    for (size_t k = 0; k < o->len; k++)
        if (fetch_order_ahead(o, k) == id)
            return k;
    return SIZE_MAX;
}
