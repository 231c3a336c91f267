/*
 * The order check (comm_ops.check_order): before each collective every rank publishes what it is about to run,
 * so that ranks in different calls fail together with one message instead of a transport error or a deadline.
 * This file describes and compares; the implementation (comm_mpi.c) moves the descriptions. Private to comm/.
 */
#ifndef STRATA_COMM_COMM_ORDER_H
#define STRATA_COMM_COMM_ORDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/comm_internal.h"

/* One rank's description of one collective: fixed size, so the exchange itself never mismatches. */
typedef struct comm_order {
    uint64_t seq;
    uint64_t count;
    int32_t kind, dt, rop, root;
    char op[32];
} comm_order;

/* The description of request r (kind, sizes, its number on the comm). */
void comm_order_of(const comm_req *r, comm_order *out);
/* Whether every rank's description (all[0..size)) names the same collective; if not, msg says which collective,
 * the first rank that differs from rank 0, both calls, and what to do. The same text on every rank. */
bool comm_order_agree(const comm_order *all, int size, char *msg, size_t len);

#endif
