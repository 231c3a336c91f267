/*
 * The checkpoint's on-disk vocabulary, independent of any engine: safetensors headers and the
 * manifest, built and parsed from memory. Every size, offset and count read from a file is checked
 * here against the bytes that really exist, so the loader, `strata ckpt verify` and the fuzz
 * harness all share one parser. A checkpoint directory holds
 *   manifest.json          format version, the world size it was written with, step, loss-scale state,
 *                          resolved config, every piece of every tensor with its file, dtype, shape, element
 *                          range, byte offsets and crc32c
 *   model.safetensors      fp32 master weights "<module>.<param>"
 *   optimizer.safetensors  "<name>.exp_avg", "<name>.exp_avg_sq"
 *   params.safetensors     the trainer's parameter copy in its dtype "<name>", and "<name>.next" for a
 *                          delayed update computed but not yet visible (absent for fp32 with none pending)
 * A world of N > 1 ranks writes each kind of file once per rank, "model.rank<r>.safetensors" and so on: rank r's
 * file holds, per tensor, the piece of it that lies in rank r's shards (elements [first, first + numel) of the
 * tensor, stored 1-D under the tensor's name), and the pieces of all ranks cover every tensor exactly once. A world
 * of one writes one piece per tensor (the whole tensor) under the names above.
 *
 * Versions: 1 (one rank, no "world_size" and no "elements": every entry is a whole tensor) is still read; 2 adds
 * "world_size" and each entry's "elements": [first, end). An entry's "model_shape" (the tensor's shape in the
 * model, [d0, ...] with the product of "shape", when the trainer declared one with strata_param_set_shape) is
 * optional within version 2: readers that do not know it ignore it, and without it a tensor is only known flat.
 * 3 adds "field_crc32c", a checksum over each of the manifest's own fields (ckpt_seal.h), required from version 3;
 * versions 1 and 2 are still read, with a warning that their fields are unprotected.
 */
#ifndef STRATA_ENGINE_CKPT_FORMAT_H
#define STRATA_ENGINE_CKPT_FORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strata.h"

#define CKPT_FORMAT_VERSION 3
#define CKPT_MAX_WORLD 65536            /* ranks a manifest may name (bounds what a file can make us allocate) */
#define CKPT_FILE_NAME_BYTES 48         /* "optimizer.rank65535.safetensors" and its NUL, with room */
#define CKPT_MANIFEST "manifest.json"
#define CKPT_NAME_BYTES 288             /* "<module>.<param>" plus a suffix; engine names are < 128 each */
#define CKPT_MAX_HEADER_BYTES ((uint64_t)256 << 20)   /* safetensors' own limit is 100 MB; be generous */
#define CKPT_MAX_MANIFEST_BYTES ((uint64_t)512 << 20)

/* The kinds of file a checkpoint holds. A manifest may name nothing else: every file name is derived from a kind
 * and a rank below the manifest's world size (ckpt_file_name), never taken from a file. */
enum { CKPT_FILE_MODEL = 0, CKPT_FILE_OPTIMIZER, CKPT_FILE_PARAMS, CKPT_FILE_COUNT };
extern const char *const ckpt_file_names[CKPT_FILE_COUNT]; /* the names in a world of one */

/* Every dtype a safetensors header may name. A checkpoint holds only the first three (strata's dtypes); a foreign
 * file (strata_weights_open: a model from elsewhere) may hold any, and strata reads the floating ones up to F64. */
typedef enum ckpt_st_dtype {
    CKPT_ST_F32 = 0, CKPT_ST_BF16, CKPT_ST_F16, CKPT_ST_F64,
    CKPT_ST_I64, CKPT_ST_I32, CKPT_ST_I16, CKPT_ST_I8, CKPT_ST_U64, CKPT_ST_U32, CKPT_ST_U16, CKPT_ST_U8,
    CKPT_ST_BOOL, CKPT_ST_F8_E4M3, CKPT_ST_F8_E5M2,
    CKPT_ST_COUNT
} ckpt_st_dtype;

/* One piece of a tensor: in a manifest, where it lies in which rank's file; in a safetensors header, a whole
 * (1-D) tensor as the file holds it (first = 0, numel = total, rank 0). */
typedef struct ckpt_tensor {
    char name[CKPT_NAME_BYTES];
    int file;                 /* CKPT_FILE_* kind (manifest entries; -1 in a header) */
    int rank;                 /* the rank whose file holds it (manifest entries) */
    strata_dtype dtype;       /* STRATA_DTYPE_NONE for a foreign dtype strata does not store (st_dtype says which) */
    ckpt_st_dtype st_dtype;   /* the dtype as the file names it (headers; CKPT_ST_F32.. for manifests' entries) */
    uint64_t total;           /* elements of the whole tensor: the product of its shape */
    uint64_t first, numel;    /* the piece: elements [first, first + numel) of the tensor */
    uint64_t begin, end;      /* data_offsets: bytes relative to the data section (numel elements) */
    uint32_t crc;             /* crc32c of the piece's bytes (manifest entries) */
    int ndim;                 /* manifests: the tensor's model shape ("model_shape"; strata_param_set_shape), whose */
    uint64_t dims[STRATA_MAX_DIMS]; /* product is total; 0: none recorded (the tensor is only known flat). Headers:
                                       the shape the file stores it in (0: a scalar) */
} ckpt_tensor;

/* A parsed safetensors file header. */
typedef struct ckpt_st_header {
    uint64_t data_start;      /* 8 + header length */
    ckpt_tensor *tensors;
    size_t ntensors;
} ckpt_st_header;

typedef struct ckpt_manifest {
    int version;
    int world;                /* ranks that wrote it, 1..CKPT_MAX_WORLD */
    int64_t step;             /* optimizer updates applied (including a pending one) */
    int64_t iterations;       /* strata_step calls: where the trainer's data continues */
    int64_t steps, skipped_steps;
    double loss_scale;
    int good_steps, hysteresis_left;
    strata_dtype param_dtype;
    strata_moments moments;   /* the form its moments were trained in (its config's; they are saved as fp32) */
    bool pending;             /* a delayed update is computed but not yet visible */
    strata_step_result pending_result;
    uint64_t *file_bytes;     /* [rank * CKPT_FILE_COUNT + kind]: 0 = the file is absent (ckpt_manifest_file_bytes) */
    ckpt_tensor *tensors;     /* every piece, in file order */
    size_t ntensors;
    size_t *index;            /* parsed manifests: the pieces ordered by kind, name and first element */
    char *groups_json;        /* "param_groups" as JSON text (ckpt_groups.h), or NULL: saved before groups */
} ckpt_manifest;

/* The name of rank's file of a kind in a checkpoint written by world ranks (out: CKPT_FILE_NAME_BYTES). */
void ckpt_file_name(int world, int rank, int kind, char *out);
/* Whether name is one a checkpoint of world ranks writes (world 0: of any world), and whose; rank and kind may be
 * NULL. Only canonical names pass ("model.rank01.safetensors" does not). */
bool ckpt_file_name_parse(const char *name, int world, int *rank, int *kind);

/* "F32", "BF16", "F16" and back; bytes per element. */
const char *ckpt_dtype_name(strata_dtype dt);
size_t ckpt_dtype_bytes(strata_dtype dt);
/* The same for any safetensors dtype ("?" and 0 outside the enum). */
const char *ckpt_st_dtype_name(ckpt_st_dtype st);
size_t ckpt_st_dtype_bytes(ckpt_st_dtype st);

/* Parses the first len bytes of a safetensors file whose total size is file_bytes (len may be the whole
 * file or just its beginning; at least 8 + header bytes are needed). A checkpoint's file (foreign false) may hold
 * only strata's dtypes; a foreign one any safetensors dtype (the reader of a tensor decides what it can convert).
 * STRATA_ECORRUPT naming origin and the offending tensor for anything malformed or out of bounds. free with
 * ckpt_st_header_free. */
strata_status ckpt_st_header_parse(const uint8_t *bytes, size_t len, uint64_t file_bytes, bool foreign,
                                   const char *origin, ckpt_st_header *out);
void ckpt_st_header_free(ckpt_st_header *h);

/* The key under which a file's header holds piece t, given the pieces before and after it in the same file (NULL
 * at either end), into out (CKPT_NAME_BYTES): its tensor's name, or "<name>@<first>" where a neighbour is a piece of
 * the same tensor (a rank's parts of a tensor split into parts, strata_param_set_part, which its shards cut apart). */
void ckpt_piece_key(const ckpt_tensor *prev, const ckpt_tensor *t, const ckpt_tensor *next, char *out);

/* The header bytes (8-byte length + JSON padded to 8 bytes) for tensors laid out back to back in
 * order, each under its ckpt_piece_key; sets each tensor's begin/end. malloc'd into *out. Each tensor's "shape" is
 * [numel] (a checkpoint's files hold pieces), or with model_shape its model shape where it has one and is whole
 * (`strata ckpt export`). */
strata_status ckpt_st_header_build(ckpt_tensor *tensors, size_t n, bool model_shape, uint8_t **out,
                                   size_t *out_len);

/* Parses a manifest's JSON text (version 1 or 2); STRATA_ECORRUPT naming origin and the field. Also checks that
 * the pieces of every tensor agree on its dtype and size and cover it exactly once (no gap, no overlap). free with
 * ckpt_manifest_free. */
strata_status ckpt_manifest_parse(const char *text, size_t len, const char *origin, ckpt_manifest *out);
void ckpt_manifest_free(ckpt_manifest *m);

/* The manifest's JSON text (malloc'd, NUL-terminated) in the current version; cfg (may be NULL) adds the resolved
 * configuration. */
strata_status ckpt_manifest_build(const ckpt_manifest *m, const strata_config *cfg, char **out);

/* Bytes of rank's file of a kind (0: absent, or rank outside the world). */
uint64_t ckpt_manifest_file_bytes(const ckpt_manifest *m, int rank, int kind);
/* Whether any rank wrote a file of the kind. */
bool ckpt_manifest_has(const ckpt_manifest *m, int kind);
/* Orders m's pieces by kind, name and first element (m->index) and checks that the pieces of every tensor agree on
 * its dtype and size and cover it exactly once: STRATA_ECORRUPT naming origin, the tensor and the elements. The
 * manifest's parser calls it. */
strata_status ckpt_manifest_index(ckpt_manifest *m, const char *origin);
/* Of a parsed manifest: the piece of tensor name in files of the kind that holds element elem, or NULL. */
const ckpt_tensor *ckpt_manifest_piece(const ckpt_manifest *m, int kind, const char *name, uint64_t elem);

#endif
