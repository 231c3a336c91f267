/* O_DIRECT probing with a buffered fallback, alignment checks, aligned pinned buffers. */
#include "nvme/direct.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "base/util.h"
#include "nvme/fault.h"

/* Lets the first round of direct writes run without blocking. io_uring first tries each request without blocking,
 * and an inode just read back into memory refuses a write that way until one write has run the blocking checks
 * (the privilege check that marks the inode S_NOSEC): every request of the first round went to io-wq worker
 * threads, 32 of 1024 for a 1 GiB pass at queue depth 32, on every pass after the page cache was dropped. A
 * fallocate of the first 4 KiB that keeps the size runs those checks and changes no byte (an allocated block stays
 * as it is; a hole there becomes an unwritten block that reads as zeros). A new, empty file is left alone: its
 * writes extend it and block anyway. Where fallocate is refused nothing changes. */
static void prepare_for_nowait_writes(int fd)
{
    struct stat sb;
    if (fstat(fd, &sb) == 0 && sb.st_size > 0)
        (void)fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, NVME_ALIGN);
}

strata_status direct_open(const char *path, int flags, mode_t mode, strata_switch direct, int *fd_out,
                          bool *direct_out)
{
    char eb[96];
    *fd_out = -1;
    *direct_out = false;
    flags |= O_CLOEXEC;
    if (direct != STRATA_SWITCH_OFF) {
        int fd = nvme_fault_nodirect() ? (errno = EINVAL, -1) : open(path, flags | O_DIRECT, mode);
        if (fd >= 0) {
            if ((flags & O_ACCMODE) != O_RDONLY)
                prepare_for_nowait_writes(fd);
            *fd_out = fd;
            *direct_out = true;
            return STRATA_OK;
        }
        int e = errno;
        if (e != EINVAL && e != EOPNOTSUPP)
            return err_set(err_from_errno(e), "open \"%s\" failed: %s", path, err_errno_str(e, eb, sizeof eb));
        if (direct == STRATA_SWITCH_ON)
            return err_set(STRATA_EUNSUPPORTED,
                           "open \"%s\" with O_DIRECT failed: %s; the filesystem may not support O_DIRECT "
                           "(aio.direct is on) — set aio.direct to auto or false to use buffered I/O",
                           path, err_errno_str(e, eb, sizeof eb));
        LOG_ONCE(STRATA_LOG_WARN, LOG_IO,
                 "\"%s\": the filesystem refuses O_DIRECT (%s); using buffered I/O (set aio.direct=true to "
                 "make this an error)", path, err_errno_str(e, eb, sizeof eb));
    }
    int fd = open(path, flags, mode);
    if (fd < 0) {
        int e = errno;
        return err_set(err_from_errno(e), "open \"%s\" failed: %s", path, err_errno_str(e, eb, sizeof eb));
    }
    *fd_out = fd;
    return STRATA_OK;
}

strata_status direct_check_aligned(const char *path, const void *buf, uint64_t offset, size_t len)
{
    const char *what = NULL;
    unsigned long long value = 0;
    if (!is_aligned((uintptr_t)buf, NVME_ALIGN)) {
        what = "buffer address";
        value = (unsigned long long)(uintptr_t)buf;
    } else if (!is_aligned(offset, NVME_ALIGN)) {
        what = "file offset";
        value = offset;
    } else if (!is_aligned(len, NVME_ALIGN)) {
        what = "length";
        value = len;
    }
    if (!what)
        return STRATA_OK;
    return err_set(STRATA_EINVAL,
                   "direct I/O on \"%s\": %s %#llx (%llu) is not a multiple of %u (buffer %p, offset %llu, "
                   "length %zu); use strata_aio_buffer_alloc() buffers and 4 KiB multiples, or open without "
                   "direct I/O (aio.direct=false)",
                   path, what, value, value, NVME_ALIGN, buf, (unsigned long long)offset, len);
}

strata_status direct_buffer_alloc(size_t bytes, void **out, bool *locked_out)
{
    *out = NULL;
    if (locked_out)
        *locked_out = false;
    size_t n = align_up(bytes ? bytes : 1, NVME_ALIGN);
    /* mmap gives page-aligned zeroed memory that goes back to the kernel on free. */
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        char eb[96];
        return err_set(STRATA_ENOMEM, "aligned buffer of %zu bytes: mmap failed: %s", n,
                       err_errno_str(errno, eb, sizeof eb));
    }
    /* Huge pages make a block one physically contiguous run: in 4 KiB pages a 1 MiB block is 256 segments, more
     * than a virtio disk takes in one request (max_segments 254), so every block went as two 512 KiB requests
     * that the block layer never merged. With them a block is one request and neighbours merge up to
     * max_sectors_kb: b_aio 1 GiB at 1 MiB / QD 32 wrote 2.4 -> 3.8 GB/s and read 0.72 -> 1.87 GB/s
     * (benchmarks/io_peers.sh). A hint: where THP is off the buffer is as before. */
    (void)madvise(p, n, MADV_HUGEPAGE);
    /* Locking keeps the pages resident while the kernel DMAs into them; without it the
     * buffer still works, the kernel pins pages per I/O. */
    bool locked = mlock(p, n) == 0;
    if (!locked)
        LOG_ONCE(STRATA_LOG_INFO, LOG_IO, "aio buffers are not locked in RAM (RLIMIT_MEMLOCK too small); "
                                          "I/O still works, pages are pinned per operation");
    if (locked_out)
        *locked_out = locked;
    *out = p;
    return STRATA_OK;
}

void direct_buffer_free(void *buf, size_t bytes)
{
    if (buf)
        munmap(buf, align_up(bytes ? bytes : 1, NVME_ALIGN));
}
