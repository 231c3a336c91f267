/*
 * err_latch: of failures latched from racing threads exactly one is kept, the first; raise keeps it,
 * take clears it, and what is raised is that thread's message with the caller's op in front; a failure
 * latched at a place in a queue is raised only to waiters on that place or later.
 */
#include <pthread.h>

#include "base/latch.h"
#include "testlib.h"

enum { THREADS = 8, ROUNDS = 200 };

typedef struct {
    err_latch *latch;
    pthread_barrier_t *go;
    int id;
    bool won;
} racer;

static void *race(void *arg)
{
    racer *r = arg;
    char msg[64];
    snprintf(msg, sizeof msg, "racer %d failed", r->id);
    pthread_barrier_wait(r->go);
    r->won = err_latch_set(r->latch, STRATA_EIO, msg);
    return NULL;
}

static void first_of_racing_threads(void)
{
    for (int round = 0; round < ROUNDS; round++) {
        err_latch l;
        err_latch_init(&l);
        pthread_barrier_t go;
        pthread_barrier_init(&go, NULL, THREADS);
        racer rs[THREADS];
        pthread_t th[THREADS];
        for (int i = 0; i < THREADS; i++) {
            rs[i] = (racer){.latch = &l, .go = &go, .id = i};
            pthread_create(&th[i], NULL, race, &rs[i]);
        }
        int winners = 0, winner = -1;
        for (int i = 0; i < THREADS; i++) {
            pthread_join(th[i], NULL);
            if (rs[i].won) {
                winners++;
                winner = i;
            }
        }
        T_EQ_INT(winners, 1);
        char want[64];
        snprintf(want, sizeof want, "flush: racer %d failed", winner);
        T_STATUS(err_latch_raise(&l, "flush"), STRATA_EIO);
        T_EQ_STR(err_last(), want);
        pthread_barrier_destroy(&go);
        err_latch_destroy(&l);
        if (t_failures)
            return;
    }
}

static void raise_keeps_take_clears(void)
{
    err_latch l;
    err_latch_init(&l);
    T_CHECK(!err_latch_failed(&l), "a fresh latch reports a failure");
    T_OK(err_latch_raise(&l, "op"));
    T_CHECK(!err_latch_set(&l, STRATA_OK, "not a failure"), "STRATA_OK was latched");
    T_CHECK(!err_latch_failed(&l), "STRATA_OK counts as a failure");

    err_set(STRATA_ENOSPC, "disk %d full", 3);
    T_STATUS(err_latch_set_last(&l, STRATA_ENOSPC), STRATA_ENOSPC);
    T_CHECK(!err_latch_set(&l, STRATA_EIO, "later"), "a second failure replaced the first");
    T_CHECK(err_latch_failed(&l), "a latched failure is not reported");
    err_clear();
    T_STATUS(err_latch_raise(&l, NULL), STRATA_ENOSPC);
    T_EQ_STR(err_last(), "disk 3 full");
    T_STATUS(err_latch_raise(&l, "again"), STRATA_ENOSPC); /* raise keeps it */
    T_EQ_STR(err_last(), "again: disk 3 full");

    char msg[ERR_MSG_BYTES];
    err_clear();
    T_STATUS(err_latch_take_copy(&l, msg, sizeof msg), STRATA_ENOSPC);
    T_EQ_STR(msg, "disk 3 full");
    T_EQ_STR(err_last(), ""); /* take_copy leaves this thread's error alone */
    T_CHECK(!err_latch_failed(&l), "take_copy did not clear the latch");
    T_OK(err_latch_take(&l, "op"));

    T_CHECK(err_latch_set(&l, STRATA_EINVAL, NULL), "a failure after a take was not latched");
    T_STATUS(err_latch_take(&l, "op"), STRATA_EINVAL);
    char want[ERR_MSG_BYTES];
    snprintf(want, sizeof want, "op: %s", strata_status_str(STRATA_EINVAL));
    T_EQ_STR(err_last(), want);
    err_latch_destroy(&l);
}

/* A failure at place 5 of a queue is the failure of a waiter on place 5 or later, not of one on place 4. */
static void raise_upto_a_place_in_the_queue(void)
{
    err_latch l;
    err_latch_init(&l);
    T_CHECK(err_latch_set_at(&l, 5, STRATA_EDEVICE, "host function 5 failed"), "the first failure was not latched");
    T_CHECK(!err_latch_set_at(&l, 3, STRATA_EIO, "later"), "a second failure replaced the first");
    err_clear();
    T_OK(err_latch_raise_upto(&l, 4, "event"));
    T_EQ_STR(err_last(), "");
    T_STATUS(err_latch_raise_upto(&l, 5, "event"), STRATA_EDEVICE);
    T_EQ_STR(err_last(), "event: host function 5 failed");
    T_STATUS(err_latch_raise_upto(&l, 9, NULL), STRATA_EDEVICE); /* it stays latched */
    T_STATUS(err_latch_take(&l, NULL), STRATA_EDEVICE);             /* take reports it whatever its place */
    T_CHECK(!err_latch_failed(&l), "take did not clear the latch");

    T_CHECK(err_latch_set(&l, STRATA_EIO, "no place"), "a failure after a take was not latched");
    T_STATUS(err_latch_raise_upto(&l, 1, NULL), STRATA_EIO); /* one without a place concerns every waiter */
    err_latch_destroy(&l);
}

int main(void)
{
    first_of_racing_threads();
    raise_keeps_take_clears();
    raise_upto_a_place_in_the_queue();
    return t_done();
}
