/* The io_uring engine moves bytes exactly: random data at odd sizes and offsets, buffered and
 * direct, one ring and several, concurrent readers and writers, reads past the end refused. */
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/util.h"
#include "nvme/direct.h"
#include "nvme/io.h"
#include "testlib.h"

static char path_buf[4200];

static const char *scratch_file(const char *dir, const char *name)
{
    snprintf(path_buf, sizeof path_buf, "%.4000s/%s", dir, name);
    return path_buf;
}

static strata_status do_io(nvme_io *io, nvme_file *f, ring_op op, void *buf, uint64_t off, size_t len)
{
    return nvme_io_sync(io, f, op, buf, off, len);
}

/* Writes random data at many offsets (lengths not multiples of the block) and reads it back
 * through a second buffer; the oracle is a copy of the file kept in memory. */
static void round_trips_cfg(const char *dir, const strata_aio_config *c)
{
    strata_aio_config cfg = *c;
    strata_switch direct = cfg.direct;
    int threads = cfg.intra_op_parallelism;
    size_t block = cfg.block_size;
    nvme_io *io = NULL;
    T_OK(nvme_io_create(&cfg, &io));
    if (!io)
        return;
    nvme_file *f = NULL;
    T_OK(nvme_io_open(io, scratch_file(dir, "rt"), O_RDWR | O_CREAT | O_TRUNC, 0600, &f));
    if (!f) {
        nvme_io_destroy(io);
        return;
    }
    const size_t file_bytes = 3u << 20;
    unsigned char *oracle = calloc(1, file_bytes);
    void *wbuf = NULL, *rbuf = NULL;
    T_OK(direct_buffer_alloc(file_bytes, &wbuf, NULL));
    T_OK(direct_buffer_alloc(file_bytes, &rbuf, NULL));
    /* Fill the file first so that every later read lies inside written data. */
    t_rand_bytes(oracle, file_bytes);
    memcpy(wbuf, oracle, file_bytes);
    T_OK(do_io(io, f, RING_WRITE, wbuf, 0, file_bytes));
    size_t unit = f->direct ? NVME_ALIGN : 1;
    for (int i = 0; i < 40; i++) {
        size_t len = t_rand_range(1, file_bytes / unit / 2) * unit;
        if (!f->direct && i % 3 == 0)
            len = block + t_rand_range(1, 4095); /* just over one block */
        uint64_t off = t_rand_range(0, (file_bytes - len) / unit) * unit;
        t_rand_bytes(wbuf, len);
        memcpy(oracle + off, wbuf, len);
        T_OK(do_io(io, f, RING_WRITE, wbuf, off, len));
        memset(rbuf, 0xA5, file_bytes);
        uint64_t roff = t_rand_range(0, (file_bytes - len) / unit) * unit;
        T_OK(do_io(io, f, RING_READ, rbuf, roff, len));
        T_CHECK(memcmp(rbuf, oracle + roff, len) == 0, "direct=%d threads=%d block=%zu: read %zu bytes at %llu differ",
                f->direct, threads, block, len, (unsigned long long)roff);
    }
    T_OK(do_io(io, f, RING_READ, rbuf, 0, file_bytes));
    T_CHECK(memcmp(rbuf, oracle, file_bytes) == 0, "whole file differs from the oracle (direct=%d threads=%d)",
            f->direct, threads);
    if (direct == STRATA_SWITCH_OFF)
        T_CHECK(!f->direct, "aio.direct=false must open buffered");
    direct_buffer_free(wbuf, file_bytes);
    direct_buffer_free(rbuf, file_bytes);
    free(oracle);
    nvme_io_close(io, f);
    nvme_io_destroy(io);
}

static void round_trips(const char *dir, strata_switch direct, int threads, size_t block, int qd)
{
    strata_aio_config cfg;
    nvme_aio_defaults(&cfg);
    cfg.direct = direct;
    cfg.intra_op_parallelism = threads;
    cfg.block_size = block;
    cfg.queue_depth = qd;
    round_trips_cfg(dir, &cfg);
}

/* The submission variants: one syscall per piece, no overlap between batches, SQPOLL. */
static void round_trip_variants(const char *dir)
{
    strata_aio_config cfg;
    nvme_aio_defaults(&cfg);
    cfg.block_size = 64 << 10;
    cfg.queue_depth = 8;
    cfg.single_submit = true;
    round_trips_cfg(dir, &cfg);
    cfg.single_submit = false;
    cfg.overlap_events = false;
    round_trips_cfg(dir, &cfg);
    cfg.overlap_events = true;
    cfg.sqpoll = STRATA_SWITCH_AUTO;
    nvme_io *io = NULL;
    T_OK(nvme_io_create(&cfg, &io));
    printf("sqpoll %s here\n", io && nvme_io_caps(io).sqpoll ? "granted" : "refused (fell back)");
    nvme_io_destroy(io);
    round_trips_cfg(dir, &cfg);
}

/* Reading past what was written is an error naming the path, never zero-filled success. */
static void read_beyond_end(const char *dir, strata_switch direct)
{
    strata_aio_config cfg;
    nvme_aio_defaults(&cfg);
    cfg.direct = direct;
    cfg.block_size = 64 << 10;
    nvme_io *io = NULL;
    T_OK(nvme_io_create(&cfg, &io));
    nvme_file *f = NULL;
    const char *path = scratch_file(dir, "eof");
    T_OK(nvme_io_open(io, path, O_RDWR | O_CREAT | O_TRUNC, 0600, &f));
    const size_t n = 256 << 10;
    void *buf = NULL;
    T_OK(direct_buffer_alloc(2 * n, &buf, NULL));
    t_rand_bytes(buf, n);
    T_OK(do_io(io, f, RING_WRITE, buf, 0, n));
    /* Ends inside the data then runs past it. */
    T_STATUS(do_io(io, f, RING_READ, buf, n / 2, n), STRATA_EIO);
    T_CONTAINS(err_last(), "read beyond end of data");
    T_CONTAINS(err_last(), path);
    /* Starts past the end. */
    T_STATUS(do_io(io, f, RING_READ, buf, 2 * n, NVME_ALIGN), STRATA_EIO);
    T_CONTAINS(err_last(), "read beyond end of data");
    if (!f->direct) {
        /* A file length off the block grid: the last partial bytes read, the rest is refused. */
        T_OK(do_io(io, f, RING_WRITE, buf, n, 100));
        T_STATUS(do_io(io, f, RING_READ, buf, n - 4096, 8192), STRATA_EIO);
        T_CONTAINS(err_last(), "read beyond end of data");
    }
    direct_buffer_free(buf, 2 * n);
    nvme_io_close(io, f);
    nvme_io_destroy(io);
}

typedef struct worker {
    nvme_io *io;
    nvme_file *f;
    uint64_t region;
    size_t bytes;
    int rounds;
    int bad;
    strata_status st;
} worker;

/* Each worker owns one region of the file: write random data, read it back, compare. Many
 * workers at once put readers and writers on the same rings concurrently. */
static void *worker_main(void *arg)
{
    worker *wk = arg;
    void *w = NULL, *r = NULL;
    direct_buffer_alloc(wk->bytes, &w, NULL);
    direct_buffer_alloc(wk->bytes, &r, NULL);
    unsigned seed = (unsigned)wk->region * 2654435761u;
    for (int i = 0; i < wk->rounds && wk->st == STRATA_OK; i++) {
        unsigned char *p = w;
        for (size_t k = 0; k < wk->bytes; k++)
            p[k] = (unsigned char)(rand_r(&seed) >> 7);
        wk->st = do_io(wk->io, wk->f, RING_WRITE, w, wk->region, wk->bytes);
        if (wk->st == STRATA_OK)
            wk->st = do_io(wk->io, wk->f, RING_READ, r, wk->region, wk->bytes);
        if (wk->st == STRATA_OK && memcmp(w, r, wk->bytes) != 0)
            wk->bad++;
    }
    direct_buffer_free(w, wk->bytes);
    direct_buffer_free(r, wk->bytes);
    return NULL;
}

static void concurrent(const char *dir, int threads)
{
    strata_aio_config cfg;
    nvme_aio_defaults(&cfg);
    cfg.intra_op_parallelism = threads;
    cfg.block_size = 128 << 10;
    cfg.queue_depth = 8;
    nvme_io *io = NULL;
    T_OK(nvme_io_create(&cfg, &io));
    nvme_file *f = NULL;
    T_OK(nvme_io_open(io, scratch_file(dir, "conc"), O_RDWR | O_CREAT | O_TRUNC, 0600, &f));
    enum { N = 6 };
    worker wk[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        wk[i] = (worker){.io = io, .f = f, .region = (uint64_t)i << 20, .bytes = 512 << 10, .rounds = 6};
        pthread_create(&th[i], NULL, worker_main, &wk[i]);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        T_CHECK(wk[i].st == STRATA_OK, "worker %d: %s", i, strata_status_name(wk[i].st));
        T_EQ_INT(wk[i].bad, 0);
    }
    nvme_io_close(io, f);
    nvme_io_destroy(io);
}

/* Destroying the handle with requests queued: those in flight are drained, the rest finish as
 * canceled; every request is accounted for and nothing hangs. */
static void destroy_cancels(const char *dir)
{
    strata_aio_config cfg;
    nvme_aio_defaults(&cfg);
    cfg.block_size = 64 << 10;
    cfg.queue_depth = 1;
    cfg.direct = STRATA_SWITCH_OFF;
    nvme_io *io = NULL;
    T_OK(nvme_io_create(&cfg, &io));
    /* A file the rings do not register, so that it outlives the handle. */
    nvme_file f = {.fd = open(scratch_file(dir, "cancel"), O_RDWR | O_CREAT | O_TRUNC, 0600), .slot = -1};
    snprintf(f.path, sizeof f.path, "%.500s", path_buf);
    enum { N = 32, LEN = 1 << 20 };
    char *buf = calloc(N, LEN);
    T_OK(do_io(io, &f, RING_WRITE, buf, 0, (size_t)N * LEN));
    io_wait w;
    io_wait_init(&w);
    for (int i = 0; i < N; i++)
        T_OK(nvme_io_submit(io, &f, RING_READ, buf + (size_t)i * LEN, (uint64_t)i * LEN, LEN, &w));
    nvme_io_destroy(io);
    T_CHECK(io_wait_idle(&w), "requests left pending after destroy");
    strata_status st = io_wait_wait(&w);
    T_CHECK(st == STRATA_OK || st == STRATA_ECANCELED, "destroy: %s (%s)", strata_status_name(st), err_last());
    if (st == STRATA_ECANCELED)
        T_CONTAINS(err_last(), "canceled: the I/O handle was destroyed before it finished");
    else
        printf("note: all %d requests finished before destroy; cancellation not exercised this run\n", N);
    io_wait_destroy(&w);
    close(f.fd);
    free(buf);
}

static void bad_config(void)
{
    strata_aio_config cfg;
    nvme_aio_defaults(&cfg);
    cfg.queue_depth = 0;
    nvme_io *io = NULL;
    T_STATUS(nvme_io_create(&cfg, &io), STRATA_ECONFIG);
    T_CONTAINS(err_last(), "aio.queue_depth = 0 is out of range [1, 1024]");
    nvme_aio_defaults(&cfg);
    cfg.block_size = 1000;
    T_STATUS(nvme_io_create(&cfg, &io), STRATA_ECONFIG);
    T_CONTAINS(err_last(), "aio.block_size = 1000");
    T_CHECK(io == NULL, "out must be NULL on failure");
}

int main(void)
{
    const char *dir = t_scratch_dir("t_nvme_io");
    char dirc[4096];
    snprintf(dirc, sizeof dirc, "%s", dir);
    bad_config();
    round_trips(dirc, STRATA_SWITCH_AUTO, 1, 128 << 10, 4);
    round_trips(dirc, STRATA_SWITCH_AUTO, 3, 64 << 10, 16);
    round_trips(dirc, STRATA_SWITCH_OFF, 1, 128 << 10, 2);
    round_trips(dirc, STRATA_SWITCH_OFF, 2, 256 << 10, 32);
    round_trip_variants(dirc);
    read_beyond_end(dirc, STRATA_SWITCH_AUTO);
    read_beyond_end(dirc, STRATA_SWITCH_OFF);
    concurrent(dirc, 1);
    concurrent(dirc, 3);
    destroy_cancels(dirc);
    return t_done();
}
