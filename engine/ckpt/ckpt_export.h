/*
 * Consolidating a checkpoint's model weights into one safetensors file (`strata ckpt export`, DeepSpeed's
 * zero_to_fp32): every tensor's fp32 master weights gathered from all ranks' pieces by element range, under its
 * name and in its model shape, in fp32 or narrowed to bf16/fp16. Streamed tensor by tensor through one bounded
 * buffer (the header's offsets follow from the sizes alone), every piece checked against its crc32c, and written
 * to a temporary file beside the target, fsynced and renamed: a failure or a crash leaves no partial file at out.
 */
#ifndef STRATA_ENGINE_CKPT_EXPORT_H
#define STRATA_ENGINE_CKPT_EXPORT_H

#include <stddef.h>
#include <stdint.h>

#include "strata.h"

/* What an export wrote, for the caller to report. */
typedef struct ckpt_export_report {
    size_t tensors;           /* tensors written */
    size_t flat;              /* of them, written 1-D [numel] because the checkpoint records no model shape */
    char first_flat[288];     /* the first of those ("" when none), for a note that names one */
    uint64_t file_bytes;      /* the size of the file written */
    int world;                /* ranks whose pieces were gathered */
    int64_t step;             /* the checkpoint's step */
} ckpt_export_report;

/* Exports the checkpoint at dir (a checkpoint directory; its ".old" fallback as ckpt_manifest_read resolves it)
 * into the safetensors file out, each tensor in dtype (STRATA_DTYPE_FP32, BF16 or FP16; narrowing rounds to
 * nearest even). Replaces out atomically when it exists. STRATA_ECORRUPT names the checkpoint file, tensor and
 * piece that fail their checks; STRATA_EIO / STRATA_ENOSPC name out's temporary file. rep (may be NULL) is filled
 * on success. Thread-safe (detail per thread). */
strata_status ckpt_export(const char *dir, const char *out, strata_dtype dtype, ckpt_export_report *rep);

#endif
