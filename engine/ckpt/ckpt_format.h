/*
 * The checkpoint's on-disk vocabulary, independent of any engine: safetensors headers and the
 * manifest, built and parsed from memory. Every size, offset and count read from a file is checked
 * here against the bytes that really exist, so the loader, `strata ckpt verify` and the fuzz
 * harness all share one parser. A checkpoint directory holds
 *   manifest.json          format version, step, loss-scale state, resolved config, every tensor with
 *                          its file, dtype, shape, offsets and crc32c
 *   model.safetensors      fp32 master weights "<module>.<param>"
 *   optimizer.safetensors  "<name>.exp_avg", "<name>.exp_avg_sq"
 *   params.safetensors     the trainer's parameter copy in its dtype "<name>", and "<name>.next" for a
 *                          delayed update computed but not yet visible (absent for fp32 with none pending)
 */
#ifndef STRATA_ENGINE_CKPT_FORMAT_H
#define STRATA_ENGINE_CKPT_FORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strata.h"

#define CKPT_FORMAT_VERSION 1
#define CKPT_MANIFEST "manifest.json"
#define CKPT_NAME_BYTES 288             /* "<module>.<param>" plus a suffix; engine names are < 128 each */
#define CKPT_MAX_HEADER_BYTES ((uint64_t)256 << 20)   /* safetensors' own limit is 100 MB; be generous */
#define CKPT_MAX_MANIFEST_BYTES ((uint64_t)512 << 20)

/* The files a manifest may name (nothing else: no path ever comes from a file). */
enum { CKPT_FILE_MODEL = 0, CKPT_FILE_OPTIMIZER, CKPT_FILE_PARAMS, CKPT_FILE_COUNT };
extern const char *const ckpt_file_names[CKPT_FILE_COUNT];

typedef struct ckpt_tensor {
    char name[CKPT_NAME_BYTES];
    int file;                 /* CKPT_FILE_* (manifest entries) */
    strata_dtype dtype;
    uint64_t numel;           /* the product of the shape */
    uint64_t begin, end;      /* data_offsets: bytes relative to the data section */
    uint32_t crc;             /* crc32c of the tensor's bytes (manifest entries) */
} ckpt_tensor;

/* A parsed safetensors file header. */
typedef struct ckpt_st_header {
    uint64_t data_start;      /* 8 + header length */
    ckpt_tensor *tensors;
    size_t ntensors;
} ckpt_st_header;

typedef struct ckpt_manifest {
    int version;
    int64_t step;             /* optimizer updates applied (including a pending one) */
    int64_t iterations;       /* strata_step calls: where the trainer's data continues */
    int64_t steps, skipped_steps;
    double loss_scale;
    int good_steps, hysteresis_left;
    strata_dtype param_dtype;
    bool pending;             /* a delayed update is computed but not yet visible */
    strata_step_result pending_result;
    uint64_t file_bytes[CKPT_FILE_COUNT]; /* 0 = the file is absent */
    ckpt_tensor *tensors;
    size_t ntensors;
} ckpt_manifest;

/* "F32", "BF16", "F16" and back; bytes per element. */
const char *ckpt_dtype_name(strata_dtype dt);
size_t ckpt_dtype_bytes(strata_dtype dt);

/* Parses the first len bytes of a safetensors file whose total size is file_bytes (len may be the whole
 * file or just its beginning; at least 8 + header bytes are needed). STRATA_ECORRUPT naming origin and
 * the offending tensor for anything malformed or out of bounds. free with ckpt_st_header_free. */
strata_status ckpt_st_header_parse(const uint8_t *bytes, size_t len, uint64_t file_bytes, const char *origin,
                                   ckpt_st_header *out);
void ckpt_st_header_free(ckpt_st_header *h);

/* The header bytes (8-byte length + JSON padded to 8 bytes) for tensors laid out back to back in
 * order; sets each tensor's begin/end. malloc'd into *out. */
strata_status ckpt_st_header_build(ckpt_tensor *tensors, size_t n, uint8_t **out, size_t *out_len);

/* Parses a manifest's JSON text; STRATA_ECORRUPT naming origin and the field. free with ckpt_manifest_free. */
strata_status ckpt_manifest_parse(const char *text, size_t len, const char *origin, ckpt_manifest *out);
void ckpt_manifest_free(ckpt_manifest *m);

/* The manifest's JSON text (malloc'd, NUL-terminated); cfg (may be NULL) adds the resolved configuration. */
strata_status ckpt_manifest_build(const ckpt_manifest *m, const strata_config *cfg, char **out);

/* The manifest entry of name in file (CKPT_FILE_*), or NULL. */
const ckpt_tensor *ckpt_manifest_find(const ckpt_manifest *m, int file, const char *name);

#endif
