/*
 * Swap space: where NVMe-resident model state lives.
 *
 * One private preallocated file per nvme_path (O_TMPFILE, or unlinked right after open, mode
 * 0600: nobody else ever sees model state, and nothing is left behind after a crash), striped
 * RAID-0 style with a stripe unit of aio.block_size so that several drives add their bandwidth.
 * The striped space is carved into 4 KiB-aligned extents.
 *
 * Use by the engine:
 *   swap_alloc(s, bytes, &e)                      reserve an extent (bytes rounded up to 4 KiB)
 *   swap_write(s, &e, 0, buf, e.bytes, &w)        queue the write from a pinned 4 KiB-aligned buffer
 *   swap_read(s, &e, 0, buf, e.bytes, &w)         queue the read
 *   io_wait_wait(&w) / io_wait_idle(&w)           wait for, or poll, completion (nvme/wait.h)
 *   swap_free(s, e)                               give the extent back (no I/O in flight on it)
 * One io_wait may collect many extents' I/O; the first failure names file, offset, length, errno.
 */
#ifndef STRATA_NVME_SWAP_H
#define STRATA_NVME_SWAP_H

#include <stdint.h>

#include "nvme/io.h"

typedef struct nvme_swap nvme_swap;

/* A reserved range of the striped swap space. */
typedef struct swap_extent {
    uint64_t offset; /* in the striped space, a multiple of 4 KiB */
    uint64_t bytes;  /* a multiple of 4 KiB */
    const char *what; /* what it holds, for messages ("master weights"); may be NULL; set by the owner */
} swap_extent;

/* Integrity: with checksums on (the default; strata.swap_checksum), every 4 KiB unit a write covers gets a
 * crc32c, computed on the I/O thread when the write completes and kept in memory (5 bytes per 4 KiB of
 * swap, about 0.12%); a read of units that have one is checked on the I/O thread when it lands, and a
 * mismatch fails the read's io_wait with STRATA_ECORRUPT naming what the extent holds, the unit, the
 * swap file and its offset. Units never written, or written only in part, are not checked. */
#define SWAP_CRC_UNIT ((uint64_t)4096)

/* Creates swap of at least capacity_bytes over paths (directories), striped with the io's
 * block size. Checks free space first: STRATA_ENOSPC names the path, what is needed and what
 * is free. STRATA_ECONFIG when a path is not a writable directory. */
strata_status swap_create(nvme_io *io, const char *const *paths, int npaths, uint64_t capacity_bytes,
                          nvme_swap **out);

/* What swap_create would meet at one nvme_path, found without creating swap (`strata config check`). */
typedef struct swap_path_report {
    bool direct;          /* a swap file there gets O_DIRECT; false: buffered (aio.direct auto fell back, or false) */
    uint64_t free_bytes;  /* free space for this user (statvfs) */
} swap_path_report;

/* The one check of an nvme_path, which swap_create runs on every path (need_bytes: what each swap file takes)
 * before it makes any file, and `strata config check` runs with swap_min_bytes (it knows no model), so that the
 * two agree on every path: an existing directory with need_bytes free, in which a private file can be opened under
 * io's aio.direct policy (so it is writable, and O_DIRECT is accepted or, with auto, the fallback to buffered I/O
 * is said once); the file is closed (and so gone) before this returns. STRATA_ECONFIG (missing, not a directory),
 * STRATA_ENOSPC (less than need_bytes free, with both numbers), STRATA_EUNSUPPORTED (O_DIRECT refused with
 * aio.direct on), or the open's error (STRATA_EIO for a read-only filesystem or no permission). */
strata_status swap_check_path(nvme_io *io, const char *dir, uint64_t need_bytes, swap_path_report *out);

/* The least swap_create puts in a path: one stripe unit (the io's aio.block_size). */
uint64_t swap_min_bytes(const nvme_io *io);

/* Closes (and so deletes) the swap files. The caller has waited for all swap I/O. NULL-safe. */
void swap_destroy(nvme_swap *s);

/* Reserves an extent of bytes (rounded up to 4 KiB). STRATA_ENOSPC with the numbers when no
 * free range is large enough. Thread-safe. */
strata_status swap_alloc(nvme_swap *s, uint64_t bytes, swap_extent *out);

/* Returns an extent; neighbours merge. Thread-safe. */
void swap_free(nvme_swap *s, swap_extent e);

/* Queue a write / read of len bytes at offset within extent e from / into buf (4 KiB aligned
 * buffer, offset and length when the files are direct). Counted on w. Thread-safe. */
strata_status swap_write(nvme_swap *s, const swap_extent *e, uint64_t offset, const void *buf, size_t len,
                         io_wait *w);
strata_status swap_read(nvme_swap *s, const swap_extent *e, uint64_t offset, void *buf, size_t len, io_wait *w);

/* Turns the per-unit checksums on or off (before any I/O; off forgets every checksum). */
void swap_set_checksum(nvme_swap *s, bool on);
bool swap_checksum(const nvme_swap *s);

uint64_t swap_capacity(const nvme_swap *s);
uint64_t swap_free_bytes(nvme_swap *s);

/* The descriptor of the index-th swap file (-1 when out of range), for tests and diagnostics. */
int swap_file_fd(const nvme_swap *s, int index);

/* True when every swap file uses O_DIRECT. */
bool swap_is_direct(const nvme_swap *s);

#endif
