/* The public strata_aio handle: a thin owner of an nvme_io, its files, buffers and one completion group. */
#include <fcntl.h>
#include <stdlib.h>

#include "base/error.h"
#include "nvme/direct.h"
#include "nvme/io.h"

struct strata_aio_file {
    nvme_file *f;
    struct strata_aio_file *next;
};

typedef struct aio_buffer {
    void *ptr;
    size_t bytes;
    struct aio_buffer *next;
} aio_buffer;

struct strata_aio {
    nvme_io *io;
    io_wait w;                 /* every async request of the handle */
    strata_aio_file *files;
    aio_buffer *buffers;
    err_slot err;
};

strata_status strata_aio_config_init(strata_aio_config *cfg)
{
    if (!cfg)
        return err_set(STRATA_EINVAL, "strata_aio_config_init: cfg is NULL");
    nvme_aio_defaults(cfg);
    return STRATA_OK;
}

strata_status strata_aio_create(const strata_aio_config *cfg, strata_aio **out)
{
    if (!out)
        return err_set(STRATA_EINVAL, "strata_aio_create: out is NULL");
    *out = NULL;
    strata_aio_config defaults;
    if (!cfg) {
        nvme_aio_defaults(&defaults);
        cfg = &defaults;
    }
    strata_aio *aio = calloc(1, sizeof *aio);
    if (!aio)
        return err_set(STRATA_ENOMEM, "strata_aio_create: out of memory");
    io_wait_init(&aio->w);
    strata_status st = nvme_io_create(cfg, &aio->io);
    if (st != STRATA_OK) {
        io_wait_destroy(&aio->w);
        free(aio);
        return st;
    }
    *out = aio;
    return STRATA_OK;
}

void strata_aio_destroy(strata_aio *aio)
{
    if (!aio)
        return;
    io_wait_wait(&aio->w);
    while (aio->files)
        strata_aio_close(aio, aio->files);
    while (aio->buffers)
        strata_aio_buffer_free(aio, aio->buffers->ptr);
    nvme_io_destroy(aio->io);
    io_wait_destroy(&aio->w);
    free(aio);
}

const char *strata_aio_last_error(const strata_aio *aio)
{
    return aio ? aio->err.msg : err_last();
}

strata_status strata_aio_open(strata_aio *aio, const char *path, unsigned flags, strata_aio_file **out)
{
    if (out)
        *out = NULL;
    if (!aio || !path || !out || !(flags & (STRATA_AIO_READ | STRATA_AIO_WRITE)))
        return err_copy(aio ? &aio->err : NULL,
                        err_set(STRATA_EINVAL, "strata_aio_open: needs a handle, a path, an out pointer and "
                                               "STRATA_AIO_READ or STRATA_AIO_WRITE (flags = %u)", flags));
    int oflags = O_RDONLY;
    if (flags & STRATA_AIO_WRITE)
        oflags = O_RDWR | O_CREAT | ((flags & STRATA_AIO_TRUNCATE) ? O_TRUNC : 0);
    strata_aio_file *file = calloc(1, sizeof *file);
    if (!file)
        return err_copy(&aio->err, err_set(STRATA_ENOMEM, "strata_aio_open: out of memory"));
    strata_status st = nvme_io_open(aio->io, path, oflags, 0600, &file->f);
    if (st != STRATA_OK) {
        free(file);
        return err_copy(&aio->err, st);
    }
    file->next = aio->files;
    aio->files = file;
    *out = file;
    return err_copy(&aio->err, STRATA_OK);
}

strata_status strata_aio_close(strata_aio *aio, strata_aio_file *file)
{
    if (!file)
        return STRATA_OK;
    if (!io_wait_idle(&aio->w))
        return err_copy(&aio->err, err_set(STRATA_EBUSY, "strata_aio_close \"%s\": requests are still in flight; "
                                                         "call strata_aio_wait() first", file->f->path));
    for (strata_aio_file **p = &aio->files; *p; p = &(*p)->next) {
        if (*p == file) {
            *p = file->next;
            break;
        }
    }
    nvme_io_close(aio->io, file->f);
    free(file);
    return err_copy(&aio->err, STRATA_OK);
}

bool strata_aio_file_is_direct(const strata_aio_file *file)
{
    return file && file->f->direct;
}

static strata_status submit(strata_aio *aio, strata_aio_file *file, ring_op op, void *buf, size_t bytes,
                            uint64_t offset, io_wait *w)
{
    if (!aio || !file)
        return err_set(STRATA_EINVAL, "strata_aio_%s: handle or file is NULL", op == RING_READ ? "read" : "write");
    return nvme_io_submit(aio->io, file->f, op, buf, offset, bytes, w);
}

strata_status strata_aio_read(strata_aio *aio, strata_aio_file *file, void *buf, size_t bytes, uint64_t offset)
{
    strata_status st = submit(aio, file, RING_READ, buf, bytes, offset, aio ? &aio->w : NULL);
    return aio ? err_copy(&aio->err, st) : st;
}

strata_status strata_aio_write(strata_aio *aio, strata_aio_file *file, const void *buf, size_t bytes,
                               uint64_t offset)
{
    /* The ring only reads a write's buffer; the cast drops const for the shared request type. */
    strata_status st = submit(aio, file, RING_WRITE, (void *)buf, bytes, offset, aio ? &aio->w : NULL);
    return aio ? err_copy(&aio->err, st) : st;
}

strata_status strata_aio_wait(strata_aio *aio)
{
    if (!aio)
        return err_set(STRATA_EINVAL, "strata_aio_wait: handle is NULL");
    return err_copy(&aio->err, io_wait_wait(&aio->w));
}

static strata_status sync_io(strata_aio *aio, strata_aio_file *file, ring_op op, void *buf, size_t bytes,
                             uint64_t offset)
{
    if (!aio || !file)
        return err_set(STRATA_EINVAL, "strata_aio_p%s: handle or file is NULL", op == RING_READ ? "read" : "write");
    return err_copy(&aio->err, nvme_io_sync(aio->io, file->f, op, buf, offset, bytes));
}

strata_status strata_aio_pread(strata_aio *aio, strata_aio_file *file, void *buf, size_t bytes, uint64_t offset)
{
    return sync_io(aio, file, RING_READ, buf, bytes, offset);
}

strata_status strata_aio_pwrite(strata_aio *aio, strata_aio_file *file, const void *buf, size_t bytes,
                                uint64_t offset)
{
    return sync_io(aio, file, RING_WRITE, (void *)buf, bytes, offset);
}

strata_status strata_aio_buffer_alloc(strata_aio *aio, size_t bytes, void **out)
{
    if (out)
        *out = NULL;
    if (!aio || !out)
        return err_set(STRATA_EINVAL, "strata_aio_buffer_alloc: handle or out is NULL");
    aio_buffer *b = calloc(1, sizeof *b);
    if (!b)
        return err_copy(&aio->err, err_set(STRATA_ENOMEM, "strata_aio_buffer_alloc: out of memory"));
    strata_status st = direct_buffer_alloc(bytes, &b->ptr, NULL);
    if (st != STRATA_OK) {
        free(b);
        return err_copy(&aio->err, st);
    }
    b->bytes = bytes;
    nvme_io_register_buffer(aio->io, b->ptr, bytes ? bytes : 1);
    b->next = aio->buffers;
    aio->buffers = b;
    *out = b->ptr;
    return err_copy(&aio->err, STRATA_OK);
}

void strata_aio_buffer_free(strata_aio *aio, void *buf)
{
    if (!aio || !buf)
        return;
    for (aio_buffer **p = &aio->buffers; *p; p = &(*p)->next) {
        aio_buffer *b = *p;
        if (b->ptr != buf)
            continue;
        *p = b->next;
        nvme_io_unregister_buffer(aio->io, b->ptr);
        direct_buffer_free(b->ptr, b->bytes);
        free(b);
        return;
    }
}
