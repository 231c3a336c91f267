/* Safetensors weights from a file, a model directory or a sharded index: opened and checked, then read in pieces. */
#include "engine/weights/weights_source.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/half.h"
#include "base/nearest.h"
#include "engine/ckpt/ckpt_files.h"

#define NOUN "weights"
#define INDEX_NAME "model.safetensors.index.json"
#define MODEL_NAME "model.safetensors"

typedef struct weights_file {
    char path[STRATA_PATH_BYTES + 160];
    int fd;                  /* -1 once closed */
    uint64_t bytes;          /* its size when opened */
    ckpt_st_header h;
} weights_file;

struct weights_source {
    char path[STRATA_PATH_BYTES];
    weights_file *files;
    size_t nfiles;
    weights_entry *entries;  /* ordered by name */
    size_t nentries;
    uint8_t *raw;            /* WEIGHTS_PIECE_NUMEL * 8 bytes: one piece as the file holds it */
    float *wide;             /* WEIGHTS_PIECE_NUMEL: a transposed piece as fp32, before it is scattered */
};

static strata_status file_open(weights_file *f, const char *path, const char *named_by)
{
    memset(f, 0, sizeof *f);
    f->fd = -1;
    if (snprintf(f->path, sizeof f->path, "%s", path) >= (int)sizeof f->path)
        return err_set(STRATA_EINVAL, NOUN " \"%s\": the path is longer than %zu bytes", path, sizeof f->path - 1);
    const char *kind;
    f->fd = ckpt_open_regular(path, true, &kind);
    if (f->fd < 0) {
        char eb[96];
        if (kind)
            return err_set(STRATA_EINVAL, NOUN " \"%s\" is %s, not a safetensors file", path, kind);
        return err_set(errno == ENOENT && !named_by[0] ? STRATA_ENOTFOUND : errno == ENOENT ? STRATA_ECORRUPT
                       : err_from_errno(errno), NOUN " \"%s\": cannot open it: %s%s", path,
                       err_errno_str(errno, eb, sizeof eb), named_by);
    }
    struct stat sb;
    if (fstat(f->fd, &sb) != 0) {
        char eb[96];
        return err_set(err_from_errno(errno), NOUN " \"%s\": fstat failed: %s", path, err_errno_str(errno, eb, sizeof eb));
    }
    f->bytes = (uint64_t)sb.st_size;
    return ckpt_st_header_read(f->fd, NOUN, f->path, f->bytes, true, &f->h);
}

static int entry_cmp(const void *a, const void *b)
{
    return strcmp(((const weights_entry *)a)->t->name, ((const weights_entry *)b)->t->name);
}

/* Every tensor of the one file. */
static strata_status entries_of_file(weights_source *s)
{
    const ckpt_st_header *h = &s->files[0].h;
    s->entries = calloc(h->ntensors + 1, sizeof *s->entries);
    if (!s->entries)
        return err_set(STRATA_ENOMEM, NOUN " \"%s\": out of memory for %zu tensors", s->path, h->ntensors);
    for (size_t i = 0; i < h->ntensors; i++)
        s->entries[s->nentries++] = (weights_entry){&h->tensors[i], 0};
    return STRATA_OK;
}

/* A shard name of an index: a plain file name beside it, never a path that leaves its directory. */
static bool shard_name_ok(const char *name)
{
    return name[0] && !strchr(name, '/') && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

static const ckpt_tensor *header_find(const ckpt_st_header *h, const char *name)
{
    for (size_t i = 0; i < h->ntensors; i++)
        if (strcmp(h->tensors[i].name, name) == 0)
            return &h->tensors[i];
    return NULL;
}

/* Opens every shard a parsed index names and maps each of its tensors to its shard's header entry. */
static strata_status entries_of_index(weights_source *s, const char *index, const json_t *map)
{
    char dir[STRATA_PATH_BYTES];
    snprintf(dir, sizeof dir, "%s", index);
    char *slash = strrchr(dir, '/');
    if (slash)
        slash[1] = '\0';
    else
        dir[0] = '\0';
    size_t n = json_object_size(map);
    s->entries = calloc(n + 1, sizeof *s->entries);
    const char **names = calloc(n + 1, sizeof *names); /* the distinct shards, in order of first mention */
    strata_status st = s->entries && names ? STRATA_OK : err_set(STRATA_ENOMEM, NOUN " \"%s\": out of memory", index);
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)map, key, val) {
        if (st != STRATA_OK)
            break;
        const char *shard = json_is_string(val) ? json_string_value(val) : "";
        if (!shard_name_ok(shard)) {
            st = err_set(STRATA_ECORRUPT, NOUN " index \"%s\": tensor \"%s\" maps to %s, which is not the name of a "
                         "file beside the index", index, key, json_is_string(val) ? shard : "a non-string");
            break;
        }
        size_t f = 0;
        while (f < s->nfiles && strcmp(names[f], shard) != 0)
            f++;
        if (f == s->nfiles) {
            if (s->nfiles == WEIGHTS_MAX_FILES) {
                st = err_set(STRATA_ECORRUPT, NOUN " index \"%s\" names more than %d files", index, WEIGHTS_MAX_FILES);
                break;
            }
            weights_file *grown = realloc(s->files, (s->nfiles + 1) * sizeof *grown);
            if (!grown) {
                st = err_set(STRATA_ENOMEM, NOUN " \"%s\": out of memory", index);
                break;
            }
            s->files = grown;
            char path[STRATA_PATH_BYTES + 160], named_by[STRATA_PATH_BYTES + 160];
            snprintf(path, sizeof path, "%s%s", dir, shard);
            snprintf(named_by, sizeof named_by, " (the index \"%s\" puts tensor \"%s\" there)", index, key);
            names[s->nfiles] = shard;
            st = file_open(&s->files[s->nfiles++], path, named_by);
            if (st != STRATA_OK)
                break;
        }
        const ckpt_tensor *t = header_find(&s->files[f].h, key);
        if (!t) {
            st = err_set(STRATA_ECORRUPT, NOUN " index \"%s\" puts tensor \"%s\" in \"%s\", which does not hold it",
                         index, key, s->files[f].path);
            break;
        }
        s->entries[s->nentries++] = (weights_entry){t, (uint32_t)f};
    }
    free(names);
    return st;
}

static strata_status index_open(weights_source *s, const char *index)
{
    weights_file idx;
    memset(&idx, 0, sizeof idx);
    const char *kind;
    int fd = ckpt_open_regular(index, true, &kind);
    if (fd < 0) {
        char eb[96];
        return err_set(kind ? STRATA_EINVAL : errno == ENOENT ? STRATA_ENOTFOUND : err_from_errno(errno),
                       NOUN " index \"%s\": cannot open it: %s", index, kind ? kind : err_errno_str(errno, eb, sizeof eb));
    }
    struct stat sb;
    char *text = NULL;
    strata_status st = STRATA_OK;
    if (fstat(fd, &sb) != 0 || sb.st_size <= 0 || (uint64_t)sb.st_size > CKPT_MAX_MANIFEST_BYTES)
        st = err_set(STRATA_ECORRUPT, NOUN " index \"%s\": its size %lld is outside (0, %" PRIu64 "] bytes", index,
                     (long long)sb.st_size, CKPT_MAX_MANIFEST_BYTES);
    if (st == STRATA_OK && !(text = malloc((size_t)sb.st_size)))
        st = err_set(STRATA_ENOMEM, NOUN " index \"%s\": out of memory", index);
    if (st == STRATA_OK)
        st = ckpt_read_exact(fd, NOUN " index", index, 0, text, (size_t)sb.st_size, "the index");
    close(fd);
    json_t *root = NULL;
    if (st == STRATA_OK) {
        json_error_t jerr;
        root = json_loadb(text, (size_t)sb.st_size, JSON_REJECT_DUPLICATES, &jerr);
        if (!root)
            st = err_set(STRATA_ECORRUPT, NOUN " index \"%s\" is not valid JSON: %s (line %d)", index, jerr.text,
                         jerr.line);
    }
    free(text);
    const json_t *map = json_object_get(root, "weight_map");
    if (st == STRATA_OK && (!json_is_object(map) || json_object_size(map) == 0))
        st = err_set(STRATA_ECORRUPT, NOUN " index \"%s\" has no \"weight_map\" object naming each tensor's file "
                     "(is it a Hugging Face model.safetensors.index.json?)", index);
    if (st == STRATA_OK)
        st = entries_of_index(s, index, map);
    json_decref(root);
    return st;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static strata_status source_open(weights_source *s, const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        char eb[96];
        return err_set(errno == ENOENT ? STRATA_ENOTFOUND : err_from_errno(errno), NOUN " \"%s\": %s", path,
                       err_errno_str(errno, eb, sizeof eb));
    }
    char file[STRATA_PATH_BYTES + 64];
    if (S_ISDIR(sb.st_mode)) {
        snprintf(file, sizeof file, "%s/" MODEL_NAME, path);
        if (access(file, F_OK) != 0) {
            snprintf(file, sizeof file, "%s/" INDEX_NAME, path);
            if (access(file, F_OK) != 0)
                return err_set(STRATA_ENOTFOUND, NOUN " \"%s\": the directory holds neither " MODEL_NAME " nor "
                               INDEX_NAME "; name a .safetensors file or a model directory", path);
        }
    } else {
        snprintf(file, sizeof file, "%s", path);
    }
    if (ends_with(file, ".json")) {
        ERR_CHECK(index_open(s, file));
    } else {
        if (!(s->files = calloc(1, sizeof *s->files)))
            return err_set(STRATA_ENOMEM, NOUN " \"%s\": out of memory", path);
        s->nfiles = 1;
        ERR_CHECK(file_open(&s->files[0], file, ""));
        ERR_CHECK(entries_of_file(s));
    }
    qsort(s->entries, s->nentries, sizeof *s->entries, entry_cmp);
    for (size_t i = 1; i < s->nentries; i++)
        if (strcmp(s->entries[i - 1].t->name, s->entries[i].t->name) == 0)
            return err_set(STRATA_ECORRUPT, NOUN " \"%s\": tensor \"%s\" appears twice", path, s->entries[i].t->name);
    return STRATA_OK;
}

strata_status weights_source_open(const char *path, weights_source **out)
{
    *out = NULL;
    if (!path || !path[0])
        return err_set(STRATA_EINVAL, "strata_weights_open: path is NULL or empty");
    weights_source *s = calloc(1, sizeof *s);
    if (!s)
        return err_set(STRATA_ENOMEM, NOUN " \"%s\": out of memory", path);
    if (snprintf(s->path, sizeof s->path, "%s", path) >= (int)sizeof s->path) {
        free(s);
        return err_set(STRATA_EINVAL, NOUN " \"%s\": the path is longer than %d bytes", path, STRATA_PATH_BYTES - 1);
    }
    strata_status st = source_open(s, path);
    if (st != STRATA_OK) {
        weights_source_destroy(s);
        return st;
    }
    *out = s;
    return STRATA_OK;
}

void weights_source_close_files(weights_source *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->nfiles; i++) {
        if (s->files[i].fd >= 0)
            close(s->files[i].fd);
        s->files[i].fd = -1;
    }
    free(s->raw);
    free(s->wide);
    s->raw = NULL;
    s->wide = NULL;
}

void weights_source_destroy(weights_source *s)
{
    if (!s)
        return;
    weights_source_close_files(s);
    for (size_t i = 0; i < s->nfiles; i++)
        ckpt_st_header_free(&s->files[i].h);
    free(s->files);
    free(s->entries);
    free(s);
}

const char *weights_source_path(const weights_source *s) { return s->path; }
size_t weights_source_count(const weights_source *s) { return s->nentries; }

const weights_entry *weights_source_entry(const weights_source *s, size_t index)
{
    return index < s->nentries ? &s->entries[index] : NULL;
}

const weights_entry *weights_source_find(const weights_source *s, const char *name)
{
    ckpt_tensor key;
    snprintf(key.name, sizeof key.name, "%s", name);
    weights_entry k = {&key, 0};
    return bsearch(&k, s->entries, s->nentries, sizeof *s->entries, entry_cmp);
}

const char *weights_source_file(const weights_source *s, const weights_entry *e)
{
    return s->files[e->file].path;
}

const char *weights_source_nearest(const weights_source *s, const char *name)
{
    const char *best = NULL;
    size_t best_d = SIZE_MAX;
    for (size_t i = 0; i < s->nentries; i++) {
        size_t d = nearest_distance(name, s->entries[i].t->name);
        if (d < best_d)
            best_d = d, best = s->entries[i].t->name;
    }
    return best && nearest_is_close(name, best_d) ? best : NULL;
}

bool weights_dtype_readable(ckpt_st_dtype st)
{
    return st == CKPT_ST_F32 || st == CKPT_ST_F16 || st == CKPT_ST_BF16 || st == CKPT_ST_F64;
}

strata_status weights_source_recheck(const weights_source *s, const weights_entry *e)
{
    const weights_file *f = &s->files[e->file];
    struct stat sb;
    if (f->fd < 0)
        return err_set(STRATA_ESTATE, NOUN " \"%s\": its files were closed (after a finalize that read them)", s->path);
    if (fstat(f->fd, &sb) != 0 || (uint64_t)sb.st_size != f->bytes)
        return err_set(STRATA_ECORRUPT, NOUN " \"%s\": tensor \"%s\": the file is %lld bytes now, %" PRIu64 " when it "
                       "was opened (truncated or replaced since)", f->path, e->t->name, (long long)sb.st_size,
                       f->bytes);
    return STRATA_OK;
}

/* n elements of dtype st at src (little-endian, as safetensors stores them) as fp32 into dst. */
static void widen(ckpt_st_dtype st, const uint8_t *src, size_t n, float *dst)
{
    switch (st) {
    case CKPT_ST_F32:
        memcpy(dst, src, n * sizeof(float));
        break;
    case CKPT_ST_F16:
        for (size_t i = 0; i < n; i++)
            dst[i] = cvt_fp16_to_f32((uint16_t)(src[2 * i] | src[2 * i + 1] << 8));
        break;
    case CKPT_ST_BF16:
        for (size_t i = 0; i < n; i++)
            dst[i] = cvt_bf16_to_f32((uint16_t)(src[2 * i] | src[2 * i + 1] << 8));
        break;
    case CKPT_ST_F64:
        for (size_t i = 0; i < n; i++) {
            double v;
            memcpy(&v, src + 8 * i, sizeof v);
            dst[i] = (float)v;
        }
        break;
    default: /* the bindings refused every other dtype before anything is read */
        memset(dst, 0, n * sizeof(float));
        break;
    }
}

/* Elements [first, first + n) of the tensor as the file stores them, n <= WEIGHTS_PIECE_NUMEL, widened into dst. */
static strata_status read_piece(weights_source *s, const weights_entry *e, uint64_t first, size_t n, float *dst)
{
    const weights_file *f = &s->files[e->file];
    size_t eb = ckpt_st_dtype_bytes(e->t->st_dtype);
    ERR_CHECK(ckpt_read_exact(f->fd, NOUN, f->path, f->h.data_start + e->t->begin + first * eb, s->raw, n * eb,
                              e->t->name));
    widen(e->t->st_dtype, s->raw, n, dst);
    return STRATA_OK;
}

strata_status weights_source_read(weights_source *s, const weights_entry *e, bool transpose, uint64_t rows,
                                  uint64_t cols, size_t offset, size_t count, float *out)
{
    if (s->files[e->file].fd < 0)
        return err_set(STRATA_ESTATE, NOUN " \"%s\": read after its files were closed", s->path);
    if (!s->raw) {
        s->raw = malloc(WEIGHTS_PIECE_NUMEL * 8);
        s->wide = malloc(WEIGHTS_PIECE_NUMEL * sizeof(float));
        if (!s->raw || !s->wide)
            return err_set(STRATA_ENOMEM, NOUN " \"%s\": out of memory for the read buffers", s->path);
    }
    if (!transpose) {
        for (size_t at = 0; at < count; at += WEIGHTS_PIECE_NUMEL) {
            size_t n = count - at < WEIGHTS_PIECE_NUMEL ? count - at : WEIGHTS_PIECE_NUMEL;
            ERR_CHECK(read_piece(s, e, offset + at, n, out + at));
        }
        return STRATA_OK;
    }
    /* The parameter's element (r, c), at r * cols + c, is the file's (c, r), at c * rows + r. The chunk spans
     * parameter rows [r_lo, r_hi]: from each of the file's cols rows, read that contiguous run of elements and
     * scatter it into the chunk's columns. */
    if (count == 0)
        return STRATA_OK;
    uint64_t r_lo = offset / cols, r_hi = (offset + count - 1) / cols;
    for (uint64_t c = 0; c < cols; c++)
        for (uint64_t r0 = r_lo; r0 <= r_hi; r0 += WEIGHTS_PIECE_NUMEL) {
            size_t n = (size_t)(r_hi + 1 - r0 < WEIGHTS_PIECE_NUMEL ? r_hi + 1 - r0 : WEIGHTS_PIECE_NUMEL);
            ERR_CHECK(read_piece(s, e, c * rows + r0, n, s->wide));
            for (size_t j = 0; j < n; j++) {
                uint64_t k = (r0 + j) * cols + c;
                if (k >= offset && k < offset + count)
                    out[k - offset] = s->wide[j];
            }
        }
    return STRATA_OK;
}
