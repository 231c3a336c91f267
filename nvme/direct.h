/*
 * O_DIRECT: opening with a probe and a fallback, the alignment rule, aligned buffers.
 *
 * Direct I/O bypasses the page cache, so buffers, offsets and lengths must be multiples of
 * the device's logical block; strata uses 4 KiB everywhere, which every NVMe drive accepts.
 */
#ifndef STRATA_NVME_DIRECT_H
#define STRATA_NVME_DIRECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "strata.h"

#define NVME_ALIGN 4096u

/* Opens path with flags (plus O_CLOEXEC), adding O_DIRECT unless direct is OFF. When the
 * filesystem refuses O_DIRECT, AUTO says so once (warn) and opens buffered; ON fails with a
 * message that names the path and the hint. *direct_out tells which it got. */
strata_status direct_open(const char *path, int flags, mode_t mode, strata_switch direct, int *fd_out,
                          bool *direct_out);

/* STRATA_EINVAL naming the pointer, offset or length that is not a multiple of NVME_ALIGN. */
strata_status direct_check_aligned(const char *path, const void *buf, uint64_t offset, size_t len);

/* A zeroed buffer of bytes rounded up to NVME_ALIGN, page aligned, locked in RAM when
 * RLIMIT_MEMLOCK allows (best effort; *locked_out says whether). Free with direct_buffer_free. */
strata_status direct_buffer_alloc(size_t bytes, void **out, bool *locked_out);
void direct_buffer_free(void *buf, size_t bytes);

#endif
