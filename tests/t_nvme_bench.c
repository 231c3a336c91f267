/* The benchmark's verification can fail: clean passes count 0 wrong; a block changed behind its
 * back is counted in #wrong by a verified pass and by no other; an injected EIO is counted as an
 * error with the path, not as data. */
#include <fcntl.h>
#include <unistd.h>

#include "base/error.h"
#include "tools/nvme_bench_run.h"
#include "nvme/fault.h"
#include "nvme/io.h"
#include "testlib.h"

static bool is_deleted_file_in(int fd, const char *target, void *dir)
{
    (void)fd;
    return strncmp(target, dir, strlen(dir)) == 0 && strstr(target, "(deleted)");
}

/* The benchmark's private file is unlinked; find its descriptor among ours by its deleted name (between runs
 * only the base file is open). */
static int find_bench_fd(const char *dir)
{
    return t_each_open_fd(is_deleted_file_in, (void *)dir);
}

int main(void)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", t_scratch_dir("t_nvme_bench"));
    bench_files *bf = NULL;
    T_OK(bench_files_create((const char *const[]){dir}, 1, 8u << 20, STRATA_SWITCH_AUTO, t_rng_seed(), NULL, NULL,
                            &bf));
    if (!bf)
        return t_done();
    T_EQ_INT(bench_files_bytes(bf), 8u << 20);
    strata_aio_config cfg;
    nvme_aio_defaults(&cfg);
    cfg.block_size = 256 << 10;
    cfg.queue_depth = 4;
    bench_result r;
    for (int m = 0; m < BENCH_MODES; m++) {
        T_OK(bench_run(bf, &cfg, (bench_mode)m, true, 0, NULL, NULL, NULL, &r));
        T_EQ_INT(r.verified, bench_mode_reads((bench_mode)m));
        T_EQ_INT(r.wrong, 0);
        T_EQ_INT(r.errors, 0);
        T_EQ_INT(r.bytes, 8u << 20);
        T_CHECK(r.gbps > 0 && r.p99_us >= r.p50_us, "%s: gbps %.3f p50 %.0f p99 %.0f", bench_mode_name(r.mode),
                r.gbps, r.p50_us, r.p99_us);
    }

    /* Overwrite two 4 KiB blocks of the file behind the benchmark's back. */
    int fd = find_bench_fd(dir);
    T_CHECK(fd >= 0, "cannot find the benchmark's file descriptor");
    if (fd >= 0) {
        char junk[8192];
        t_rand_bytes(junk, sizeof junk);
        T_EQ_INT(pwrite(fd, junk, sizeof junk, 1 << 20), (long long)sizeof junk);
        fsync(fd);
        /* The benchmark reads with O_DIRECT; drop any cached copy for a buffered fallback. */
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        T_OK(bench_run(bf, &cfg, BENCH_READ, true, 0, NULL, NULL, NULL, &r));
        T_EQ_INT(r.wrong, 2);
        /* The same reads timed only: nothing is looked at, so nothing is counted. */
        T_OK(bench_run(bf, &cfg, BENCH_READ, false, 0, NULL, NULL, NULL, &r));
        T_EQ_INT(r.verified, false);
        T_EQ_INT(r.wrong, 0);
        T_EQ_INT(r.bytes, 8u << 20);
    }

    nvme_fault_inject(3, NVME_FAULT_EIO);
    T_OK(bench_run(bf, &cfg, BENCH_READ, true, 0, NULL, NULL, NULL, &r));
    T_EQ_INT(r.errors, 1);
    T_CONTAINS(r.first_error, dir);
    T_CONTAINS(r.first_error, "Input/output error (EIO)");
    T_EQ_INT(r.bytes, (8u << 20) - cfg.block_size);
    bench_files_destroy(bf);
    return t_done();
}
