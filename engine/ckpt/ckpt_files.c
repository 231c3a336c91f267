/* Checkpoint files on disk: checked writes and cross-checked reading (replacing directories: ckpt_dir.c). */
#include "engine/ckpt/ckpt_files.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "base/error.h"
#include "base/log.h"
#include "base/util.h"

#define WRITE_BUF_BYTES ((size_t)1 << 20)
#define VERIFY_CHUNK_BYTES ((size_t)4 << 20)

static strata_status errno_status(int errnum, const char *fmt_path, const char *what, const char *path)
{
    char eb[96];
    return err_set(err_from_errno(errnum), fmt_path, what, path, err_errno_str(errnum, eb, sizeof eb));
}

/* ---------------------------------------------------------------- writing */

strata_status ckpt_writer_open(ckpt_writer *w, const char *dir, const char *name)
{
    memset(w, 0, sizeof *w);
    w->fd = -1;
    snprintf(w->path, sizeof w->path, "%s/%s", dir, name);
    w->buf = malloc(WRITE_BUF_BYTES);
    if (!w->buf)
        return err_set(STRATA_ENOMEM, "checkpoint \"%s\": out of memory for the write buffer", w->path);
    w->cap = WRITE_BUF_BYTES;
    w->fd = open(w->path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644); /* never through a link */
    if (w->fd < 0) {
        strata_status st = errno_status(errno, "checkpoint: %s \"%s\" failed: %s", "creating", w->path);
        free(w->buf);
        w->buf = NULL;
        return st;
    }
    return STRATA_OK;
}

static strata_status write_all(ckpt_writer *w, const uint8_t *p, size_t len)
{
    while (len > 0) {
        ssize_t n = write(w->fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int errnum = n < 0 ? errno : EIO;
            char eb[96];
            return err_set(err_from_errno(errnum),
                           "checkpoint \"%s\": write of %zu bytes at offset %" PRIu64 " failed: %s; the previous "
                           "checkpoint (if any) is untouched%s", w->path, len, w->written,
                           err_errno_str(errnum, eb, sizeof eb),
                           errnum == ENOSPC ? " — free space on that filesystem or save elsewhere" : "");
        }
        p += n;
        len -= (size_t)n;
        w->written += (uint64_t)n;
    }
    return STRATA_OK;
}

static strata_status flush(ckpt_writer *w)
{
    strata_status st = write_all(w, w->buf, w->used);
    w->used = 0;
    return st;
}

strata_status ckpt_writer_put(ckpt_writer *w, const void *data, size_t len)
{
    if (w->used + len > w->cap) {
        ERR_CHECK(flush(w));
        if (len >= w->cap)
            return write_all(w, data, len);
    }
    memcpy(w->buf + w->used, data, len);
    w->used += len;
    return STRATA_OK;
}

void ckpt_writer_abort(ckpt_writer *w)
{
    if (w->fd >= 0)
        close(w->fd);
    w->fd = -1;
    free(w->buf);
    w->buf = NULL;
}

strata_status ckpt_writer_close(ckpt_writer *w)
{
    strata_status st = flush(w);
    if (st == STRATA_OK && fsync(w->fd) != 0)
        st = errno_status(errno, "checkpoint: %s \"%s\" failed: %s", "fsync of", w->path);
    if (st == STRATA_OK && close(w->fd) != 0)
        st = errno_status(errno, "checkpoint: %s \"%s\" failed: %s", "close of", w->path);
    else if (st != STRATA_OK)
        close(w->fd);
    w->fd = -1;
    free(w->buf);
    w->buf = NULL;
    return st;
}

/* ---------------------------------------------------------------- reading */

strata_status ckpt_read_exact(int fd, const char *noun, const char *path, uint64_t off, void *buf, size_t len,
                              const char *what)
{
    uint8_t *p = buf;
    size_t done = 0;
    while (done < len) {
        ssize_t n = pread(fd, p + done, len - done, (off_t)(off + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            char eb[96];
            return err_set(STRATA_EIO, "%s \"%s\": %s: read of %zu bytes at offset %" PRIu64 " failed: %s",
                           noun, path, what, len, off, err_errno_str(errno, eb, sizeof eb));
        }
        if (n == 0)
            return err_set(STRATA_ECORRUPT, "%s \"%s\": %s: the file ends at %" PRIu64 " bytes, inside the "
                           "%zu bytes expected at offset %" PRIu64 " (truncated)", noun, path, what, off + done, len,
                           off);
        done += (size_t)n;
    }
    return STRATA_OK;
}

static strata_status read_exact(int fd, const char *path, uint64_t off, void *buf, size_t len, const char *what)
{
    return ckpt_read_exact(fd, "checkpoint", path, off, buf, len, what);
}

/* A FIFO or a device would block or never end, and a symbolic link would read (and quote in errors) whatever it
 * points at. O_NONBLOCK makes the open of a FIFO return at once; O_NOFOLLOW refuses a link as the last component. */
int ckpt_open_regular(const char *path, bool follow, const char **kind)
{
    *kind = NULL;
    int fd = open(path, O_RDONLY | O_NONBLOCK | (follow ? 0 : O_NOFOLLOW) | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ELOOP)
            *kind = "a symbolic link";
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int errnum = errno;
        close(fd);
        errno = errnum;
        return -1;
    }
    if (!S_ISREG(sb.st_mode)) {
        *kind = S_ISFIFO(sb.st_mode) ? "a FIFO" : S_ISSOCK(sb.st_mode) ? "a socket" :
                S_ISDIR(sb.st_mode) ? "a directory" : S_ISCHR(sb.st_mode) || S_ISBLK(sb.st_mode) ? "a device" :
                "not a regular file";
        close(fd);
        errno = EINVAL;
        return -1;
    }
    /* A regular file ignores O_NONBLOCK; cleared all the same so that no read can return EAGAIN. */
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

/* The error of a failed open_regular: what the file is, or errno's text. */
static strata_status open_error(const char *what, const char *path, const char *kind, int errnum, const char *hint)
{
    if (kind)
        return err_set(STRATA_ECORRUPT, "checkpoint \"%s\" is %s, not a regular file; a checkpoint holds only the "
                       "regular files strata wrote (refused without reading it) — put the real file there, or use "
                       "another checkpoint", path, kind);
    char eb[96];
    return err_set(errnum == ENOENT && hint[0] ? STRATA_ENOTFOUND : errnum == ENOENT ? STRATA_ECORRUPT :
                   err_from_errno(errnum), "checkpoint \"%s\": cannot open %s: %s%s", path, what,
                   err_errno_str(errnum, eb, sizeof eb), errnum == ENOENT ? hint : "");
}

/* Resolves where dir's checkpoint is: dir itself, or the ".old" copy a save on a filesystem without an atomic
 * exchange left when it crashed between its two renames. */
static void resolve(const char *dir, char *out, size_t len)
{
    char manifest[STRATA_PATH_BYTES + 96], old[STRATA_PATH_BYTES + 64];
    snprintf(manifest, sizeof manifest, "%s/%s", dir, CKPT_MANIFEST);
    snprintf(out, len, "%s", dir);
    if (access(manifest, F_OK) == 0 || ckpt_dir_sibling(dir, ".old", old, sizeof old) != STRATA_OK)
        return;
    snprintf(manifest, sizeof manifest, "%s/%s", old, CKPT_MANIFEST);
    if (access(manifest, F_OK) == 0) {
        LOG_WARN(LOG_CORE, "checkpoint \"%s\" is missing; using \"%s\", left by an interrupted save", dir, old);
        snprintf(out, len, "%s", old);
    }
}

strata_status ckpt_manifest_read(const char *dir_in, ckpt_manifest *m)
{
    memset(m, 0, sizeof *m);
    char dir[STRATA_PATH_BYTES + 64], path[STRATA_PATH_BYTES + 128];
    resolve(dir_in, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/%s", dir, CKPT_MANIFEST);
    const char *kind;
    int fd = ckpt_open_regular(path, false, &kind);
    if (fd < 0)
        return open_error("its manifest", path, kind, errno, "; is this a directory written by strata_save?");
    struct stat sb;
    strata_status st = STRATA_OK;
    char *text = NULL;
    if (fstat(fd, &sb) != 0 || sb.st_size <= 0 || (uint64_t)sb.st_size > CKPT_MAX_MANIFEST_BYTES)
        st = err_set(STRATA_ECORRUPT, "checkpoint \"%s\": manifest size %lld is outside (0, %" PRIu64 "] bytes", path,
                     (long long)sb.st_size, CKPT_MAX_MANIFEST_BYTES);
    if (st == STRATA_OK && !(text = malloc((size_t)sb.st_size)))
        st = err_set(STRATA_ENOMEM, "checkpoint \"%s\": out of memory for the manifest", path);
    if (st == STRATA_OK)
        st = read_exact(fd, path, 0, text, (size_t)sb.st_size, "manifest");
    if (st == STRATA_OK)
        st = ckpt_manifest_parse(text, (size_t)sb.st_size, path, m);
    free(text);
    close(fd);
    return st;
}

/* The manifest's pieces in f, in file order, into idx (m->ntensors entries); returns their count. */
static size_t file_pieces(const ckpt_file *f, const ckpt_manifest *m, size_t *idx)
{
    size_t n = 0;
    for (size_t i = 0; i < m->ntensors; i++)
        if (m->tensors[i].file == f->kind && m->tensors[i].rank == f->rank)
            idx[n++] = i;
    return n;
}

static strata_status cross_check(const ckpt_file *f, const ckpt_manifest *m, const ckpt_st_header *h)
{
    size_t *idx = malloc((m->ntensors + 1) * sizeof *idx);
    if (!idx)
        return err_set(STRATA_ENOMEM, "checkpoint \"%s\": out of memory for %zu pieces", f->path, m->ntensors);
    size_t expected = file_pieces(f, m, idx);
    strata_status st = STRATA_OK;
    for (size_t k = 0; k < expected && st == STRATA_OK; k++) {
        const ckpt_tensor *t = &m->tensors[idx[k]], *ht = NULL;
        char key[CKPT_NAME_BYTES];
        ckpt_piece_key(k ? &m->tensors[idx[k - 1]] : NULL, t, k + 1 < expected ? &m->tensors[idx[k + 1]] : NULL, key);
        for (size_t j = 0; j < h->ntensors && !ht; j++)
            if (strcmp(h->tensors[j].name, key) == 0)
                ht = &h->tensors[j];
        if (!ht)
            st = err_set(STRATA_ECORRUPT, "checkpoint \"%s\": tensor \"%s\" of the manifest is not in the file",
                         f->path, key);
        else if (ht->dtype != t->dtype || ht->numel != t->numel || ht->begin != t->begin || ht->end != t->end)
            st = err_set(STRATA_ECORRUPT, "checkpoint \"%s\": tensor \"%s\": the file says %s x %" PRIu64 " at [%"
                         PRIu64 ", %" PRIu64 "), the manifest %s x %" PRIu64 " at [%" PRIu64 ", %" PRIu64 ")",
                         f->path, key, ckpt_dtype_name(ht->dtype), ht->numel, ht->begin, ht->end,
                         ckpt_dtype_name(t->dtype), t->numel, t->begin, t->end);
    }
    free(idx);
    ERR_CHECK(st);
    if (expected != h->ntensors)
        return err_set(STRATA_ECORRUPT, "checkpoint \"%s\": the file holds %zu tensors, the manifest lists %zu",
                       f->path, h->ntensors, expected);
    return STRATA_OK;
}

strata_status ckpt_st_header_read(int fd, const char *noun, const char *path, uint64_t file_bytes, bool foreign,
                                  ckpt_st_header *h)
{
    memset(h, 0, sizeof *h);
    uint8_t len8[8];
    ERR_CHECK(ckpt_read_exact(fd, noun, path, 0, len8, 8, "header length"));
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | len8[i];
    if (n > CKPT_MAX_HEADER_BYTES || n > file_bytes - 8)
        return err_set(STRATA_ECORRUPT, "%s \"%s\": header length %" PRIu64 " exceeds the file's %" PRIu64 " bytes "
                       "(truncated, or not a safetensors file)", noun, path, n, file_bytes);
    uint8_t *head = malloc(8 + n);
    if (!head)
        return err_set(STRATA_ENOMEM, "%s \"%s\": out of memory for its %" PRIu64 "-byte header", noun, path, n);
    strata_status st = ckpt_read_exact(fd, noun, path, 0, head, 8 + n, "header");
    if (st == STRATA_OK)
        st = ckpt_st_header_parse(head, 8 + n, file_bytes, foreign, path, h);
    free(head);
    return st;
}

strata_status ckpt_file_open(const char *dir_in, const ckpt_manifest *m, int rank, int kind, ckpt_file *f)
{
    char dir[STRATA_PATH_BYTES + 64], name[CKPT_FILE_NAME_BYTES];
    resolve(dir_in, dir, sizeof dir);
    memset(f, 0, sizeof *f);
    f->rank = rank;
    f->kind = kind;
    f->bytes = ckpt_manifest_file_bytes(m, rank, kind);
    ckpt_file_name(m->world, rank, kind, name);
    snprintf(f->path, sizeof f->path, "%s/%s", dir, name);
    const char *what;
    f->fd = ckpt_open_regular(f->path, false, &what);
    if (f->fd < 0)
        return open_error("it", f->path, what, errno, "");
    struct stat sb;
    ckpt_st_header h = {0};
    strata_status st = STRATA_OK;
    if (fstat(f->fd, &sb) != 0 || (uint64_t)sb.st_size != f->bytes)
        st = err_set(STRATA_ECORRUPT, "checkpoint \"%s\": the file is %lld bytes, the manifest says %" PRIu64
                     " (truncated or replaced)", f->path, (long long)sb.st_size, f->bytes);
    if (st == STRATA_OK)
        st = ckpt_st_header_read(f->fd, "checkpoint", f->path, f->bytes, false, &h);
    if (st == STRATA_OK) {
        f->data_start = h.data_start;
        st = cross_check(f, m, &h);
    }
    ckpt_st_header_free(&h);
    if (st != STRATA_OK)
        ckpt_file_close(f);
    return st;
}

strata_status ckpt_file_reopen(ckpt_file *f)
{
    if (f->fd >= 0)
        return STRATA_OK;
    const char *what;
    f->fd = ckpt_open_regular(f->path, false, &what);
    struct stat sb;
    if (f->fd < 0 || fstat(f->fd, &sb) != 0 || (uint64_t)sb.st_size != f->bytes) {
        int errnum = f->fd < 0 ? errno : 0;
        char eb[96];
        ckpt_file_close(f);
        return err_set(STRATA_ECORRUPT, "checkpoint \"%s\": %s%s while it was being read", f->path,
                       errnum ? "cannot open it again: " : "the file changed size",
                       errnum ? err_errno_str(errnum, eb, sizeof eb) : "");
    }
    return STRATA_OK;
}

void ckpt_file_close(ckpt_file *f)
{
    if (f->fd >= 0)
        close(f->fd);
    f->fd = -1;
}

strata_status ckpt_file_read(const ckpt_file *f, uint64_t off, void *buf, size_t len, const char *what)
{
    return read_exact(f->fd, f->path, f->data_start + off, buf, len, what);
}

/* Checks every piece of one open file; counts failures into *bad and keeps the first in first/first_msg. */
static void verify_file(ckpt_file *f, const ckpt_manifest *m, uint8_t *buf, ckpt_verify_fn report, void *user,
                        size_t *bad, strata_status *first, char *first_msg)
{
    for (size_t i = 0; i < m->ntensors; i++) {
        const ckpt_tensor *t = &m->tensors[i];
        if (t->file != f->kind || t->rank != f->rank)
            continue;
        uint32_t crc = 0;
        strata_status st = STRATA_OK;
        for (uint64_t off = t->begin; off < t->end && st == STRATA_OK; off += VERIFY_CHUNK_BYTES) {
            size_t n = (size_t)MIN((uint64_t)VERIFY_CHUNK_BYTES, t->end - off);
            st = ckpt_file_read(f, off, buf, n, t->name);
            crc = crc32c(crc, buf, n);
        }
        if (st == STRATA_OK && crc != t->crc)
            st = err_set(STRATA_ECORRUPT, "checkpoint \"%s\": tensor \"%s\": crc32c %08x, the manifest says %08x "
                         "(the file was damaged after it was written)", f->path, t->name, crc, t->crc);
        if (st != STRATA_OK) {
            (*bad)++;
            if (*first == STRATA_OK) {
                *first = st;
                snprintf(first_msg, ERR_MSG_BYTES, "%s", err_last());
            }
        }
        if (report)
            report(t, st == STRATA_OK, crc, user);
    }
}

strata_status ckpt_verify(const char *dir, ckpt_verify_fn report, void *user, size_t *bad_out)
{
    ckpt_manifest m;
    size_t bad = 0;
    if (bad_out)
        *bad_out = 0;
    ERR_CHECK(ckpt_manifest_read(dir, &m));
    uint8_t *buf = malloc(VERIFY_CHUNK_BYTES);
    strata_status first = buf ? STRATA_OK : err_set(STRATA_ENOMEM, "checkpoint verify: out of memory");
    char first_msg[ERR_MSG_BYTES] = "";
    for (int r = 0; r < m.world && buf; r++)
        for (int fi = 0; fi < CKPT_FILE_COUNT; fi++) {
            if (!ckpt_manifest_file_bytes(&m, r, fi))
                continue;
            ckpt_file f;
            strata_status st = ckpt_file_open(dir, &m, r, fi, &f);
            if (st != STRATA_OK) {
                if (first == STRATA_OK) {
                    first = st;
                    snprintf(first_msg, sizeof first_msg, "%s", err_last());
                }
                bad++;
                continue;
            }
            verify_file(&f, &m, buf, report, user, &bad, &first, first_msg);
            ckpt_file_close(&f);
        }
    free(buf);
    ckpt_manifest_free(&m);
    if (bad_out)
        *bad_out = bad;
    if (first != STRATA_OK && first_msg[0])
        err_set(first, "%s", first_msg);
    return first;
}
