/*
 * A source of initial weights: safetensors files written by anyone (strata's own export, Hugging Face's
 * save_pretrained, safetensors.torch.save_file), opened from a path that is one of
 *   FILE.safetensors                    one file
 *   DIR                                 DIR/model.safetensors, else DIR/model.safetensors.index.json
 *   FILE.json                           a sharded model's index: {"weight_map": {"<tensor>": "<shard file>"}}
 * Opening reads and checks every header (through the checkpoint's parser, ckpt_format.h: each tensor's data lies
 * inside its file, a truncated shard is refused here) and, for an index, that every shard it names exists and holds
 * the tensors it maps to it. Nothing else is read until a tensor is: then in pieces of a bounded buffer, converted
 * to fp32 (F32, F16, BF16, F64), optionally transposed from a 2-D [cols, rows] file layout, so a tensor of any size
 * streams through WEIGHTS_PIECE_NUMEL elements of memory. Private to engine/weights/.
 */
#ifndef STRATA_ENGINE_WEIGHTS_SOURCE_H
#define STRATA_ENGINE_WEIGHTS_SOURCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/ckpt/ckpt_format.h"

#define WEIGHTS_PIECE_NUMEL ((size_t)1 << 17) /* elements read per pread: 1 MiB of F64, 256 KiB of BF16 */
#define WEIGHTS_MAX_FILES 65536               /* shards an index may name (bounds what a file makes us open) */

/* One tensor of the source: its header entry in the file that holds it. */
typedef struct weights_entry {
    const ckpt_tensor *t;
    uint32_t file;
} weights_entry;

typedef struct weights_source weights_source;

/* Opens path as above. STRATA_ENOTFOUND naming path when it (or a directory's model file) is not there;
 * STRATA_ECORRUPT naming the file (and the tensor) for a malformed header or index, a tensor whose data lies outside
 * its file, or an index naming a file that is missing or does not hold the tensor. *out is NULL on failure. */
strata_status weights_source_open(const char *path, weights_source **out);
void weights_source_destroy(weights_source *s); /* NULL is a no-op */
/* Closes the files and frees the read buffer; the headers stay (entries and names remain valid). */
void weights_source_close_files(weights_source *s);

/* The path it was opened from, its tensors (ordered by name), the file that holds an entry. */
const char *weights_source_path(const weights_source *s);
size_t weights_source_count(const weights_source *s);
const weights_entry *weights_source_entry(const weights_source *s, size_t index);
const weights_entry *weights_source_find(const weights_source *s, const char *name);
const char *weights_source_file(const weights_source *s, const weights_entry *e);
/* The tensor name of s nearest to name (a suggestion for a misspelling), or NULL when none is close. */
const char *weights_source_nearest(const weights_source *s, const char *name);

/* Whether strata converts the dtype to fp32 (F32, F16, BF16, F64). */
bool weights_dtype_readable(ckpt_st_dtype st);

/* STRATA_ECORRUPT naming the file when the file holding e no longer has the size it had when it was opened (a
 * shard truncated or replaced since). */
strata_status weights_source_recheck(const weights_source *s, const weights_entry *e);

/* Elements [offset, offset + count) of e's tensor, flattened as the parameter holds it, into out as fp32. Without
 * transpose that is the file's own order; with it the file holds a 2-D [cols, rows] tensor and the parameter is
 * its transpose [rows, cols] (Hugging Face's Conv1D weights against a Linear's). STRATA_EIO / STRATA_ECORRUPT
 * naming the file and tensor when a read fails or comes short. Not thread-safe (one buffer per source). */
strata_status weights_source_read(weights_source *s, const weights_entry *e, bool transpose, uint64_t rows,
                                  uint64_t cols, size_t offset, size_t count, float *out);

#endif
