/* Injected faults surface as errors or are recovered, never as wrong data: EIO at the Nth
 * operation fails the request with file/offset/length/errno; a short transfer and EAGAIN are
 * resubmitted and the bytes are exact; a refused O_DIRECT falls back (AUTO) or fails (ON). */
#include <fcntl.h>
#include <pthread.h>

#include "base/error.h"
#include "nvme/direct.h"
#include "nvme/fault.h"
#include "nvme/io.h"
#include "testlib.h"

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_text[16384];

static void capture(strata_log_level level, const char *sub, const char *msg, void *user)
{
    pthread_mutex_lock(&log_mu);
    size_t n = strlen(log_text);
    snprintf(log_text + n, sizeof log_text - n, "%s\n", msg);
    pthread_mutex_unlock(&log_mu);
}

static bool log_has(const char *needle)
{
    pthread_mutex_lock(&log_mu);
    bool found = strstr(log_text, needle) != NULL;
    pthread_mutex_unlock(&log_mu);
    return found;
}

static strata_status do_io(nvme_io *io, nvme_file *f, ring_op op, void *buf, uint64_t off, size_t len)
{
    return nvme_io_sync(io, f, op, buf, off, len);
}

enum { BYTES = 1 << 20 };

static void faults(const char *dir, strata_switch direct)
{
    strata_aio_config cfg;
    nvme_aio_defaults(&cfg);
    cfg.block_size = 64 << 10;
    cfg.queue_depth = 4;
    cfg.direct = direct;
    nvme_io *io = NULL;
    T_OK(nvme_io_create(&cfg, &io));
    char path[4200];
    snprintf(path, sizeof path, "%s/fault", dir);
    nvme_file *f = NULL;
    T_OK(nvme_io_open(io, path, O_RDWR | O_CREAT | O_TRUNC, 0600, &f));
    void *wb = NULL, *rb = NULL;
    direct_buffer_alloc(BYTES, &wb, NULL);
    direct_buffer_alloc(BYTES, &rb, NULL);
    t_rand_bytes(wb, BYTES);
    T_OK(do_io(io, f, RING_WRITE, wb, 0, BYTES));

    /* EIO at the 3rd piece of a read: an error that names everything, whatever the buffer holds. */
    nvme_fault_inject(3, NVME_FAULT_EIO);
    T_STATUS(do_io(io, f, RING_READ, rb, 0, BYTES), STRATA_EIO);
    T_CONTAINS(err_last(), "read \"");
    T_CONTAINS(err_last(), path);
    T_CONTAINS(err_last(), "at offset 131072, length 65536 failed: Input/output error (EIO)");

    /* EIO on a write. */
    nvme_fault_inject(5, NVME_FAULT_EIO);
    T_STATUS(do_io(io, f, RING_WRITE, wb, 0, BYTES), STRATA_EIO);
    T_CONTAINS(err_last(), "write \"");

    /* A short read is finished with a second submission: exact bytes. */
    log_text[0] = '\0';
    nvme_fault_inject(2, NVME_FAULT_SHORT);
    memset(rb, 0, BYTES);
    T_OK(do_io(io, f, RING_READ, rb, 0, BYTES));
    T_CHECK(memcmp(rb, wb, BYTES) == 0, "data differs after a short read was resubmitted");
    T_CHECK(log_has("short read"), "the short read did not happen (no trace line); log:\n%s", log_text);

    /* A short write, then read back. */
    log_text[0] = '\0';
    t_rand_bytes(wb, BYTES);
    nvme_fault_inject(4, NVME_FAULT_SHORT);
    T_OK(do_io(io, f, RING_WRITE, wb, 0, BYTES));
    T_CHECK(log_has("short write"), "the short write did not happen; log:\n%s", log_text);
    memset(rb, 0, BYTES);
    T_OK(do_io(io, f, RING_READ, rb, 0, BYTES));
    T_CHECK(memcmp(rb, wb, BYTES) == 0, "data differs after a short write was resubmitted");

    /* EAGAIN is retried. */
    nvme_fault_inject(1, NVME_FAULT_EAGAIN);
    memset(rb, 0, BYTES);
    T_OK(do_io(io, f, RING_READ, rb, 0, BYTES));
    T_CHECK(memcmp(rb, wb, BYTES) == 0, "data differs after EAGAIN was retried");

    direct_buffer_free(wb, BYTES);
    direct_buffer_free(rb, BYTES);
    nvme_io_close(io, f);
    nvme_io_destroy(io);
}

static void refused_direct(const char *dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/nodirect", dir);
    strata_aio_config cfg;
    nvme_aio_defaults(&cfg);
    nvme_io *io = NULL;
    T_OK(nvme_io_create(&cfg, &io));
    nvme_fault_inject(0, NVME_FAULT_NODIRECT);
    log_text[0] = '\0';
    nvme_file *f = NULL;
    T_OK(nvme_io_open(io, path, O_RDWR | O_CREAT, 0600, &f));
    T_CHECK(f && !f->direct, "AUTO must fall back to buffered I/O when O_DIRECT is refused");
    T_CHECK(log_has("refuses O_DIRECT") && log_has("using buffered I/O"), "no fallback warning; log:\n%s", log_text);
    /* Buffered files take unaligned requests. */
    char small[100] = "strata";
    T_OK(do_io(io, f, RING_WRITE, small, 3, sizeof small));
    nvme_io_close(io, f);
    nvme_io_destroy(io);

    cfg.direct = STRATA_SWITCH_ON;
    T_OK(nvme_io_create(&cfg, &io));
    f = NULL;
    T_STATUS(nvme_io_open(io, path, O_RDWR, 0600, &f), STRATA_EUNSUPPORTED);
    T_CONTAINS(err_last(), path);
    T_CONTAINS(err_last(), "with O_DIRECT failed: Invalid argument (EINVAL)");
    T_CONTAINS(err_last(), "set aio.direct to auto or false");
    T_CHECK(f == NULL, "out must be NULL on failure");
    nvme_fault_inject(0, NVME_FAULT_NONE);
    nvme_io_destroy(io);
}

int main(void)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", t_scratch_dir("t_nvme_fault"));
    strata_log_set_callback(capture, NULL);
    strata_log_set_level(STRATA_LOG_TRACE);
    strata_log_set_subsystems("io");
    faults(dir, STRATA_SWITCH_AUTO);
    faults(dir, STRATA_SWITCH_OFF);
    refused_direct(dir);
    return t_done();
}
