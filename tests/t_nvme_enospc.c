/* A full filesystem: a 4 MiB tmpfs mounted by the test (root only; skipped otherwise). Writing
 * past its capacity gives STRATA_ENOSPC naming the path, the data already written reads back
 * intact, and swap setup refuses up front with the numbers. Exercised on direct and buffered. */
#include <errno.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "nvme/fault.h"
#include "nvme/swap.h"
#include "testlib.h"

static void fill_up(const char *mnt, bool force_buffered)
{
    strata_aio_config cfg;
    strata_aio_config_init(&cfg);
    cfg.block_size = 256 << 10;
    strata_aio *aio = NULL;
    T_OK(strata_aio_create(&cfg, &aio));
    char path[4200];
    snprintf(path, sizeof path, "%s/full-%d", mnt, force_buffered);
    /* tmpfs takes O_DIRECT on recent kernels; the refusal is simulated to cover the fallback too. */
    if (force_buffered)
        nvme_fault_inject(0, NVME_FAULT_NODIRECT);
    strata_aio_file *f = NULL;
    T_OK(strata_aio_open(aio, path, STRATA_AIO_WRITE | STRATA_AIO_TRUNCATE, &f));
    nvme_fault_inject(0, NVME_FAULT_NONE);
    if (!f) {
        strata_aio_destroy(aio);
        return;
    }
    T_EQ_INT(strata_aio_file_is_direct(f), !force_buffered);
    const size_t first = 2 << 20, second = 4 << 20;
    void *a = NULL, *b = NULL, *r = NULL;
    T_OK(strata_aio_buffer_alloc(aio, first, &a));
    T_OK(strata_aio_buffer_alloc(aio, second, &b));
    T_OK(strata_aio_buffer_alloc(aio, first, &r));
    t_rand_bytes(a, first);
    t_rand_bytes(b, second);
    T_OK(strata_aio_pwrite(aio, f, a, first, 0));
    T_STATUS(strata_aio_pwrite(aio, f, b, second, first), STRATA_ENOSPC);
    T_CONTAINS(strata_aio_last_error(aio), path);
    T_CONTAINS(strata_aio_last_error(aio), "No space left on device (ENOSPC)");
    T_OK(strata_aio_pread(aio, f, r, first, 0));
    T_CHECK(memcmp(a, r, first) == 0, "data written before the filesystem filled up was damaged");
    T_OK(strata_aio_close(aio, f));
    unlink(path);
    strata_aio_destroy(aio);
}

static void swap_too_big(const char *mnt)
{
    strata_aio_config cfg;
    nvme_aio_defaults(&cfg);
    nvme_io *io = NULL;
    T_OK(nvme_io_create(&cfg, &io));
    const char *paths[] = {mnt};
    nvme_swap *s = NULL;
    T_STATUS(swap_create(io, paths, 1, 8u << 20, &s), STRATA_ENOSPC);
    T_CONTAINS(err_last(), mnt);
    T_CONTAINS(err_last(), "swap needs 8.00 MiB (8388608 bytes) but the filesystem has only");
    /* One that fits works, on the same small filesystem. */
    T_OK(swap_create(io, paths, 1, 1u << 20, &s));
    swap_destroy(s);
    nvme_io_destroy(io);
}

int main(void)
{
    char mnt[4096];
    snprintf(mnt, sizeof mnt, "%s", t_scratch_dir("t_nvme_enospc"));
    if (geteuid() != 0)
        t_skip("needs root to mount a small tmpfs");
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=4m,mode=0700") != 0)
        t_skip("cannot mount a tmpfs at %s: %s (no CAP_SYS_ADMIN in this sandbox?)", mnt, strerror(errno));
    fill_up(mnt, false);
    fill_up(mnt, true);
    swap_too_big(mnt);
    if (umount(mnt) != 0)
        fprintf(stderr, "warning: umount %s: %s\n", mnt, strerror(errno));
    return t_done();
}
