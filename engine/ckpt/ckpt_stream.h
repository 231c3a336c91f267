/*
 * What strata_save (checkpoint.c) and strata_load (ckpt_load.c) share: the walk over a state class's tier array,
 * module by module in aligned chunks, and the pieces of tensors that walk meets. Private to engine/ckpt/.
 *
 * Pieces by rank. In a world of N ranks every state class is saved uniformly, whatever the ZeRO stage: rank r
 * writes the part of each class that lies in its shard of each module (the full-view range [m->offset + r * S,
 * + S), S = m->shard_numel), cut at parameter boundaries into one piece per parameter it overlaps; padding is never
 * written. It reads that range from the class's array where the class lives (its shard view: m->shard_offset; the
 * full view: the range itself), so a replicated class is written 1/N by each rank too, and the pieces of all ranks
 * are the model exactly once. In a world of one the range is the whole module: one piece per tensor.
 * A load reads what its current views hold (a shard-view class: its own range; a full-view class: the whole module)
 * from whichever pieces overlap it, so any world loads what any world saved.
 */
#ifndef STRATA_ENGINE_CKPT_STREAM_H
#define STRATA_ENGINE_CKPT_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/ckpt/ckpt_format.h"
#include "engine/engine.h"

#define CKPT_CHUNK_NUMEL ((size_t)1 << 20) /* a multiple of ENGINE_MODULE_ALIGN: chunks stay 4 KiB-aligned */
#define CKPT_PARAM(e, id) registry_param((e)->reg, (strata_param_id)(id))
#define CKPT_MODULE(e, id) registry_module((e)->reg, (strata_module_id)(id))

/* One state class <-> one family of tensors ("<name><suffix>") in one kind of file. */
typedef struct ckpt_stream {
    tier_array *arr;
    reg_view view;             /* where arr lives: the full view or this rank's shard view */
    const char *suffix;
    strata_dtype dtype;        /* of the file's tensors */
    /* A moment array in a compressed form (strata.optimizer_moments): the file holds it as fp32, widened on save and
     * narrowed again on load (cpu_adam/moments_convert.h); sq: exp_avg_sq (the 8-bit form's unsigned map), scale:
     * the 8-bit form's block scales. FP32 (zero) for every other stream. */
    strata_moments form;
    bool sq;
    tier_array *scale;
} ckpt_stream;

/* A stream whose array holds what the file holds (every one but compressed moments). */
static inline ckpt_stream ckpt_plain_stream(tier_array *arr, reg_view view, const char *suffix, strata_dtype dtype)
{
    return (ckpt_stream){.arr = arr, .view = view, .suffix = suffix, .dtype = dtype};
}

/* Full-view elements [lo, lo + n) of module mi, which lie at element `at` of a class's array, inside the
 * module's range [span_lo, span_end) being walked. */
typedef struct ckpt_chunk {
    size_t mi, lo, n, at;
    size_t span_lo, span_end;
} ckpt_chunk;

/* Which range of each module a walk covers: what rank `rank` writes (CKPT_OWN), or what this rank's array holds in
 * the stream's view (CKPT_HELD: the whole module in the full view). */
typedef enum ckpt_walk { CKPT_OWN, CKPT_HELD } ckpt_walk;

typedef struct ckpt_ctx {
    strata_engine *e;
    size_t *ord;               /* parameter ids in flat-offset order */
    size_t *mod_first;         /* per module: its first index in ord (and one past the last module) */
    uint32_t *crc;             /* per position in ord: the running crc32c of the piece being streamed */
    const ckpt_tensor **cur;   /* load: per position in ord, the piece whose crc32c is running */
    uint8_t *buf[2];           /* CKPT_CHUNK_NUMEL * 4 bytes each, 4 KiB-aligned: the tier I/O of one chunk overlaps
                                  the file I/O of the other */
    float *wide;               /* CKPT_CHUNK_NUMEL: a compressed moment chunk as fp32 */
    size_t inexact;            /* load: 8-bit blocks narrowing could not give back exactly (moments_narrow) */
    io_wait w[2];
} ckpt_ctx;

strata_status ckpt_ctx_init(ckpt_ctx *c, strata_engine *e);
void ckpt_ctx_free(ckpt_ctx *c);

/* The moment streams of this engine (exp_avg, exp_avg_sq) as the files hold them: fp32, in the engine's form. */
void ckpt_moment_streams(strata_engine *e, ckpt_stream out[2]);

/* Chunk k of stream s as the file holds it: raw (what the array holds of it) itself, or widened into c->wide. */
const uint8_t *ckpt_widen(ckpt_ctx *c, const ckpt_stream *s, const ckpt_chunk *k, const uint8_t *raw);
/* The reverse: c->wide (the file's fp32) narrowed into dst, the array's form (and the 8-bit scales into place). */
void ckpt_narrow(ckpt_ctx *c, const ckpt_stream *s, const ckpt_chunk *k, uint8_t *dst);

/* The name of p's tensor with suffix into out (CKPT_NAME_BYTES): "<module>.<param><suffix>", or for a part of a
 * larger tensor (strata_param_set_part) "<tensor><suffix>". Its elements are those of registry_param_tensor(p): a
 * part's piece [first, first + numel) of the parameter is [part_first + first, ...) of the tensor. */
void ckpt_tensor_name(const strata_engine *e, const reg_param *p, const char *suffix, char *out);

/* Waits for the engine's own traffic so the arrays hold still (what names the call). */
strata_status ckpt_quiesce(strata_engine *e, const char *what);

/* The first chunk of the walk at or after module mi, or the one after cur; false past the last module. */
bool ckpt_chunk_at(const ckpt_ctx *c, const ckpt_stream *s, ckpt_walk walk, size_t mi, ckpt_chunk *k);
bool ckpt_chunk_next(const ckpt_ctx *c, const ckpt_stream *s, ckpt_walk walk, const ckpt_chunk *cur,
                     ckpt_chunk *next);

/* The piece of parameter p that rank writes: elements [*first, *first + *numel) of it; false when its shard of the
 * module does not reach p. */
bool ckpt_own_piece(const strata_engine *e, const reg_param *p, int rank, uint64_t *first, uint64_t *numel);

/* The part of parameter p that this rank's array of stream s holds (the whole parameter in the full view, the
 * part in its shard in the shard view); false when it holds none of it. */
/* Whether stream s has parameter p at all (the gradient and optimizer classes do not hold frozen modules). */
bool ckpt_stream_covers(const strata_engine *e, const ckpt_stream *s, const reg_param *p);
bool ckpt_held_piece(const strata_engine *e, const ckpt_stream *s, const reg_param *p, uint64_t *first,
                     uint64_t *numel);

/* Whether the piece a walk covers of the parameter at position k of c->ord (CKPT_OWN: what rank writes; CKPT_HELD:
 * what this rank's array of s holds) continues the one of position k - 1 in their tensor: both parts of one tensor,
 * adjacent in it, the first covered to its end and the second from its start. A save writes such pieces as one (a
 * world of one: every part of a tensor, so the file holds it whole), with one checksum through them; a load runs
 * one checksum through them too. */
bool ckpt_piece_continues(const ckpt_ctx *c, const ckpt_stream *s, ckpt_walk walk, int rank, size_t k);

/* Waits for both buffers' tier I/O (always: the buffers may be freed next); st unless it is OK. */
strata_status ckpt_drain(ckpt_ctx *c, strata_status st);

/* Every rank learns every rank's status (a no-op in a world of one): STRATA_OK when all are; else, on every rank,
 * the status of the lowest rank that failed, with "<what>: rank R of N failed: <its message>" (its own message on
 * that rank), or the collective's own failure. */
strata_status ckpt_agree(strata_engine *e, strata_status local, const char *what);

#endif
