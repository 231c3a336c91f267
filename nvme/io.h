/*
 * The NVMe I/O handle: intra_op_parallelism rings (one I/O thread each), open files with
 * their O_DIRECT state and fixed-file slots, registered buffers. Engine-independent: the public
 * strata_aio handle and the swap space are both built on it.
 *
 * A request longer than two blocks is cut into one contiguous, block-aligned chunk per ring so
 * that every I/O thread works on it; shorter ones go to the rings in turn.
 */
#ifndef STRATA_NVME_IO_H
#define STRATA_NVME_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "nvme/ring.h"
#include "nvme/wait.h"
#include "strata.h"

#define NVME_MAX_RINGS 64
/* The allowed aio ranges: the config loader's key table reads these, so both agree. */
#define NVME_BLOCK_MIN ((size_t)4096)
#define NVME_BLOCK_MAX ((size_t)64 << 20)
#define NVME_QUEUE_DEPTH_MAX 1024

typedef struct nvme_io nvme_io;

typedef struct nvme_file {
    int fd;
    bool direct;          /* opened with O_DIRECT: every request must be NVME_ALIGN-aligned */
    int slot;             /* fixed-file slot in every ring, or -1 */
    uint64_t size;        /* the file is known to be at least this long (direct files; see nvme_io_submit) */
    char path[STRATA_PATH_BYTES];
} nvme_file;

/* Fills the aio defaults: block 1 MiB, queue depth 32, 1 thread, batched, overlapping, direct
 * AUTO, sqpoll OFF. (The config loader has the same defaults; this serves standalone users.) */
void nvme_aio_defaults(strata_aio_config *cfg);

/* Checks cfg's ranges; STRATA_ECONFIG naming the key. */
strata_status nvme_aio_validate(const strata_aio_config *cfg);

strata_status nvme_io_create(const strata_aio_config *cfg, nvme_io **out);

/* Cancels what has not started, drains what is in flight, closes nothing the caller opened. NULL-safe. */
void nvme_io_destroy(nvme_io *io);

const strata_aio_config *nvme_io_config(const nvme_io *io);
int nvme_io_ring_count(const nvme_io *io);
ring_caps nvme_io_caps(const nvme_io *io);

/* Opens path (flags as open(2), e.g. O_RDWR|O_CREAT or O_RDWR|O_TMPFILE with a directory) with
 * the O_DIRECT policy of the config, and registers it as a fixed file when possible. */
strata_status nvme_io_open(nvme_io *io, const char *path, int flags, mode_t mode, nvme_file **out);

/* Closes f; the caller has waited for its I/O. NULL-safe. */
void nvme_io_close(nvme_io *io, nvme_file *f);

/* Queues a read or write of len bytes at offset; w is counted (io_wait_add) for each part
 * queued. Direct files check alignment first (STRATA_EINVAL naming the value), and a write past a
 * direct file's end sets its size first (ftruncate): ext4 runs an O_DIRECT write that extends the
 * file synchronously under the inode lock, one at a time, so a new file was written at queue depth 1
 * (3-6x slower, benchmarks/io_peers.sh --layout new). Thread-safe. */
strata_status nvme_io_submit(nvme_io *io, nvme_file *f, ring_op op, void *buf, uint64_t offset, size_t len,
                             io_wait *w);

/* Submits one request and waits for it alone (the synchronous form of nvme_io_submit). */
strata_status nvme_io_sync(nvme_io *io, nvme_file *f, ring_op op, void *buf, uint64_t offset, size_t len);

/* Registers buf with every ring (best effort: false when refused, I/O still works). Thread-safe. */
bool nvme_io_register_buffer(nvme_io *io, void *buf, size_t len);
/* Unregisters it; no I/O may be in flight on it. */
void nvme_io_unregister_buffer(nvme_io *io, void *buf);

#endif
