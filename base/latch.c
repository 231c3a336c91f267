/* The first failure of work on other threads (see latch.h). */
#include "base/latch.h"

#include <stdio.h>

void err_latch_init(err_latch *l)
{
    pthread_mutex_init(&l->lock, NULL);
    atomic_init(&l->failed, false);
    l->first.status = STRATA_OK;
    l->first.msg[0] = '\0';
    l->at = 0;
}

void err_latch_destroy(err_latch *l)
{
    pthread_mutex_destroy(&l->lock);
}

bool err_latch_set(err_latch *l, strata_status st, const char *msg)
{
    return err_latch_set_at(l, 0, st, msg);
}

bool err_latch_set_at(err_latch *l, uint64_t at, strata_status st, const char *msg)
{
    if (st == STRATA_OK)
        return false;
    pthread_mutex_lock(&l->lock);
    bool first = l->first.status == STRATA_OK;
    if (first) {
        l->first.status = st;
        snprintf(l->first.msg, sizeof l->first.msg, "%s", msg ? msg : strata_status_str(st));
        l->at = at;
        atomic_store(&l->failed, true);
    }
    pthread_mutex_unlock(&l->lock);
    return first;
}

strata_status err_latch_set_last(err_latch *l, strata_status st)
{
    err_latch_set(l, st, err_last());
    return st;
}

bool err_latch_failed(err_latch *l)
{
    return atomic_load(&l->failed);
}

/* Copies the latched failure out under the lock when it happened at or before upto, clearing it when
 * asked. */
static strata_status read_latch(err_latch *l, uint64_t upto, bool clear, char *msg, size_t len)
{
    if (msg && len)
        msg[0] = '\0';
    if (!atomic_load(&l->failed))
        return STRATA_OK;
    pthread_mutex_lock(&l->lock);
    strata_status st = l->at <= upto ? l->first.status : STRATA_OK;
    if (st != STRATA_OK && msg && len)
        snprintf(msg, len, "%s", l->first.msg);
    if (st != STRATA_OK && clear) {
        l->first.status = STRATA_OK;
        l->first.msg[0] = '\0';
        atomic_store(&l->failed, false);
    }
    pthread_mutex_unlock(&l->lock);
    return st;
}

static strata_status raise_latch(err_latch *l, uint64_t upto, const char *op, bool clear)
{
    char msg[ERR_MSG_BYTES];
    strata_status st = read_latch(l, upto, clear, msg, sizeof msg);
    if (st == STRATA_OK)
        return STRATA_OK;
    return op ? err_set(st, "%s: %s", op, msg) : err_set(st, "%s", msg);
}

strata_status err_latch_raise(err_latch *l, const char *op)
{
    return raise_latch(l, UINT64_MAX, op, false);
}

strata_status err_latch_take(err_latch *l, const char *op)
{
    return raise_latch(l, UINT64_MAX, op, true);
}

strata_status err_latch_raise_upto(err_latch *l, uint64_t upto, const char *op)
{
    return raise_latch(l, upto, op, false);
}

strata_status err_latch_take_copy(err_latch *l, char *msg, size_t len)
{
    return read_latch(l, UINT64_MAX, true, msg, len);
}
