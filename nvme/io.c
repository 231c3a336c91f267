/* The engine-independent NVMe I/O handle: rings, files, registered buffers, request dispatch. */
#include "nvme/io.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "base/util.h"
#include "nvme/direct.h"

/* io_uring refuses to register more than 1 GiB as one buffer, so larger ones take several slots. */
#define FIXED_BUF_MAX ((size_t)1 << 30)

typedef struct fixed_buf {
    char *base;
    size_t len;
    void *owner; /* the pointer given to nvme_io_register_buffer */
} fixed_buf;

struct nvme_io {
    strata_aio_config cfg;
    int nrings;
    ring *rings[NVME_MAX_RINGS];
    pthread_mutex_t mu; /* guards the slot tables and next_ring */
    fixed_buf bufs[RING_MAX_FIXED];
    bool file_used[RING_MAX_FIXED];
    unsigned next_ring;
};

void nvme_aio_defaults(strata_aio_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->block_size = 1u << 20;
    cfg->queue_depth = 32;
    cfg->intra_op_parallelism = 1;
    cfg->single_submit = false;
    cfg->overlap_events = true;
    cfg->direct = STRATA_SWITCH_AUTO;
    cfg->sqpoll = STRATA_SWITCH_OFF;
}

strata_status nvme_aio_validate(const strata_aio_config *cfg)
{
    if (cfg->block_size < NVME_BLOCK_MIN || cfg->block_size % NVME_ALIGN || cfg->block_size > NVME_BLOCK_MAX)
        return err_set(STRATA_ECONFIG, "aio.block_size = %zu must be a multiple of %u in [%zu, %zu]",
                       cfg->block_size, NVME_ALIGN, NVME_BLOCK_MIN, NVME_BLOCK_MAX);
    if (cfg->queue_depth < 1 || cfg->queue_depth > NVME_QUEUE_DEPTH_MAX)
        return err_set(STRATA_ECONFIG, "aio.queue_depth = %d is out of range [1, %d]", cfg->queue_depth,
                       NVME_QUEUE_DEPTH_MAX);
    if (cfg->intra_op_parallelism < 1 || cfg->intra_op_parallelism > NVME_MAX_RINGS)
        return err_set(STRATA_ECONFIG, "aio.intra_op_parallelism = %d is out of range [1, %d]",
                       cfg->intra_op_parallelism, NVME_MAX_RINGS);
    return STRATA_OK;
}

strata_status nvme_io_create(const strata_aio_config *cfg, nvme_io **out)
{
    *out = NULL;
    ERR_CHECK(nvme_aio_validate(cfg));
    nvme_io *io = calloc(1, sizeof *io);
    if (!io)
        return err_set(STRATA_ENOMEM, "aio: out of memory");
    io->cfg = *cfg;
    pthread_mutex_init(&io->mu, NULL);
    for (int i = 0; i < cfg->intra_op_parallelism; i++) {
        char name[32];
        snprintf(name, sizeof name, "aio ring %d", i);
        strata_status st = ring_create(cfg, name, &io->rings[i]);
        if (st != STRATA_OK) {
            nvme_io_destroy(io);
            return st;
        }
        io->nrings++;
    }
    ring_caps c = ring_get_caps(io->rings[0]);
    LOG_INFO(LOG_IO, "aio: %d ring(s), block %zu, queue depth %d, sqpoll %s, fixed buffers %s, fixed files %s",
             io->nrings, cfg->block_size, cfg->queue_depth, c.sqpoll ? "on" : "off", c.fixed_buffers ? "on" : "off",
             c.fixed_files ? "on" : "off");
    *out = io;
    return STRATA_OK;
}

void nvme_io_destroy(nvme_io *io)
{
    if (!io)
        return;
    for (int i = 0; i < io->nrings; i++)
        ring_destroy(io->rings[i]);
    pthread_mutex_destroy(&io->mu);
    free(io);
}

const strata_aio_config *nvme_io_config(const nvme_io *io)
{
    return &io->cfg;
}

int nvme_io_ring_count(const nvme_io *io)
{
    return io->nrings;
}

ring_caps nvme_io_caps(const nvme_io *io)
{
    return ring_get_caps(io->rings[0]);
}

strata_status nvme_io_open(nvme_io *io, const char *path, int flags, mode_t mode, nvme_file **out)
{
    *out = NULL;
    if (strlen(path) >= STRATA_PATH_BYTES)
        return err_set(STRATA_EINVAL, "path \"%.64s...\" is longer than %d bytes", path, STRATA_PATH_BYTES - 1);
    nvme_file *f = calloc(1, sizeof *f);
    if (!f)
        return err_set(STRATA_ENOMEM, "aio: out of memory");
    snprintf(f->path, sizeof f->path, "%s", path);
    f->slot = -1;
    strata_status st = direct_open(path, flags, mode, io->cfg.direct, &f->fd, &f->direct);
    if (st != STRATA_OK) {
        free(f);
        return st;
    }
    struct stat sb;
    f->size = fstat(f->fd, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    pthread_mutex_lock(&io->mu);
    for (int s = 0; s < RING_MAX_FIXED && f->slot < 0; s++) {
        if (io->file_used[s])
            continue;
        bool ok = true;
        int done = 0;
        for (; done < io->nrings && ok; done++)
            ok = ring_register_file(io->rings[done], s, f->fd);
        if (ok) {
            io->file_used[s] = true;
            f->slot = s;
        } else {
            for (int i = 0; i < done - 1; i++)
                ring_unregister_file(io->rings[i], s);
            break;
        }
    }
    pthread_mutex_unlock(&io->mu);
    *out = f;
    return STRATA_OK;
}

void nvme_io_close(nvme_io *io, nvme_file *f)
{
    if (!f)
        return;
    if (f->slot >= 0) {
        pthread_mutex_lock(&io->mu);
        for (int i = 0; i < io->nrings; i++)
            ring_unregister_file(io->rings[i], f->slot);
        io->file_used[f->slot] = false;
        pthread_mutex_unlock(&io->mu);
    }
    close(f->fd);
    free(f);
}

static int find_fixed_buf(nvme_io *io, const void *buf, size_t len)
{
    const char *p = buf;
    for (int s = 0; s < RING_MAX_FIXED; s++)
        if (io->bufs[s].base && p >= io->bufs[s].base && p + len <= io->bufs[s].base + io->bufs[s].len)
            return s;
    return -1;
}

/* Makes a direct file at least end bytes long before a write reaches there, never shortening it (its size
 * is read again first: f->size only says what it was known to be). Called with io->mu held. */
static strata_status extend_for_write(nvme_file *f, uint64_t end)
{
    struct stat sb;
    if (fstat(f->fd, &sb) == 0 && (uint64_t)sb.st_size >= end) {
        f->size = (uint64_t)sb.st_size;
        return STRATA_OK;
    }
    if (ftruncate(f->fd, (off_t)end) != 0) {
        int e = errno;
        char eb[96];
        return err_set(err_from_errno(e), "write \"%s\": cannot extend it to %llu bytes: %s", f->path,
                       (unsigned long long)end, err_errno_str(e, eb, sizeof eb));
    }
    f->size = end;
    return STRATA_OK;
}

strata_status nvme_io_submit(nvme_io *io, nvme_file *f, ring_op op, void *buf, uint64_t offset, size_t len,
                             io_wait *w)
{
    if (f->direct)
        ERR_CHECK(direct_check_aligned(f->path, buf, offset, len));
    size_t block = io->cfg.block_size;
    int parts = 1;
    size_t chunk = len;
    if (io->nrings > 1 && len >= 2 * block) {
        chunk = align_up((len + (size_t)io->nrings - 1) / (size_t)io->nrings, block);
        parts = (int)((len + chunk - 1) / chunk);
    }
    pthread_mutex_lock(&io->mu);
    if (op == RING_WRITE && f->direct && offset + len > f->size) {
        strata_status st = extend_for_write(f, offset + len);
        if (st != STRATA_OK) {
            pthread_mutex_unlock(&io->mu);
            return st;
        }
    }
    int buf_slot = find_fixed_buf(io, buf, len);
    unsigned first = io->next_ring;
    io->next_ring += (unsigned)parts;
    pthread_mutex_unlock(&io->mu);
    for (int i = 0; i < parts; i++) {
        size_t at = (size_t)i * chunk;
        ring_req_args a = {
            .op = op,
            .fd = f->fd,
            .fixed_file = f->slot,
            .fixed_buf = buf_slot,
            .direct = f->direct,
            .path = f->path,
            .buf = (char *)buf + at,
            .offset = offset + at,
            .len = MIN(chunk, len - at),
            .w = w,
        };
        io_wait_add(w, 1);
        strata_status st = ring_submit(io->rings[(first + (unsigned)i) % (unsigned)io->nrings], &a);
        if (st != STRATA_OK) {
            io_wait_add(w, -1);
            return st;
        }
    }
    return STRATA_OK;
}

strata_status nvme_io_sync(nvme_io *io, nvme_file *f, ring_op op, void *buf, uint64_t offset, size_t len)
{
    io_wait w;
    io_wait_init(&w);
    strata_status st = nvme_io_submit(io, f, op, buf, offset, len, &w);
    strata_status st_wait = io_wait_wait(&w);
    io_wait_destroy(&w);
    /* A failed submit queued nothing more, so its message is still this thread's last error. */
    return st != STRATA_OK ? st : st_wait;
}

/* Drops every slot that belongs to owner. Called with io->mu held. */
static void unregister_owner(nvme_io *io, const void *owner)
{
    for (int s = 0; s < RING_MAX_FIXED; s++) {
        if (!io->bufs[s].base || io->bufs[s].owner != owner)
            continue;
        for (int i = 0; i < io->nrings; i++)
            ring_unregister_buffer(io->rings[i], s);
        io->bufs[s] = (fixed_buf){0};
    }
}

bool nvme_io_register_buffer(nvme_io *io, void *buf, size_t len)
{
    pthread_mutex_lock(&io->mu);
    bool ok = true;
    for (size_t at = 0; ok && at < len; at += FIXED_BUF_MAX) {
        int slot = -1;
        for (int s = 0; s < RING_MAX_FIXED && slot < 0; s++)
            if (!io->bufs[s].base)
                slot = s;
        ok = slot >= 0;
        size_t n = MIN(FIXED_BUF_MAX, len - at);
        for (int i = 0; ok && i < io->nrings; i++) {
            ok = ring_register_buffer(io->rings[i], slot, (char *)buf + at, n);
            if (!ok)
                for (int k = 0; k < i; k++)
                    ring_unregister_buffer(io->rings[k], slot);
        }
        if (ok)
            io->bufs[slot] = (fixed_buf){.base = (char *)buf + at, .len = n, .owner = buf};
    }
    if (!ok)
        unregister_owner(io, buf);
    pthread_mutex_unlock(&io->mu);
    return ok;
}

void nvme_io_unregister_buffer(nvme_io *io, void *buf)
{
    pthread_mutex_lock(&io->mu);
    unregister_owner(io, buf);
    pthread_mutex_unlock(&io->mu);
}
