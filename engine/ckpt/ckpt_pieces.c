/* The pieces of a sharded checkpoint: file names derived from a rank and a kind, the manifest's index of the pieces
 * by tensor (with the check that they cover each tensor exactly once) and the lookup of the piece holding an element. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "engine/ckpt/ckpt_format.h"

static const char *const stems[CKPT_FILE_COUNT] = {"model", "optimizer", "params"};
#define ST_SUFFIX ".safetensors"

void ckpt_file_name(int world, int rank, int kind, char *out)
{
    if (world == 1)
        snprintf(out, CKPT_FILE_NAME_BYTES, "%s", ckpt_file_names[kind]);
    else
        snprintf(out, CKPT_FILE_NAME_BYTES, "%s.rank%d" ST_SUFFIX, stems[kind], rank);
}

bool ckpt_file_name_parse(const char *name, int world, int *rank, int *kind)
{
    for (int k = 0; k < CKPT_FILE_COUNT; k++) {
        int r = 0;
        size_t n = strlen(stems[k]);
        if (strcmp(name, ckpt_file_names[k]) == 0) {
            if (world > 1)
                return false;
        } else if (strncmp(name, stems[k], n) == 0 && strncmp(name + n, ".rank", 5) == 0) {
            const char *d = name + n + 5;
            size_t digits = strspn(d, "0123456789");
            if (digits == 0 || digits > 5 || strcmp(d + digits, ST_SUFFIX) != 0 || (d[0] == '0' && digits > 1))
                continue;
            r = atoi(d);
            if (world == 1 || r >= (world > 1 ? world : CKPT_MAX_WORLD))
                return false;
        } else {
            continue;
        }
        if (rank)
            *rank = r;
        if (kind)
            *kind = k;
        return true;
    }
    return false;
}

uint64_t ckpt_manifest_file_bytes(const ckpt_manifest *m, int rank, int kind)
{
    if (!m->file_bytes || rank < 0 || rank >= m->world || kind < 0 || kind >= CKPT_FILE_COUNT)
        return 0;
    return m->file_bytes[(size_t)rank * CKPT_FILE_COUNT + (size_t)kind];
}

bool ckpt_manifest_has(const ckpt_manifest *m, int kind)
{
    for (int r = 0; r < m->world; r++)
        if (ckpt_manifest_file_bytes(m, r, kind))
            return true;
    return false;
}

/* Pieces ordered by kind, then name, then first element: the pieces of one tensor are neighbours. */
static int piece_cmp(const ckpt_tensor *a, const ckpt_tensor *b)
{
    if (a->file != b->file)
        return a->file < b->file ? -1 : 1;
    int c = strcmp(a->name, b->name);
    if (c)
        return c;
    return a->first < b->first ? -1 : a->first > b->first;
}

static int by_piece(const void *a, const void *b, void *ctx)
{
    const ckpt_tensor *t = ctx;
    return piece_cmp(&t[*(const size_t *)a], &t[*(const size_t *)b]);
}

strata_status ckpt_manifest_index(ckpt_manifest *m, const char *origin)
{
    m->index = malloc((m->ntensors + 1) * sizeof *m->index);
    if (!m->index)
        return err_set(STRATA_ENOMEM, "%s: out of memory for %zu tensors", origin, m->ntensors);
    for (size_t i = 0; i < m->ntensors; i++)
        m->index[i] = i;
    qsort_r(m->index, m->ntensors, sizeof *m->index, by_piece, m->tensors);
    for (size_t i = 0; i < m->ntensors; i++) {
        const ckpt_tensor *t = &m->tensors[m->index[i]];
        const ckpt_tensor *prev = i ? &m->tensors[m->index[i - 1]] : NULL;
        bool same = prev && prev->file == t->file && strcmp(prev->name, t->name) == 0;
        static const char *const kinds[CKPT_FILE_COUNT] = {"model", "optimizer", "params"};
        const char *kind = kinds[t->file];
        uint64_t want = same ? prev->first + prev->numel : 0;
        if (same && (prev->dtype != t->dtype || prev->total != t->total))
            return err_set(STRATA_ECORRUPT, "%s: tensor \"%s\" (%s files): its pieces disagree on its dtype or size (%s x "
                           "%" PRIu64 " and %s x %" PRIu64 ")", origin, t->name, kind, ckpt_dtype_name(prev->dtype),
                           prev->total, ckpt_dtype_name(t->dtype), t->total);
        if (same && (prev->ndim != t->ndim || memcmp(prev->dims, t->dims, (size_t)t->ndim * sizeof *t->dims) != 0))
            return err_set(STRATA_ECORRUPT, "%s: tensor \"%s\" (%s files): its pieces disagree on its model_shape",
                           origin, t->name, kind);
        if (t->first < want)
            return err_set(STRATA_ECORRUPT, "%s: tensor \"%s\" (%s files): two pieces overlap: both hold elements [%"
                           PRIu64 ", %" PRIu64 ")", origin, t->name, kind, t->first, want);
        if (t->first > want)
            return err_set(STRATA_ECORRUPT, "%s: tensor \"%s\" (%s files): a gap: no piece holds elements [%" PRIu64
                           ", %" PRIu64 ")", origin, t->name, kind, want, t->first);
        bool last = i + 1 == m->ntensors || m->tensors[m->index[i + 1]].file != t->file ||
                    strcmp(m->tensors[m->index[i + 1]].name, t->name) != 0;
        if (last && t->first + t->numel != t->total)
            return err_set(STRATA_ECORRUPT, "%s: tensor \"%s\" (%s files): a gap: no piece holds elements [%" PRIu64
                           ", %" PRIu64 ")", origin, t->name, kind, t->first + t->numel, t->total);
    }
    return STRATA_OK;
}

const ckpt_tensor *ckpt_manifest_piece(const ckpt_manifest *m, int kind, const char *name, uint64_t elem)
{
    if (!m->index)
        return NULL;
    /* The last piece ordered at or before (kind, name, elem). */
    ckpt_tensor key = {.file = kind, .first = elem};
    snprintf(key.name, sizeof key.name, "%s", name);
    size_t lo = 0, hi = m->ntensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (piece_cmp(&m->tensors[m->index[mid]], &key) <= 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return NULL;
    const ckpt_tensor *t = &m->tensors[m->index[lo - 1]];
    if (t->file != kind || strcmp(t->name, name) != 0 || elem >= t->first + t->numel)
        return NULL;
    return t;
}
