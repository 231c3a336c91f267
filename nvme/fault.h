/*
 * Test-only fault injection for the NVMe tier.
 *
 * A test arms one fault at the Nth I/O operation (counting every piece a ring submits, from 1,
 * process-wide) or makes the next O_DIRECT open behave as if the filesystem refused it.
 * The environment arms it too: STRATA_NVME_FAULT=eio@N | short@N | eagain@N | nodirect.
 * Unarmed, the hook costs one relaxed atomic load per operation and changes nothing.
 */
#ifndef STRATA_NVME_FAULT_H
#define STRATA_NVME_FAULT_H

#include <stdbool.h>
#include <stdint.h>

typedef enum nvme_fault_kind {
    NVME_FAULT_NONE = 0,
    NVME_FAULT_EIO,      /* the operation completes with -EIO */
    NVME_FAULT_SHORT,    /* the operation transfers only part of its length (a short read/write) */
    NVME_FAULT_EAGAIN,   /* the operation completes with -EAGAIN once (it must be retried) */
    NVME_FAULT_NODIRECT, /* opens with O_DIRECT fail with EINVAL, as on a filesystem that refuses it */
} nvme_fault_kind;

/* Arms kind at operation op_index (1 = the next operation counted from now); NVME_FAULT_NONE disarms.
 * NODIRECT ignores op_index and stays armed until disarmed. Thread-safe. */
void nvme_fault_inject(uint64_t op_index, nvme_fault_kind kind);

/* Called once per operation by the ring: the fault to apply to this operation, usually NONE. */
nvme_fault_kind nvme_fault_next(void);

/* True when an O_DIRECT open should be refused (NODIRECT armed). */
bool nvme_fault_nodirect(void);

#endif
