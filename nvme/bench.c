/* The NVMe bandwidth sweep: one pass of write, read or read+write for one configuration, verified. */
#include "nvme/bench.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "base/size.h"
#include "base/util.h"
#include "nvme/direct.h"
#include "nvme/io.h"

#define BENCH_FILE_GRAIN (8u << 20) /* every grid block size divides the per-file size */
#define LATENCY_SAMPLES (1u << 20)

struct bench_files {
    int npaths;
    int fd[STRATA_MAX_NVME_PATHS];   /* the private files, opened without O_DIRECT */
    char path[STRATA_MAX_NVME_PATHS][STRATA_PATH_BYTES];
    uint64_t per_file;
    strata_switch direct;
    bool is_direct;
    uint64_t seed;
};

typedef struct slot {
    io_wait w;
    char *buf;
    bool is_read;
    int file;
    uint64_t off;
    size_t len;
    uint64_t t0;
    struct pass *pass;
    int index;
} slot;

typedef struct pass {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int *done;           /* completed slot indices, FIFO */
    int ndone;
} pass;

const char *bench_mode_name(bench_mode mode)
{
    static const char *names[] = {"write", "read", "rw"};
    return (unsigned)mode < BENCH_MODES ? names[mode] : "?";
}

static uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Five words of each 4 KiB block depend on (seed, file, offset): start, middle and end. */
static void stamp(char *buf, size_t len, uint64_t seed, int file, uint64_t off)
{
    for (size_t at = 0; at + NVME_ALIGN <= len; at += NVME_ALIGN) {
        uint64_t *w = (uint64_t *)(buf + at);
        uint64_t v = mix(seed ^ ((uint64_t)file << 56) ^ (off + at));
        w[0] = v;
        w[1] = ~v;
        w[256] = v * 3;
        w[510] = v ^ 0x5a5a5a5a5a5a5a5aull;
        w[511] = off + at;
    }
}

static uint64_t count_wrong(const char *buf, size_t len, uint64_t seed, int file, uint64_t off)
{
    uint64_t wrong = 0;
    for (size_t at = 0; at + NVME_ALIGN <= len; at += NVME_ALIGN) {
        const uint64_t *w = (const uint64_t *)(buf + at);
        uint64_t v = mix(seed ^ ((uint64_t)file << 56) ^ (off + at));
        wrong += w[0] != v || w[1] != ~v || w[256] != v * 3 || w[510] != (v ^ 0x5a5a5a5a5a5a5a5aull) ||
                 w[511] != off + at;
    }
    return wrong;
}

static void on_done(io_wait *w, void *ctx)
{
    slot *s = ctx;
    pass *p = s->pass;
    pthread_mutex_lock(&p->mu);
    p->done[p->ndone++] = s->index;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec * 1e-6;
}

/* The op sequence of a pass: op k is block k % npaths-striped; rw mode reads the first half of
 * the blocks and rewrites the second half, alternating. */
typedef struct cursor {
    uint64_t ops_per_file, total_ops, next_read, next_write, issued;
} cursor;

static bool next_op(bench_files *bf, bench_mode mode, size_t bs, cursor *c, slot *s)
{
    if (c->issued >= c->total_ops)
        return false;
    uint64_t k;
    if (mode == BENCH_RW) {
        uint64_t half = c->total_ops / 2;
        s->is_read = c->issued % 2 == 0;
        k = s->is_read ? c->next_read++ % MAX(half, 1) : half + c->next_write++ % MAX(c->total_ops - half, 1);
    } else {
        s->is_read = mode == BENCH_READ;
        k = c->issued;
    }
    c->issued++;
    s->file = (int)(k % (uint64_t)bf->npaths);
    s->off = k / (uint64_t)bf->npaths * bs;
    s->len = (size_t)MIN((uint64_t)bs, bf->per_file - s->off);
    return true;
}

strata_status bench_run(bench_files *bf, const strata_aio_config *cfg, bench_mode mode, double max_seconds,
                        volatile sig_atomic_t *stop, bench_progress_fn progress, void *ctx, bench_result *out)
{
    memset(out, 0, sizeof *out);
    out->mode = mode;
    out->block_size = cfg->block_size;
    out->queue_depth = cfg->queue_depth;
    out->threads = cfg->intra_op_parallelism;
    nvme_io *io = NULL;
    ERR_CHECK(nvme_io_create(cfg, &io));
    strata_status st = STRATA_OK;
    nvme_file *files[STRATA_MAX_NVME_PATHS] = {0};
    int nslots = cfg->queue_depth * cfg->intra_op_parallelism;
    size_t bs = cfg->block_size;
    slot *slots = calloc((size_t)nslots, sizeof *slots);
    pass p = {.done = calloc((size_t)nslots, sizeof(int))};
    uint32_t *lat = malloc(LATENCY_SAMPLES * sizeof *lat);
    char *bufs = NULL;
    size_t buf_bytes = (size_t)nslots * bs;
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.cv, NULL);
    if (!slots || !p.done || !lat) {
        st = err_set(STRATA_ENOMEM, "nvme-bench: out of memory");
        goto out;
    }
    st = direct_buffer_alloc(buf_bytes, (void **)&bufs, NULL);
    if (st != STRATA_OK)
        goto out;
    nvme_io_register_buffer(io, bufs, buf_bytes);
    for (int i = 0; i < bf->npaths; i++) {
        /* Reopening the private file through /proc gives this run its own O_DIRECT description. */
        char proc[64];
        snprintf(proc, sizeof proc, "/proc/self/fd/%d", bf->fd[i]);
        st = nvme_io_open(io, proc, O_RDWR, 0600, &files[i]);
        if (st != STRATA_OK)
            goto out;
        snprintf(files[i]->path, sizeof files[i]->path, "%s", bf->path[i]);
    }
    cursor c = {.ops_per_file = (bf->per_file + bs - 1) / bs};
    c.total_ops = c.ops_per_file * (uint64_t)bf->npaths;
    uint64_t total_bytes = bf->per_file * (uint64_t)bf->npaths, done_bytes = 0;
    size_t nlat = 0;
    int active = 0;
    double cpu0 = cpu_seconds();
    uint64_t t_start = now_ns(), deadline = max_seconds > 0 ? t_start + (uint64_t)(max_seconds * 1e9) : UINT64_MAX;
    for (int i = 0; i < nslots; i++) {
        slot *s = &slots[i];
        io_wait_init(&s->w);
        io_wait_set_notify(&s->w, on_done, s);
        s->buf = bufs + (size_t)i * bs;
        s->pass = &p;
        s->index = i;
        /* Random filler so that nothing between the stamps is a run of zeros a virtual disk could elide. */
        for (size_t k = 0; k < bs / 8; k++)
            ((uint64_t *)s->buf)[k] = mix(bf->seed + k + (uint64_t)i * bs);
    }
    bool issuing = true;
    for (int i = 0; i < nslots || active > 0;) {
        slot *s = NULL;
        if (i < nslots) {
            s = &slots[i++];
        } else {
            pthread_mutex_lock(&p.mu);
            while (p.ndone == 0)
                pthread_cond_wait(&p.cv, &p.mu);
            s = &slots[p.done[0]];
            memmove(p.done, p.done + 1, (size_t)--p.ndone * sizeof(int));
            pthread_mutex_unlock(&p.mu);
            active--;
            strata_status ost = io_wait_wait(&s->w);
            if (ost != STRATA_OK) {
                if (out->errors++ == 0)
                    snprintf(out->first_error, sizeof out->first_error, "%s", err_last());
            } else {
                if (s->is_read)
                    out->wrong += count_wrong(s->buf, s->len, bf->seed, s->file, s->off);
                out->bytes += s->len;
                done_bytes += s->len;
            }
            if (nlat < LATENCY_SAMPLES)
                lat[nlat++] = (uint32_t)MIN((s->w.done_ns - s->t0) / 1000, UINT32_MAX);
            if (progress && (done_bytes & ((64u << 20) - 1)) < s->len)
                progress(done_bytes, total_bytes, ctx);
        }
        if (issuing && ((stop && *stop) || now_ns() > deadline))
            issuing = false;
        if (!issuing || !next_op(bf, mode, bs, &c, s))
            continue;
        if (!s->is_read)
            stamp(s->buf, s->len, bf->seed, s->file, s->off);
        s->t0 = now_ns();
        strata_status sst = nvme_io_submit(io, files[s->file], s->is_read ? RING_READ : RING_WRITE, s->buf, s->off,
                                           s->len, &s->w);
        if (sst != STRATA_OK) {
            st = sst;
            issuing = false;
            continue;
        }
        active++;
    }
    out->seconds = (double)(now_ns() - t_start) * 1e-9;
    double cpu = cpu_seconds() - cpu0;
    out->gbps = out->seconds > 0 ? (double)out->bytes / out->seconds * 1e-9 : 0;
    out->cpu_s_per_gb = out->bytes ? cpu / ((double)out->bytes * 1e-9) : 0;
    if (nlat) {
        qsort(lat, nlat, sizeof *lat, cmp_u32);
        out->p50_us = lat[nlat / 2];
        out->p99_us = lat[MIN(nlat - 1, nlat * 99 / 100)];
    }
    for (int i = 0; i < nslots; i++)
        io_wait_destroy(&slots[i].w);
out:
    for (int i = 0; i < bf->npaths; i++)
        nvme_io_close(io, files[i]);
    if (bufs)
        nvme_io_unregister_buffer(io, bufs);
    nvme_io_destroy(io);
    direct_buffer_free(bufs, buf_bytes);
    pthread_mutex_destroy(&p.mu);
    pthread_cond_destroy(&p.cv);
    free(lat);
    free(p.done);
    free(slots);
    return st;
}

strata_status bench_files_create(const char *const *paths, int npaths, uint64_t file_bytes, strata_switch direct,
                                 uint64_t seed, bench_progress_fn progress, void *ctx, bench_files **out)
{
    *out = NULL;
    if (npaths < 1 || npaths > STRATA_MAX_NVME_PATHS)
        return err_set(STRATA_EINVAL, "nvme-bench: %d paths given; between 1 and %d are allowed", npaths,
                       STRATA_MAX_NVME_PATHS);
    bench_files *bf = calloc(1, sizeof *bf);
    if (!bf)
        return err_set(STRATA_ENOMEM, "nvme-bench: out of memory");
    bf->seed = seed;
    bf->direct = direct;
    bf->per_file = MAX(align_up(file_bytes / (uint64_t)npaths, BENCH_FILE_GRAIN), BENCH_FILE_GRAIN);
    strata_status st = STRATA_OK;
    char eb[96];
    for (int i = 0; i < npaths; i++)
        bf->fd[i] = -1;
    for (int i = 0; i < npaths && st == STRATA_OK; i++) {
        snprintf(bf->path[i], sizeof bf->path[i], "%s", paths[i]);
        int fd = open(paths[i], O_RDWR | O_TMPFILE | O_CLOEXEC, 0600);
        if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR)) {
            /* No O_TMPFILE here: a named file, unlinked at once, vanishes just the same. */
            char name[STRATA_PATH_BYTES + 64];
            snprintf(name, sizeof name, "%s/.strata-nvme-bench-%d-%d", paths[i], (int)getpid(), i);
            fd = open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
            if (fd >= 0)
                unlink(name);
        }
        if (fd < 0) {
            st = err_set(err_from_errno(errno), "nvme-bench: cannot create a file in \"%s\": %s; the path must be a "
                         "writable directory", paths[i], err_errno_str(errno, eb, sizeof eb));
            break;
        }
        bf->fd[i] = fd;
        bf->npaths++;
        int rc = posix_fallocate(fd, 0, (off_t)bf->per_file);
        if (rc != 0) {
            char a[32];
            st = err_set(err_from_errno(rc), "nvme-bench: \"%s\": cannot allocate %s: %s; use a smaller --size",
                         paths[i], size_format(bf->per_file, a, sizeof a), err_errno_str(rc, eb, sizeof eb));
        }
    }
    if (st == STRATA_OK) {
        strata_aio_config cfg;
        nvme_aio_defaults(&cfg);
        cfg.direct = direct;
        cfg.block_size = 4u << 20;
        bench_result r;
        st = bench_run(bf, &cfg, BENCH_WRITE, 0, NULL, progress, ctx, &r);
        if (st == STRATA_OK && r.errors)
            st = err_set(STRATA_EIO, "nvme-bench: writing the test data failed: %s", r.first_error);
        /* Which I/O the runs get is decided by the same policy; probe it once. */
        nvme_io *io = NULL;
        nvme_file *f = NULL;
        char proc[64];
        snprintf(proc, sizeof proc, "/proc/self/fd/%d", bf->fd[0]);
        if (st == STRATA_OK && (st = nvme_io_create(&cfg, &io)) == STRATA_OK &&
            (st = nvme_io_open(io, proc, O_RDWR, 0600, &f)) == STRATA_OK)
            bf->is_direct = f->direct;
        nvme_io_close(io, f);
        nvme_io_destroy(io);
    }
    if (st != STRATA_OK) {
        bench_files_destroy(bf);
        return st;
    }
    *out = bf;
    return STRATA_OK;
}

void bench_files_destroy(bench_files *bf)
{
    if (!bf)
        return;
    for (int i = 0; i < bf->npaths; i++)
        if (bf->fd[i] >= 0)
            close(bf->fd[i]);
    free(bf);
}

bool bench_files_direct(const bench_files *bf)
{
    return bf->is_direct;
}

uint64_t bench_files_bytes(const bench_files *bf)
{
    return bf->per_file * (uint64_t)bf->npaths;
}

bool bench_drop_caches(bench_files *bf)
{
    for (int i = 0; i < bf->npaths; i++) {
        fdatasync(bf->fd[i]);
        posix_fadvise(bf->fd[i], 0, 0, POSIX_FADV_DONTNEED);
    }
    int fd = open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
    bool ok = fd >= 0 && write(fd, "1", 1) == 1;
    if (fd >= 0)
        close(fd);
    if (!ok)
        LOG_ONCE(STRATA_LOG_INFO, LOG_IO, "nvme-bench: cannot drop the page cache (needs root); "
                                          "buffered runs may read from RAM");
    return ok;
}
