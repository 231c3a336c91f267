/* Describing and comparing the collective each rank is about to run (see comm_order.h). */
#include "comm/comm_order.h"

#include <stdio.h>
#include <string.h>

void comm_order_of(const comm_req *r, comm_order *out)
{
    memset(out, 0, sizeof *out);
    out->seq = r->seq;
    out->kind = (int32_t)r->kind;
    /* Only what the collective's semantics depend on is compared: the reduction only for an all-reduce, the root
     * only for a broadcast, no sizes for a barrier or an NCCL attach. */
    if (r->kind != COMM_KIND_BARRIER && r->kind != COMM_KIND_ATTACH_NCCL) {
        out->count = r->count;
        out->dt = (int32_t)r->dt;
    }
    out->rop = r->kind == COMM_KIND_ALLREDUCE ? (int32_t)r->rop : 0;
    out->root = r->kind == COMM_KIND_BROADCAST ? r->root : 0;
    snprintf(out->op, sizeof out->op, "%s", r->op ? r->op : "?");
}

static bool same(const comm_order *a, const comm_order *b)
{
    return a->seq == b->seq && a->kind == b->kind && a->count == b->count && a->dt == b->dt && a->rop == b->rop &&
           a->root == b->root;
}

static void describe(const comm_order *o, char *buf, size_t len)
{
    comm_kind k = (comm_kind)o->kind;
    const char *per = k == COMM_KIND_ALLGATHER || k == COMM_KIND_REDUCE_SCATTER ? " per rank" : "";
    if (k == COMM_KIND_BARRIER || k == COMM_KIND_ATTACH_NCCL)
        snprintf(buf, len, "%.32s (%s)", o->op, comm_kind_name_of(k));
    else if (k == COMM_KIND_BROADCAST)
        snprintf(buf, len, "%.32s (%s of %llu %s from rank %d)", o->op, comm_kind_name_of(k),
                 (unsigned long long)o->count, comm_dtype_name((comm_dtype)o->dt), o->root);
    else
        snprintf(buf, len, "%.32s (%s of %llu %s%s)", o->op, comm_kind_name_of(k), (unsigned long long)o->count,
                 comm_dtype_name((comm_dtype)o->dt), per);
}

bool comm_order_agree(const comm_order *all, int size, char *msg, size_t len)
{
    for (int r = 1; r < size; r++) {
        if (same(&all[r], &all[0]))
            continue;
        char a[160], b[160];
        describe(&all[0], a, sizeof a);
        describe(&all[r], b, sizeof b);
        snprintf(msg, len,
                 "the ranks are in different collectives: collective #%llu is %s on rank 0 but %s on rank %d; "
                 "every rank must make the same strata calls in the same order (the same modules fetched and "
                 "handed over, the same number of micro-batches and steps)",
                 (unsigned long long)all[0].seq, a, b, r);
        return false;
    }
    return true;
}
