/* `strata ckpt export`: a checkpoint's master weights as one consolidated safetensors file (ckpt_export.h). */
#include "engine/ckpt/ckpt_export.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "base/error.h"
#include "base/util.h"
#include "base/half.h"
#include "engine/ckpt/ckpt_files.h"

#define CHUNK_ELEMS ((size_t)1 << 20) /* 4 MiB of fp32 read, checked and written at a time */

typedef struct export_ctx {
    const char *dir;
    ckpt_manifest m;
    ckpt_file *files;         /* [rank]: each model file's header checked up front, then open one at a time */
    int open_rank;            /* -1: none open */
    float *buf;
    uint16_t *narrow;         /* the chunk in bf16/fp16 */
    strata_dtype dtype;
    ckpt_writer w;
} export_ctx;

/* The whole tensors of the model files, ordered by name (the manifest's index), as out's header lists them. */
static strata_status collect(export_ctx *x, ckpt_tensor **out, size_t *n, ckpt_export_report *rep)
{
    *n = 0;
    *out = calloc(x->m.ntensors + 1, sizeof **out);
    if (!*out)
        return err_set(STRATA_ENOMEM, "strata ckpt export: out of memory for %zu tensors", x->m.ntensors);
    for (size_t i = 0; i < x->m.ntensors; i++) {
        const ckpt_tensor *t = &x->m.tensors[x->m.index[i]];
        if (t->file != CKPT_FILE_MODEL || t->first != 0)
            continue;
        if (t->dtype != STRATA_DTYPE_FP32)
            return err_set(STRATA_ECORRUPT, "checkpoint \"%s\": tensor \"%s\" of the model files is %s; master "
                           "weights are F32", x->dir, t->name, ckpt_dtype_name(t->dtype));
        ckpt_tensor *o = &(*out)[(*n)++];
        *o = *t;
        o->dtype = x->dtype;
        o->numel = o->total;
        if (!t->ndim && rep->flat++ == 0)
            snprintf(rep->first_flat, sizeof rep->first_flat, "%s", t->name);
    }
    if (*n == 0)
        return err_set(STRATA_ECORRUPT, "checkpoint \"%s\" holds no model weights (its manifest lists no tensor of "
                       "the model files)", x->dir);
    return STRATA_OK;
}

/* Checks every rank's model file (size and header against the manifest) before anything is written. */
static strata_status open_files(export_ctx *x)
{
    x->files = calloc((size_t)x->m.world, sizeof *x->files);
    if (!x->files)
        return err_set(STRATA_ENOMEM, "strata ckpt export: out of memory for the files of %d ranks", x->m.world);
    for (int r = 0; r < x->m.world; r++) {
        x->files[r].fd = -1;
        if (!ckpt_manifest_file_bytes(&x->m, r, CKPT_FILE_MODEL))
            continue;
        ERR_CHECK(ckpt_file_open(x->dir, &x->m, r, CKPT_FILE_MODEL, &x->files[r]));
        ckpt_file_close(&x->files[r]); /* a world of many ranks has many files */
    }
    return STRATA_OK;
}

static strata_status file_of(export_ctx *x, int rank, ckpt_file **out)
{
    if (x->open_rank != rank) {
        if (x->open_rank >= 0)
            ckpt_file_close(&x->files[x->open_rank]);
        x->open_rank = -1;
        ERR_CHECK(ckpt_file_reopen(&x->files[rank]));
        x->open_rank = rank;
    }
    *out = &x->files[rank];
    return STRATA_OK;
}

static strata_status put(export_ctx *x, size_t n)
{
    if (x->dtype == STRATA_DTYPE_FP32)
        return ckpt_writer_put(&x->w, x->buf, n * sizeof *x->buf);
    for (size_t i = 0; i < n; i++)
        x->narrow[i] = x->dtype == STRATA_DTYPE_BF16 ? cvt_f32_to_bf16(x->buf[i]) : cvt_f32_to_fp16(x->buf[i]);
    return ckpt_writer_put(&x->w, x->narrow, n * sizeof *x->narrow);
}

/* Streams one piece into out, checking its crc32c against the manifest. */
static strata_status copy_piece(export_ctx *x, const ckpt_tensor *p)
{
    ckpt_file *f;
    ERR_CHECK(file_of(x, p->rank, &f));
    uint32_t crc = 0;
    for (uint64_t done = 0; done < p->numel;) {
        size_t n = (size_t)MIN((uint64_t)CHUNK_ELEMS, p->numel - done);
        ERR_CHECK(ckpt_file_read(f, p->begin + done * sizeof(float), x->buf, n * sizeof(float), p->name));
        crc = crc32c(crc, x->buf, n * sizeof(float));
        ERR_CHECK(put(x, n));
        done += n;
    }
    if (crc != p->crc)
        return err_set(STRATA_ECORRUPT, "checkpoint \"%s\": tensor \"%s\", elements [%" PRIu64 ", %" PRIu64 "): crc32c "
                       "%08x, the manifest says %08x (the file was damaged after it was written); nothing was exported "
                       "— `strata ckpt verify` lists every bad piece; export an older checkpoint", f->path, p->name,
                       p->first, p->first + p->numel, crc, p->crc);
    return STRATA_OK;
}

/* The temporary file beside out: "<parent>/.<name>.tmp", split into the directory and the name ckpt_writer takes. */
static strata_status temp_name(const char *out, char *tmp, size_t len, char *parent, size_t plen, const char **name)
{
    ERR_CHECK(ckpt_dir_sibling(out, ".tmp", tmp, len));
    char *slash = strrchr(tmp, '/');
    if (!slash)
        snprintf(parent, plen, ".");
    else
        snprintf(parent, plen, "%.*s", slash == tmp ? 1 : (int)(slash - tmp), tmp);
    *name = slash ? slash + 1 : tmp;
    return STRATA_OK;
}

static strata_status export_to(export_ctx *x, const char *out, ckpt_export_report *rep)
{
    ckpt_tensor *list = NULL;
    size_t n = 0;
    uint8_t *head = NULL;
    size_t head_len = 0;
    char tmp[STRATA_PATH_BYTES + 64], parent[STRATA_PATH_BYTES + 64];
    const char *name;
    bool opened = false, made = false;
    strata_status st = collect(x, &list, &n, rep);
    if (st == STRATA_OK)
        st = open_files(x);
    if (st == STRATA_OK)
        st = ckpt_st_header_build(list, n, true, &head, &head_len);
    if (st == STRATA_OK)
        st = temp_name(out, tmp, sizeof tmp, parent, sizeof parent, &name);
    if (st == STRATA_OK)
        made = opened = (st = ckpt_writer_open(&x->w, parent, name)) == STRATA_OK;
    if (st == STRATA_OK)
        st = ckpt_writer_put(&x->w, head, head_len);
    for (size_t i = 0; i < n && st == STRATA_OK; i++)
        for (uint64_t e = 0; e < list[i].total && st == STRATA_OK;) {
            const ckpt_tensor *p = ckpt_manifest_piece(&x->m, CKPT_FILE_MODEL, list[i].name, e);
            st = copy_piece(x, p); /* never NULL: the manifest's parser checked that pieces cover each tensor */
            e = p->first + p->numel;
        }
    if (st == STRATA_OK) {
        rep->tensors = n;
        rep->file_bytes = x->w.written + x->w.used;
        st = ckpt_writer_close(&x->w);
        opened = false;
        if (st == STRATA_OK)
            st = ckpt_file_publish(tmp, out);
    }
    if (opened)
        ckpt_writer_abort(&x->w);
    if (st != STRATA_OK && made)
        unlink(tmp);
    free(head);
    free(list);
    return st;
}

strata_status ckpt_export(const char *dir, const char *out, strata_dtype dtype, ckpt_export_report *rep_out)
{
    if (!dir || !out || !*out)
        return err_set(STRATA_EINVAL, "strata ckpt export: the checkpoint and the output file must be named");
    if (dtype != STRATA_DTYPE_FP32 && dtype != STRATA_DTYPE_BF16 && dtype != STRATA_DTYPE_FP16)
        return err_set(STRATA_EINVAL, "strata ckpt export: dtype %d is not one of fp32, bf16, fp16", (int)dtype);
    export_ctx x = {.dir = dir, .open_rank = -1, .dtype = dtype};
    ckpt_export_report rep = {0};
    ERR_CHECK(ckpt_manifest_read(dir, &x.m));
    rep.world = x.m.world;
    rep.step = x.m.step;
    x.buf = malloc(CHUNK_ELEMS * sizeof *x.buf);
    x.narrow = malloc(CHUNK_ELEMS * sizeof *x.narrow);
    strata_status st = x.buf && x.narrow ? export_to(&x, out, &rep)
                                         : err_set(STRATA_ENOMEM, "strata ckpt export: out of memory for its buffers");
    if (x.open_rank >= 0)
        ckpt_file_close(&x.files[x.open_rank]);
    free(x.files);
    free(x.buf);
    free(x.narrow);
    ckpt_manifest_free(&x.m);
    if (st == STRATA_OK && rep_out)
        *rep_out = rep;
    return st;
}
