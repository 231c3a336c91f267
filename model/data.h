/* Byte-level training data: a file read whole, or the built-in corpus (English-like sentences from a small
 * grammar, deterministic), and the batches drawn from it. */
#ifndef STRATA_MODEL_DATA_H
#define STRATA_MODEL_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "strata.h"

typedef struct gpt_data {
    unsigned char *bytes;
    size_t len;
} gpt_data;

/* The built-in corpus of about len bytes (the same bytes for every call with the same len). */
strata_status data_builtin(size_t len, gpt_data *out);
/* Reads path whole. STRATA_ENOTFOUND / STRATA_EIO with errmsg naming the path and the errno text;
 * STRATA_EINVAL for an empty file, and for a path that is not a regular file (a directory, a device, a FIFO:
 * refused by what it is, without blocking on a FIFO that has no writer). */
strata_status data_load(const char *path, gpt_data *out, char *errmsg, size_t errlen);
void data_free(gpt_data *d);

/* Batch of (step, micro) for seed: batch windows of seq + 1 bytes at deterministic random offsets; tokens are
 * the first seq bytes, targets the next seq. Needs d->len > seq. */
void data_batch(const gpt_data *d, uint64_t seed, int64_t step, int micro, int batch, int seq, int32_t *tokens,
                int32_t *targets);

#endif
