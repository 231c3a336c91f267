/* Swap files (private, preallocated, striped) and the extent allocator over them. */
#include "nvme/swap.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "base/error.h"
#include "base/log.h"
#include "base/size.h"
#include "base/util.h"
#include "nvme/direct.h"

typedef struct free_range {
    uint64_t off, len;
} free_range;

struct nvme_swap {
    nvme_io *io;
    int nfiles;
    nvme_file *files[STRATA_MAX_NVME_PATHS];
    uint64_t unit;            /* stripe unit = block size */
    uint64_t per_file;        /* bytes preallocated in each file */
    uint64_t capacity;
    pthread_mutex_t mu;       /* guards the free list */
    free_range *free;         /* sorted by offset, never adjacent */
    size_t nfree, cap_free;
    uint64_t free_total;
    bool checksum;
    uint32_t *crc;            /* per SWAP_CRC_UNIT of the striped space */
    uint8_t *crc_valid;       /* one byte per unit (not bits: units are updated from several I/O threads) */
};

/* A private file in dir: O_TMPFILE where the filesystem has it, else a named file unlinked at once. tag
 * keeps the names of several files of one process apart. */
static strata_status open_private(nvme_io *io, const char *dir, const void *tag, nvme_file **out)
{
    strata_status st = nvme_io_open(io, dir, O_RDWR | O_TMPFILE, 0600, out);
    if (st == STRATA_OK)
        return STRATA_OK;
    char name[STRATA_PATH_BYTES + 64];
    snprintf(name, sizeof name, "%s/.strata-swap-%d-%p", dir, (int)getpid(), tag);
    LOG_INFO(LOG_IO, "nvme_path \"%s\": O_TMPFILE not available (%s); using a named file unlinked after open", dir,
             err_last());
    st = nvme_io_open(io, name, O_RDWR | O_CREAT | O_EXCL, 0600, out);
    if (st != STRATA_OK) {
        char why[ERR_MSG_BYTES - 96];
        snprintf(why, sizeof why, "%s", err_last());
        return err_set(st, "nvme_path \"%s\": cannot create a swap file there: %s", dir, why);
    }
    unlink(name);
    return STRATA_OK;
}

/* dir must be an existing directory with need bytes free; *avail_out (may be NULL) gets what is free. */
static strata_status check_path(const char *dir, uint64_t need, uint64_t *avail_out)
{
    char eb[96], a[32], b[32];
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return err_set(STRATA_ECONFIG, "nvme_path \"%s\": %s; it must be an existing directory", dir,
                       err_errno_str(errno, eb, sizeof eb));
    if (!S_ISDIR(sb.st_mode))
        return err_set(STRATA_ECONFIG, "nvme_path \"%s\" is not a directory; name a directory on the NVMe drive",
                       dir);
    struct statvfs vs;
    if (statvfs(dir, &vs) != 0)
        return err_set(STRATA_EIO, "nvme_path \"%s\": statvfs failed: %s", dir, err_errno_str(errno, eb, sizeof eb));
    uint64_t avail = (uint64_t)vs.f_bavail * vs.f_frsize;
    if (avail_out)
        *avail_out = avail;
    if (avail < need)
        return err_set(STRATA_ENOSPC,
                       "nvme_path \"%s\": swap needs %s (%llu bytes) but the filesystem has only %s (%llu bytes) "
                       "free; free space there, add another nvme_path to stripe over, or keep less state on NVMe",
                       dir, size_format(need, a, sizeof a), (unsigned long long)need, size_format(avail, b, sizeof b),
                       (unsigned long long)avail);
    return STRATA_OK;
}

static strata_status preallocate(nvme_file *f, const char *dir, uint64_t bytes)
{
    char eb[96], a[32];
    int rc = posix_fallocate(f->fd, 0, (off_t)bytes);
    if (rc == 0)
        return STRATA_OK;
    if (rc == EOPNOTSUPP || rc == EINVAL) {
        LOG_INFO(LOG_IO, "nvme_path \"%s\": fallocate not supported; the swap file is sparse", dir);
        if (ftruncate(f->fd, (off_t)bytes) == 0)
            return STRATA_OK;
        rc = errno;
    }
    return err_set(err_from_errno(rc), "nvme_path \"%s\": preallocating %s for swap failed: %s", dir,
                   size_format(bytes, a, sizeof a), err_errno_str(rc, eb, sizeof eb));
}

strata_status swap_create(nvme_io *io, const char *const *paths, int npaths, uint64_t capacity_bytes,
                          nvme_swap **out)
{
    *out = NULL;
    if (npaths < 1 || npaths > STRATA_MAX_NVME_PATHS)
        return err_set(STRATA_ECONFIG, "nvme_path: %d paths given; between 1 and %d are allowed", npaths,
                       STRATA_MAX_NVME_PATHS);
    nvme_swap *s = calloc(1, sizeof *s);
    if (!s)
        return err_set(STRATA_ENOMEM, "swap: out of memory");
    pthread_mutex_init(&s->mu, NULL);
    s->io = io;
    s->unit = nvme_io_config(io)->block_size;
    uint64_t stripes = (capacity_bytes + s->unit - 1) / s->unit;
    s->per_file = (stripes + (uint64_t)npaths - 1) / (uint64_t)npaths * s->unit;
    if (s->per_file == 0)
        s->per_file = s->unit;
    s->capacity = s->per_file * (uint64_t)npaths;
    /* Every path is checked, by the function `strata config check` calls, before any swap file is made. */
    strata_status st = STRATA_OK;
    for (int i = 0; i < npaths && st == STRATA_OK; i++) {
        swap_path_report unused;
        st = swap_check_path(io, paths[i], s->per_file, &unused);
    }
    for (int i = 0; i < npaths && st == STRATA_OK; i++) {
        st = open_private(s->io, paths[i], s, &s->files[i]);
        if (st == STRATA_OK) {
            s->nfiles++;
            st = preallocate(s->files[i], paths[i], s->per_file);
        }
    }
    s->free = malloc(sizeof *s->free * 16);
    if (st == STRATA_OK && !s->free)
        st = err_set(STRATA_ENOMEM, "swap: out of memory");
    if (st != STRATA_OK) {
        swap_destroy(s);
        return st;
    }
    swap_set_checksum(s, true);
    s->cap_free = 16;
    s->free[0] = (free_range){0, s->capacity};
    s->nfree = 1;
    s->free_total = s->capacity;
    char a[32];
    LOG_INFO(LOG_IO, "swap: %s over %d path(s), stripe unit %llu, %s I/O", size_format(s->capacity, a, sizeof a),
             npaths, (unsigned long long)s->unit, swap_is_direct(s) ? "direct" : "buffered");
    *out = s;
    return STRATA_OK;
}

uint64_t swap_min_bytes(const nvme_io *io)
{
    return nvme_io_config(io)->block_size;
}

strata_status swap_check_path(nvme_io *io, const char *dir, uint64_t need_bytes, swap_path_report *out)
{
    *out = (swap_path_report){0};
    ERR_CHECK(check_path(dir, need_bytes, &out->free_bytes));
    nvme_file *f;
    ERR_CHECK(open_private(io, dir, out, &f));
    out->direct = f->direct;
    nvme_io_close(io, f);
    return STRATA_OK;
}

void swap_destroy(nvme_swap *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->nfiles; i++)
        nvme_io_close(s->io, s->files[i]);
    free(s->free);
    free(s->crc);
    free(s->crc_valid);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

void swap_set_checksum(nvme_swap *s, bool on)
{
    free(s->crc);
    free(s->crc_valid);
    s->crc = NULL;
    s->crc_valid = NULL;
    s->checksum = false;
    if (!on)
        return;
    /* calloc of a large table maps zero pages lazily: only units written cost memory. */
    size_t units = (size_t)(s->capacity / SWAP_CRC_UNIT);
    s->crc = calloc(units ? units : 1, sizeof *s->crc);
    s->crc_valid = calloc(units ? units : 1, 1);
    if (!s->crc || !s->crc_valid) {
        LOG_WARN(LOG_IO, "swap: out of memory for the checksum table of %zu units; swap checksums are off", units);
        free(s->crc);
        free(s->crc_valid);
        s->crc = NULL;
        s->crc_valid = NULL;
        return;
    }
    s->checksum = true;
}

bool swap_checksum(const nvme_swap *s)
{
    return s->checksum;
}

strata_status swap_alloc(nvme_swap *s, uint64_t bytes, swap_extent *out)
{
    *out = (swap_extent){0, 0, NULL};
    uint64_t need = align_up(bytes ? bytes : 1, NVME_ALIGN);
    pthread_mutex_lock(&s->mu);
    uint64_t largest = 0;
    for (size_t i = 0; i < s->nfree; i++) {
        free_range *r = &s->free[i];
        if (r->len >= need) {
            *out = (swap_extent){r->off, need, NULL};
            r->off += need;
            r->len -= need;
            if (r->len == 0) {
                memmove(r, r + 1, (s->nfree - i - 1) * sizeof *r);
                s->nfree--;
            }
            s->free_total -= need;
            pthread_mutex_unlock(&s->mu);
            return STRATA_OK;
        }
        largest = MAX(largest, r->len);
    }
    uint64_t total = s->free_total;
    pthread_mutex_unlock(&s->mu);
    char a[32], b[32], c[32], d[32];
    return err_set(STRATA_ENOSPC,
                   "swap: no free extent of %s: the largest free range is %s, %s free of %s in all; "
                   "give the swap more capacity or keep less state on NVMe",
                   size_format(need, a, sizeof a), size_format(largest, b, sizeof b), size_format(total, c, sizeof c),
                   size_format(s->capacity, d, sizeof d));
}

void swap_free(nvme_swap *s, swap_extent e)
{
    if (e.bytes == 0)
        return;
    pthread_mutex_lock(&s->mu);
    size_t i = 0;
    while (i < s->nfree && s->free[i].off < e.offset)
        i++;
    bool merge_prev = i > 0 && s->free[i - 1].off + s->free[i - 1].len == e.offset;
    bool merge_next = i < s->nfree && e.offset + e.bytes == s->free[i].off;
    if (merge_prev && merge_next) {
        s->free[i - 1].len += e.bytes + s->free[i].len;
        memmove(&s->free[i], &s->free[i + 1], (s->nfree - i - 1) * sizeof *s->free);
        s->nfree--;
    } else if (merge_prev) {
        s->free[i - 1].len += e.bytes;
    } else if (merge_next) {
        s->free[i].off = e.offset;
        s->free[i].len += e.bytes;
    } else {
        if (s->nfree == s->cap_free) {
            free_range *grown = realloc(s->free, sizeof *grown * s->cap_free * 2);
            if (!grown) {
                /* Losing track of a free range only wastes space; it can never hand out used space. */
                pthread_mutex_unlock(&s->mu);
                LOG_WARN(LOG_IO, "swap: out of memory while freeing an extent; %llu bytes stay unused",
                         (unsigned long long)e.bytes);
                return;
            }
            s->free = grown;
            s->cap_free *= 2;
        }
        memmove(&s->free[i + 1], &s->free[i], (s->nfree - i) * sizeof *s->free);
        s->free[i] = (free_range){e.offset, e.bytes};
        s->nfree++;
    }
    s->free_total += e.bytes;
    pthread_mutex_unlock(&s->mu);
}

/* Where striped offset `at` lives: stripe k is in file k % n at (k / n) * unit. */
static nvme_file *locate(const nvme_swap *s, uint64_t at, uint64_t *file_off)
{
    uint64_t stripe = at / s->unit, within = at % s->unit;
    *file_off = stripe / (uint64_t)s->nfiles * s->unit + within;
    return s->files[stripe % (uint64_t)s->nfiles];
}

/* Maps the striped range onto the files: stripe k lives in file k % n at (k / n) * unit. */
static strata_status submit_pieces(nvme_swap *s, ring_op op, const swap_extent *e, uint64_t offset, void *buf,
                                   size_t len, io_wait *w)
{
    uint64_t at = e->offset + offset;
    char *p = buf;
    while (len > 0) {
        /* One path needs no cutting: the file offset is the striped offset. */
        size_t take = s->nfiles == 1 ? len : (size_t)MIN((uint64_t)len, s->unit - at % s->unit);
        uint64_t file_off;
        nvme_file *f = locate(s, at, &file_off);
        ERR_CHECK(nvme_io_submit(s->io, f, op, p, file_off, take, w));
        p += take;
        at += take;
        len -= take;
    }
    return STRATA_OK;
}

/* ---------------------------------------------------------------- checksummed requests
 *
 * A checked request collects its pieces on its own io_wait, whose completion callback (on the I/O thread
 * that finished the last piece) records or checks the unit checksums and then finishes one count of the
 * caller's io_wait. A "hold" count keeps the callback from running before every piece is submitted. */

typedef struct checked_req {
    io_wait inner;
    io_wait *outer;
    nvme_swap *s;
    swap_extent ext;
    ring_op op;
    uint64_t offset;
    uint8_t *buf;
    size_t len;
    bool submit_failed;
} checked_req;

/* The units wholly inside [offset, offset + len) of the extent; partial units at the edges lose their checksum. */
static void unit_span(const checked_req *r, uint64_t *first, uint64_t *last, uint64_t *skip)
{
    uint64_t at = r->ext.offset + r->offset;
    *first = (at + SWAP_CRC_UNIT - 1) / SWAP_CRC_UNIT;
    *last = (at + r->len) / SWAP_CRC_UNIT;
    *skip = *first * SWAP_CRC_UNIT - at;
}

/* After a write: the checksums of the units it covered, or (when it failed, and the drive may hold any mix
 * of old and new bytes) no checksum for any unit it touched. */
static void record(checked_req *r, bool ok)
{
    nvme_swap *s = r->s;
    uint64_t first, last, skip, at = r->ext.offset + r->offset;
    unit_span(r, &first, &last, &skip);
    if (at % SWAP_CRC_UNIT)
        s->crc_valid[at / SWAP_CRC_UNIT] = 0;
    if ((at + r->len) % SWAP_CRC_UNIT)
        s->crc_valid[(at + r->len) / SWAP_CRC_UNIT] = 0;
    for (uint64_t u = first; u < last && !ok; u++)
        s->crc_valid[u] = 0;
    for (uint64_t u = first; u < last && ok; u++) {
        s->crc[u] = crc32c(0, r->buf + skip + (u - first) * SWAP_CRC_UNIT, SWAP_CRC_UNIT);
        s->crc_valid[u] = 1;
    }
}

static strata_status check(checked_req *r, char *msg, size_t msglen)
{
    nvme_swap *s = r->s;
    uint64_t first, last, skip;
    unit_span(r, &first, &last, &skip);
    for (uint64_t u = first; u < last; u++) {
        if (!s->crc_valid[u])
            continue;
        uint32_t got = crc32c(0, r->buf + skip + (u - first) * SWAP_CRC_UNIT, SWAP_CRC_UNIT);
        if (got == s->crc[u])
            continue;
        uint64_t file_off;
        nvme_file *f = locate(s, u * SWAP_CRC_UNIT, &file_off);
        snprintf(msg, msglen,
                 "swap: checksum mismatch in %s (swap extent of %llu bytes at %llu): the 4 KiB unit at byte %llu of "
                 "the extent, in the swap file under \"%s\" at offset %llu, has crc32c %08x but %08x was written; the data "
                 "changed on the drive after strata wrote it (a failing drive or another writer to the swap file)",
                 r->ext.what ? r->ext.what : "an extent", (unsigned long long)r->ext.bytes,
                 (unsigned long long)r->ext.offset, (unsigned long long)(u * SWAP_CRC_UNIT - r->ext.offset), f->path,
                 (unsigned long long)file_off, got, s->crc[u]);
        return STRATA_ECORRUPT;
    }
    return STRATA_OK;
}

static void checked_done(io_wait *w, void *ctx)
{
    checked_req *r = ctx;
    (void)w;
    char msg[ERR_MSG_BYTES];
    strata_status st = io_wait_take_status(&r->inner, msg, sizeof msg);
    if (r->op == RING_WRITE)
        record(r, st == STRATA_OK && !r->submit_failed);
    else if (st == STRATA_OK && !r->submit_failed)
        st = check(r, msg, sizeof msg);
    io_wait *outer = r->outer;
    io_wait_destroy(&r->inner);
    free(r);
    io_wait_finish(outer, st, msg);
}

static strata_status swap_io(nvme_swap *s, ring_op op, const swap_extent *e, uint64_t offset, void *buf,
                             size_t len, io_wait *w)
{
    if (offset > e->bytes || len > e->bytes - offset)
        return err_set(STRATA_EINVAL, "swap: %s of %zu bytes at offset %llu lies outside an extent of %llu bytes",
                       op == RING_READ ? "read" : "write", len, (unsigned long long)offset,
                       (unsigned long long)e->bytes);
    if (!s->checksum)
        return submit_pieces(s, op, e, offset, buf, len, w);
    /* One checked request per stripe unit (aio.block_size): each piece's checksums are computed as soon as
     * it lands, by the I/O thread that finished it, while the rest is still moving. */
    uint64_t at = e->offset + offset;
    while (len > 0) {
        size_t take = (size_t)MIN((uint64_t)len, s->unit - at % s->unit);
        checked_req *r = malloc(sizeof *r);
        if (!r)
            return err_set(STRATA_ENOMEM, "swap: out of memory for a request");
        *r = (checked_req){.outer = w, .s = s, .ext = *e, .op = op, .offset = offset, .buf = buf, .len = take};
        io_wait_init(&r->inner);
        io_wait_set_notify(&r->inner, checked_done, r);
        io_wait_add(w, 1);
        io_wait_add(&r->inner, 1); /* the hold */
        strata_status st = submit_pieces(s, op, e, offset, buf, take, &r->inner);
        /* A failed submission is returned here; the pieces that did go out still finish into w. */
        r->submit_failed = st != STRATA_OK;
        io_wait_finish(&r->inner, STRATA_OK, NULL); /* releases the hold; r may be gone after this */
        ERR_CHECK(st);
        at += take;
        offset += take;
        buf = (uint8_t *)buf + take;
        len -= take;
    }
    return STRATA_OK;
}

strata_status swap_write(nvme_swap *s, const swap_extent *e, uint64_t offset, const void *buf, size_t len,
                         io_wait *w)
{
    return swap_io(s, RING_WRITE, e, offset, (void *)buf, len, w);
}

strata_status swap_read(nvme_swap *s, const swap_extent *e, uint64_t offset, void *buf, size_t len, io_wait *w)
{
    return swap_io(s, RING_READ, e, offset, buf, len, w);
}

uint64_t swap_capacity(const nvme_swap *s)
{
    return s->capacity;
}

uint64_t swap_free_bytes(nvme_swap *s)
{
    pthread_mutex_lock(&s->mu);
    uint64_t n = s->free_total;
    pthread_mutex_unlock(&s->mu);
    return n;
}

int swap_file_fd(const nvme_swap *s, int index)
{
    return index >= 0 && index < s->nfiles ? s->files[index]->fd : -1;
}

bool swap_is_direct(const nvme_swap *s)
{
    for (int i = 0; i < s->nfiles; i++)
        if (!s->files[i]->direct)
            return false;
    return s->nfiles > 0;
}
