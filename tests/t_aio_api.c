/* The public strata_aio handle: async and sync round trips at many offsets, unaligned direct
 * I/O rejected with the value named, close refused while I/O is in flight, bad arguments. */
#include <fcntl.h>

#include "testlib.h"

static void round_trips(const char *dir, int threads)
{
    strata_aio_config cfg;
    T_OK(strata_aio_config_init(&cfg));
    T_EQ_INT(cfg.block_size, 1 << 20);
    T_EQ_INT(cfg.queue_depth, 32);
    cfg.block_size = 128 << 10;
    cfg.intra_op_parallelism = threads;
    strata_aio *aio = NULL;
    T_OK(strata_aio_create(&cfg, &aio));
    char path[4200];
    snprintf(path, sizeof path, "%s/api-%d", dir, threads);
    strata_aio_file *f = NULL;
    T_OK(strata_aio_open(aio, path, STRATA_AIO_WRITE | STRATA_AIO_TRUNCATE, &f));
    const size_t n = 8;
    const size_t each = (1 << 20) + 4096 * 3; /* not a multiple of the block size */
    void *w[8], *r[8];
    for (size_t i = 0; i < n; i++) {
        T_OK(strata_aio_buffer_alloc(aio, each, &w[i]));
        T_OK(strata_aio_buffer_alloc(aio, each, &r[i]));
        t_rand_bytes(w[i], each);
        T_OK(strata_aio_write(aio, f, w[i], each, (uint64_t)i * each));
    }
    /* Close is refused while writes may be in flight (it may also have drained already). */
    strata_status st = strata_aio_close(aio, f);
    if (st != STRATA_OK) {
        T_EQ_INT(st, STRATA_EBUSY);
        T_CONTAINS(strata_aio_last_error(aio), "call strata_aio_wait() first");
    } else {
        T_OK(strata_aio_open(aio, path, STRATA_AIO_WRITE, &f));
    }
    T_OK(strata_aio_wait(aio));
    for (size_t i = n; i-- > 0;)
        T_OK(strata_aio_read(aio, f, r[i], each, (uint64_t)i * each));
    T_OK(strata_aio_wait(aio));
    for (size_t i = 0; i < n; i++)
        T_CHECK(memcmp(w[i], r[i], each) == 0, "buffer %zu differs after an async round trip", i);
    /* Sync variants at a few random aligned offsets. */
    for (int k = 0; k < 10; k++) {
        size_t len = t_rand_range(1, 64) * 4096;
        uint64_t off = t_rand_range(0, (n * each - len) / 4096) * 4096;
        t_rand_bytes(w[0], len);
        T_OK(strata_aio_pwrite(aio, f, w[0], len, off));
        T_OK(strata_aio_pread(aio, f, r[0], len, off));
        T_CHECK(memcmp(w[0], r[0], len) == 0, "sync round trip of %zu bytes at %llu differs", len,
                (unsigned long long)off);
    }
    if (strata_aio_file_is_direct(f)) {
        T_STATUS(strata_aio_read(aio, f, (char *)r[0] + 8, 4096, 0), STRATA_EINVAL);
        T_CONTAINS(strata_aio_last_error(aio), "buffer address");
        T_CONTAINS(strata_aio_last_error(aio), "is not a multiple of 4096");
        T_STATUS(strata_aio_pwrite(aio, f, w[0], 4096, 512), STRATA_EINVAL);
        T_CONTAINS(strata_aio_last_error(aio), "file offset 0x200 (512) is not a multiple of 4096");
        T_STATUS(strata_aio_pread(aio, f, r[0], 1000, 0), STRATA_EINVAL);
        T_CONTAINS(strata_aio_last_error(aio), "length 0x3e8 (1000) is not a multiple of 4096");
        T_CONTAINS(strata_aio_last_error(aio), path);
    } else {
        printf("note: %s is not direct here; unaligned checks skipped\n", path);
    }
    T_STATUS(strata_aio_pread(aio, f, r[0], 4096, (uint64_t)n * each + 4096 * 10), STRATA_EIO);
    T_CONTAINS(strata_aio_last_error(aio), "read beyond end of data");
    T_OK(strata_aio_wait(aio));
    strata_aio_buffer_free(aio, w[0]); /* the rest are freed by destroy */
    strata_aio_destroy(aio);
}

static void bad_arguments(const char *dir)
{
    strata_aio *aio = NULL;
    strata_aio_config cfg;
    strata_aio_config_init(&cfg);
    cfg.intra_op_parallelism = 0;
    T_STATUS(strata_aio_create(&cfg, &aio), STRATA_ECONFIG);
    T_CONTAINS(strata_aio_last_error(NULL), "aio.intra_op_parallelism = 0 is out of range [1, 64]");
    T_CHECK(aio == NULL, "out must be NULL on failure");
    T_OK(strata_aio_create(NULL, &aio));
    strata_aio_file *f = NULL;
    char path[4200];
    snprintf(path, sizeof path, "%s/missing", dir);
    T_STATUS(strata_aio_open(aio, path, STRATA_AIO_READ, &f), STRATA_ENOTFOUND);
    T_CONTAINS(strata_aio_last_error(aio), "No such file or directory (ENOENT)");
    T_CONTAINS(strata_aio_last_error(aio), path);
    T_STATUS(strata_aio_open(aio, path, 0, &f), STRATA_EINVAL);
    strata_aio_destroy(aio);
    strata_aio_destroy(NULL);
}

int main(void)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", t_scratch_dir("t_aio_api"));
    round_trips(dir, 1);
    round_trips(dir, 2);
    bad_arguments(dir);
    return t_done();
}
