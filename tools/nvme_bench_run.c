/* The NVMe bandwidth sweep of `strata nvme-bench`: one pass of write, read or read+write for one configuration,
 * verified or timed only. A benchmark of the CLI, not a part of libstrata. */
#include "tools/nvme_bench_run.h"

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

bool bench_mode_reads(bench_mode mode)
{
    return mode == BENCH_READ || mode == BENCH_RW;
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

/* One pass: its I/O and files, the slots (queue depth x threads of them) and their buffers, the completion queue,
 * the latency samples and the counters the result is made of. */
typedef struct run {
    bench_files *bf;
    bench_mode mode;
    bool verify;
    size_t bs;
    nvme_io *io;
    nvme_file *files[STRATA_MAX_NVME_PATHS];
    slot *slots;
    int nslots;
    bool slots_ready; /* their waits exist */
    pass p;
    char *bufs;
    size_t buf_bytes;
    uint32_t *lat;
    size_t nlat;
    cursor c;
    uint64_t total_bytes, done_bytes;
    int active; /* requests in flight */
    bool issuing;
    uint64_t deadline;
    volatile sig_atomic_t *stop;
    bench_progress_fn progress;
    void *ctx;
    bench_result *out;
} run;

/* The slots' waits, buffers and filler. */
static void run_init_slots(run *r)
{
    for (int i = 0; i < r->nslots; i++) {
        slot *s = &r->slots[i];
        io_wait_init(&s->w);
        io_wait_set_notify(&s->w, on_done, s);
        s->buf = r->bufs + (size_t)i * r->bs;
        s->pass = &r->p;
        s->index = i;
        /* Random filler so that nothing between the stamps is a run of zeros a virtual disk could elide. */
        for (size_t k = 0; k < r->bs / 8; k++)
            ((uint64_t *)s->buf)[k] = mix(r->bf->seed + k + (uint64_t)i * r->bs);
    }
    r->slots_ready = true;
}

/* What a pass of cfg needs: the I/O, the memory, the files reopened for it (the slots are made on the clock). */
static strata_status run_open(run *r, const strata_aio_config *cfg)
{
    r->nslots = cfg->queue_depth * cfg->intra_op_parallelism;
    r->bs = cfg->block_size;
    r->buf_bytes = (size_t)r->nslots * r->bs;
    pthread_mutex_init(&r->p.mu, NULL);
    pthread_cond_init(&r->p.cv, NULL);
    ERR_CHECK(nvme_io_create(cfg, &r->io));
    r->slots = calloc((size_t)r->nslots, sizeof *r->slots);
    r->p.done = calloc((size_t)r->nslots, sizeof(int));
    r->lat = malloc(LATENCY_SAMPLES * sizeof *r->lat);
    if (!r->slots || !r->p.done || !r->lat)
        return err_set(STRATA_ENOMEM, "nvme-bench: out of memory");
    ERR_CHECK(direct_buffer_alloc(r->buf_bytes, (void **)&r->bufs, NULL));
    nvme_io_register_buffer(r->io, r->bufs, r->buf_bytes);
    for (int i = 0; i < r->bf->npaths; i++) {
        /* Reopening the private file through /proc gives this run its own O_DIRECT description. */
        char proc[64];
        snprintf(proc, sizeof proc, "/proc/self/fd/%d", r->bf->fd[i]);
        ERR_CHECK(nvme_io_open(r->io, proc, O_RDWR, 0600, &r->files[i]));
        snprintf(r->files[i]->path, sizeof r->files[i]->path, "%s", r->bf->path[i]);
    }
    r->c = (cursor){.ops_per_file = (r->bf->per_file + r->bs - 1) / r->bs};
    r->c.total_ops = r->c.ops_per_file * (uint64_t)r->bf->npaths;
    r->total_bytes = r->bf->per_file * (uint64_t)r->bf->npaths;
    return STRATA_OK;
}

static void run_close(run *r)
{
    for (int i = 0; i < r->nslots && r->slots_ready; i++)
        io_wait_destroy(&r->slots[i].w);
    for (int i = 0; i < r->bf->npaths; i++)
        nvme_io_close(r->io, r->files[i]);
    if (r->bufs)
        nvme_io_unregister_buffer(r->io, r->bufs);
    nvme_io_destroy(r->io);
    direct_buffer_free(r->bufs, r->buf_bytes);
    pthread_mutex_destroy(&r->p.mu);
    pthread_cond_destroy(&r->p.cv);
    free(r->lat);
    free(r->p.done);
    free(r->slots);
}

/* The slot whose request completed first of those not yet taken (FIFO). */
static slot *run_next_done(run *r)
{
    pass *p = &r->p;
    pthread_mutex_lock(&p->mu);
    while (p->ndone == 0)
        pthread_cond_wait(&p->cv, &p->mu);
    slot *s = &r->slots[p->done[0]];
    memmove(p->done, p->done + 1, (size_t)--p->ndone * sizeof(int));
    pthread_mutex_unlock(&p->mu);
    r->active--;
    return s;
}

/* Counts s's completed request: an error, or its bytes (and for a read, its wrong blocks); its latency; progress. */
static void run_account(run *r, slot *s)
{
    bench_result *out = r->out;
    if (io_wait_wait(&s->w) != STRATA_OK) {
        if (out->errors++ == 0)
            snprintf(out->first_error, sizeof out->first_error, "%s", err_last());
    } else {
        if (s->is_read && r->verify)
            out->wrong += count_wrong(s->buf, s->len, r->bf->seed, s->file, s->off);
        out->bytes += s->len;
        r->done_bytes += s->len;
    }
    if (r->nlat < LATENCY_SAMPLES)
        r->lat[r->nlat++] = (uint32_t)MIN((s->w.done_ns - s->t0) / 1000, UINT32_MAX);
    if (r->progress && (r->done_bytes & ((64u << 20) - 1)) < s->len)
        r->progress(r->done_bytes, r->total_bytes, r->ctx);
}

/* Puts the pass's next request on slot s, unless the pass stops issuing (stopped, past its deadline, done, or a
 * submit failed: that failure is returned). */
static strata_status run_issue(run *r, slot *s)
{
    if (r->issuing && ((r->stop && *r->stop) || now_ns() > r->deadline))
        r->issuing = false;
    if (!r->issuing || !next_op(r->bf, r->mode, r->bs, &r->c, s))
        return STRATA_OK;
    if (!s->is_read)
        stamp(s->buf, s->len, r->bf->seed, s->file, s->off);
    s->t0 = now_ns();
    strata_status st = nvme_io_submit(r->io, r->files[s->file], s->is_read ? RING_READ : RING_WRITE, s->buf, s->off,
                                      s->len, &s->w);
    if (st != STRATA_OK) {
        r->issuing = false;
        return st;
    }
    r->active++;
    return STRATA_OK;
}

/* Every slot issues once, then each completion is counted and its slot issues again, until nothing is in flight.
 * Returns the last submit failure, if any. */
static strata_status run_loop(run *r)
{
    strata_status st = STRATA_OK;
    r->issuing = true;
    for (int i = 0; i < r->nslots || r->active > 0;) {
        slot *s;
        if (i < r->nslots) {
            s = &r->slots[i++];
        } else {
            s = run_next_done(r);
            run_account(r, s);
        }
        strata_status sst = run_issue(r, s);
        if (sst != STRATA_OK)
            st = sst;
    }
    return st;
}

/* Rate, CPU cost and latency percentiles of the pass. */
static void run_summarize(run *r, uint64_t t_start, double cpu0)
{
    bench_result *out = r->out;
    out->seconds = (double)(now_ns() - t_start) * 1e-9;
    double cpu = cpu_seconds() - cpu0;
    out->gbps = out->seconds > 0 ? (double)out->bytes / out->seconds * 1e-9 : 0;
    out->cpu_s_per_gb = out->bytes ? cpu / ((double)out->bytes * 1e-9) : 0;
    if (r->nlat) {
        qsort(r->lat, r->nlat, sizeof *r->lat, cmp_u32);
        out->p50_us = r->lat[r->nlat / 2];
        out->p99_us = r->lat[MIN(r->nlat - 1, r->nlat * 99 / 100)];
    }
}

strata_status bench_run(bench_files *bf, const strata_aio_config *cfg, bench_mode mode, bool verify,
                        double max_seconds, volatile sig_atomic_t *stop, bench_progress_fn progress, void *ctx,
                        bench_result *out)
{
    memset(out, 0, sizeof *out);
    out->mode = mode;
    out->verified = verify && bench_mode_reads(mode);
    out->block_size = cfg->block_size;
    out->queue_depth = cfg->queue_depth;
    out->threads = cfg->intra_op_parallelism;
    run r = {.bf = bf, .mode = mode, .verify = verify, .stop = stop, .progress = progress, .ctx = ctx, .out = out};
    strata_status st = run_open(&r, cfg);
    if (st == STRATA_OK) {
        double cpu0 = cpu_seconds();
        uint64_t t_start = now_ns();
        r.deadline = max_seconds > 0 ? t_start + (uint64_t)(max_seconds * 1e9) : UINT64_MAX;
        run_init_slots(&r);
        st = run_loop(&r);
        run_summarize(&r, t_start, cpu0);
    }
    run_close(&r);
    return st;
}

/* A private file in dir, of per_file bytes: O_TMPFILE, or a named file unlinked at once where that is missing. */
static strata_status open_private_file(const char *dir, int i, uint64_t per_file, int *fd_out)
{
    char eb[96];
    int fd = open(dir, O_RDWR | O_TMPFILE | O_CLOEXEC, 0600);
    if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR)) {
        /* No O_TMPFILE here: a named file, unlinked at once, vanishes just the same. */
        char name[STRATA_PATH_BYTES + 64];
        snprintf(name, sizeof name, "%s/.strata-nvme-bench-%d-%d", dir, (int)getpid(), i);
        fd = open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd >= 0)
            unlink(name);
    }
    if (fd < 0)
        return err_set(err_from_errno(errno), "nvme-bench: cannot create a file in \"%s\": %s; the path must be a "
                       "writable directory", dir, err_errno_str(errno, eb, sizeof eb));
    *fd_out = fd;
    int rc = posix_fallocate(fd, 0, (off_t)per_file);
    if (rc != 0) {
        char a[32];
        return err_set(err_from_errno(rc), "nvme-bench: \"%s\": cannot allocate %s: %s; use a smaller --size", dir,
                       size_format(per_file, a, sizeof a), err_errno_str(rc, eb, sizeof eb));
    }
    return STRATA_OK;
}

/* Writes the pattern over the whole of bf's files, then probes once which I/O (O_DIRECT or buffered) the runs get
 * under the same policy. */
static strata_status fill_and_probe(bench_files *bf, bench_progress_fn progress, void *ctx)
{
    strata_aio_config cfg;
    nvme_aio_defaults(&cfg);
    cfg.direct = bf->direct;
    cfg.block_size = 4u << 20;
    bench_result r;
    strata_status st = bench_run(bf, &cfg, BENCH_WRITE, false, 0, NULL, progress, ctx, &r);
    if (st == STRATA_OK && r.errors)
        st = err_set(STRATA_EIO, "nvme-bench: writing the test data failed: %s", r.first_error);
    nvme_io *io = NULL;
    nvme_file *f = NULL;
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", bf->fd[0]);
    if (st == STRATA_OK && (st = nvme_io_create(&cfg, &io)) == STRATA_OK &&
        (st = nvme_io_open(io, proc, O_RDWR, 0600, &f)) == STRATA_OK)
        bf->is_direct = f->direct;
    nvme_io_close(io, f);
    nvme_io_destroy(io);
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
    for (int i = 0; i < npaths && st == STRATA_OK; i++) {
        snprintf(bf->path[i], sizeof bf->path[i], "%s", paths[i]);
        bf->fd[i] = -1;
        st = open_private_file(paths[i], i, bf->per_file, &bf->fd[i]);
        if (bf->fd[i] >= 0)
            bf->npaths++;
    }
    if (st == STRATA_OK)
        st = fill_and_probe(bf, progress, ctx);
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
