/*
 * strata_load: a checkpoint directory into the engine's tier arrays, written by a world of any size into a world of
 * any size. Every rank reads the manifest and, for each state class, the elements its own views hold (its shard of
 * a partitioned class, the whole module of a replicated one) from whichever pieces of whichever ranks' files hold
 * them: tensors are stored by name and element offset, so a new world reshards them as it reads (ckpt_stream.h).
 *
 * Order: everything checkable (the model's names, dtypes and sizes against the manifest, the header and size of
 * every file this rank reads) is checked on every rank, and the ranks agree, before any state is touched; a
 * checksum failure found while streaming fails every rank (the state is then a mix: strata_step refuses until a load
 * succeeds). Every piece a rank reads is checked whole against its crc32c, also where the rank keeps only part of
 * it: the rest is read through a small buffer for the checksum alone.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/crc32c.h"
#include "base/log.h"
#include "base/util.h"
#include "engine/ckpt/ckpt_files.h"
#include "engine/ckpt/ckpt_groups.h"
#include "engine/ckpt/ckpt_stream.h"
#include "engine/config/config.h"
#include "engine/plan/host_cache.h"
#include "engine/ranks/ranks.h"
#include "engine/step/step.h"
#include "engine/step/step_in_backward.h"
#include "engine/step/train_step.h"
#include "engine/step/twin_flow.h"

#define SCRATCH_BYTES ((size_t)1 << 20)

/* The state classes one kind of file fills. */
typedef struct load_work {
    int kind;
    ckpt_stream s[2];
    int ns;
} load_work;

typedef struct load_ctx {
    ckpt_ctx c;
    ckpt_manifest m;
    ckpt_file *files;              /* [rank * CKPT_FILE_COUNT + kind] over the manifest's world */
    bool *needed;                  /* the same: this rank reads from that file */
    int open_rank[CKPT_FILE_COUNT]; /* per kind: the rank whose file is open now, or -1 */
    uint8_t *scratch;              /* the parts of a piece this rank does not keep, read for its checksum */
    load_work work[CKPT_FILE_COUNT];
} load_ctx;

static strata_status check_compatible(const strata_engine *e, const ckpt_manifest *m, const char *dir)
{
    if (m->pending && !e->cfg.delayed_update)
        return err_set(STRATA_ECONFIG, "strata_load(\"%s\"): the checkpoint holds a delayed update not yet visible "
                       "to the trainer; set strata.delayed_update = true to resume it exactly", dir);
    if (m->param_dtype != e->cfg.param_dtype && (!ckpt_manifest_has(m, CKPT_FILE_PARAMS) || m->pending))
        return err_set(STRATA_ECONFIG, "strata_load(\"%s\"): the checkpoint's parameters are %s, the engine's %s; "
                       "resume with the same precision (bf16/fp16 settings)", dir, ckpt_dtype_name(m->param_dtype),
                       ckpt_dtype_name(e->cfg.param_dtype));
    return STRATA_OK;
}

/* Which array each kind of file fills, for this checkpoint and this engine. */
static void plan_work(load_ctx *lc)
{
    strata_engine *e = lc->c.e;
    const ckpt_manifest *m = &lc->m;
    bool has_next = m->pending && !m->pending_result.skipped;
    bool params_file = ckpt_manifest_has(m, CKPT_FILE_PARAMS) && m->param_dtype == e->cfg.param_dtype;
    strata_dtype pdt = e->cfg.param_dtype;
    /* fp32 parameters without a params file are the master weights: the model's tensors fill both. */
    lc->work[0] = (load_work){CKPT_FILE_MODEL,
                              {ckpt_plain_stream(&e->tiers.master, e->views.opt, "", STRATA_DTYPE_FP32),
                               ckpt_plain_stream(&e->tiers.param[0], e->views.param, "", STRATA_DTYPE_FP32)},
                              params_file ? 1 : 2};
    lc->work[1] = (load_work){.kind = CKPT_FILE_OPTIMIZER, .ns = 2};
    ckpt_moment_streams(e, lc->work[1].s);
    /* The pending copy goes where the next strata_step publishes it from (param_front is 0 after a load). */
    lc->work[2] = (load_work){CKPT_FILE_PARAMS,
                              {ckpt_plain_stream(&e->tiers.param[0], e->views.param, "", pdt),
                               ckpt_plain_stream(ranks_step_params(e, 1), ranks_step_params_view(e), ".next", pdt)},
                              params_file ? (has_next ? 2 : 1) : 0};
}

/* The files of a kind as a message names them: "model.safetensors" (one rank), "model.rank{0..3}.safetensors". */
static const char *kind_files(const ckpt_manifest *m, int kind, char *out, size_t len)
{
    static const char *const stems[CKPT_FILE_COUNT] = {"model", "optimizer", "params"};
    if (m->world == 1)
        snprintf(out, len, "%s", ckpt_file_names[kind]);
    else
        snprintf(out, len, "%s.rank{0..%d}.safetensors", stems[kind], m->world - 1);
    return out;
}

/* Checks that the checkpoint holds every tensor of s for this model and marks the files holding what this rank
 * reads, and (used, per manifest piece) the tensors the model asked for. */
static strata_status match_stream(load_ctx *lc, const ckpt_stream *s, int kind, bool *used)
{
    strata_engine *e = lc->c.e;
    char files[CKPT_FILE_NAME_BYTES + 16], file[CKPT_FILE_NAME_BYTES];
    for (size_t k = 0; k < registry_nparams(e->reg); k++) {
        const reg_param *p = CKPT_PARAM(e, lc->c.ord[k]);
        if (!ckpt_stream_covers(e, s, p))
            continue; /* a frozen module's gradients and optimizer state do not exist */
        char name[CKPT_NAME_BYTES];
        ckpt_tensor_name(e, p, s->suffix, name);
        const ckpt_tensor *t = ckpt_manifest_piece(&lc->m, kind, name, 0);
        if (!t)
            return err_set(STRATA_ECORRUPT, "strata_load: the checkpoint has no tensor \"%s\" in its %s files; it was "
                           "saved from a different model", name, kind_files(&lc->m, kind, files, sizeof files));
        used[t - lc->m.tensors] = true;
        ckpt_file_name(lc->m.world, t->rank, kind, file);
        reg_tensor whole = registry_param_tensor(p);
        if (t->dtype != s->dtype || t->total != whole.total)
            return err_set(STRATA_ECORRUPT, "strata_load: %s: tensor \"%s\" is %s x %" PRIu64 ", the engine's "
                           "%s %s x %" PRIu64 "; it was saved from a different model", file, name,
                           ckpt_dtype_name(t->dtype), t->total, registry_param_is_part(p) ? "tensor is" : "parameter is",
                           ckpt_dtype_name(s->dtype), whole.total);
        /* The same size in another shape (a transposed weight) would load without complaint and train on
         * scrambled values: where both sides know the shape, it must agree. */
        if (t->ndim && whole.ndim &&
            (t->ndim != whole.ndim || memcmp(t->dims, whole.dims, sizeof *t->dims * (size_t)whole.ndim) != 0)) {
            char want[STRATA_MAX_DIMS * 24 + 8], have[STRATA_MAX_DIMS * 24 + 8];
            registry_shape_str(t->ndim, t->dims, have, sizeof have);
            registry_shape_str(whole.ndim, whole.dims, want, sizeof want);
            return err_set(STRATA_ECORRUPT, "strata_load: %s: tensor \"%s\" has the model shape %s, the engine's "
                           "%s %s (%s); it was saved from a differently shaped model — load it into a model of "
                           "that shape", file, name, have, registry_param_is_part(p) ? "tensor" : "parameter", want,
                           registry_param_is_part(p) ? "strata_param_set_part" : "strata_param_set_shape");
        }
        uint64_t first, numel;
        if (!ckpt_held_piece(e, s, p, &first, &numel))
            continue;
        first += whole.first; /* in the tensor's elements */
        for (uint64_t x = first; x < first + numel; x = t->first + t->numel) {
            t = ckpt_manifest_piece(&lc->m, kind, name, x); /* never NULL: the parser checked the coverage */
            lc->needed[(size_t)t->rank * CKPT_FILE_COUNT + (size_t)kind] = true;
        }
    }
    return STRATA_OK;
}

/* A checkpoint with tensors the model lacks (one of more layers) would otherwise load what matches and drop the
 * rest: refused, naming how many and the first few. used: per manifest piece, whether the model asked for it. */
static strata_status refuse_extras(const load_ctx *lc, const bool *used)
{
    const ckpt_manifest *m = &lc->m;
    size_t extra = 0;
    int first_kind = -1;
    char names[3 * CKPT_NAME_BYTES + 16] = "";
    for (size_t i = 0; i < m->ntensors; i++) {
        const ckpt_tensor *t = &m->tensors[m->index[i]];
        bool read = false; /* only the kinds this load reads are compared */
        for (int w = 0; w < CKPT_FILE_COUNT; w++)
            read = read || (lc->work[w].kind == t->file && lc->work[w].ns > 0);
        if (first_kind >= 0 && t->file != first_kind)
            break; /* the model's lacks, named in the first kind of file that has any (the pieces sort by kind) */
        if (t->first != 0 || used[m->index[i]] || !read)
            continue;
        if (extra++ < 3) {
            size_t n = strlen(names);
            snprintf(names + n, sizeof names - n, "%s\"%s\"", n ? ", " : "", t->name);
        }
        if (first_kind < 0)
            first_kind = t->file;
    }
    if (!extra)
        return STRATA_OK;
    char files[CKPT_FILE_NAME_BYTES + 16];
    return err_set(STRATA_ECORRUPT, "strata_load: the checkpoint holds %zu tensor%s the model lacks in its %s files "
                   "(%s%s); it was saved from a different model (more layers or other modules?) — resume with the "
                   "model it was saved from", extra, extra == 1 ? "" : "s", kind_files(m, first_kind, files, sizeof files),
                   names, extra > 3 ? ", ..." : "");
}

/* Matches every stream and checks the header and size of every file this rank reads (closed again until
 * streaming: a world of many ranks has many files). */
static strata_status prepare(load_ctx *lc, const char *dir)
{
    const ckpt_manifest *m = &lc->m;
    size_t nfiles = (size_t)m->world * CKPT_FILE_COUNT;
    lc->files = calloc(nfiles, sizeof *lc->files);
    for (size_t i = 0; lc->files && i < nfiles; i++)
        lc->files[i].fd = -1;
    lc->needed = calloc(nfiles, sizeof *lc->needed);
    if (!lc->files || !lc->needed || posix_memalign((void **)&lc->scratch, 4096, SCRATCH_BYTES) != 0)
        return err_set(STRATA_ENOMEM, "strata_load: out of memory for the files of %d ranks", m->world);
    for (int k = 0; k < CKPT_FILE_COUNT; k++)
        lc->open_rank[k] = -1;
    plan_work(lc);
    bool *used = calloc(m->ntensors + 1, sizeof *used);
    if (!used)
        return err_set(STRATA_ENOMEM, "strata_load: out of memory for %zu tensors", m->ntensors);
    strata_status st = STRATA_OK;
    for (int w = 0; w < CKPT_FILE_COUNT && st == STRATA_OK; w++)
        for (int s = 0; s < lc->work[w].ns && st == STRATA_OK; s++)
            st = match_stream(lc, &lc->work[w].s[s], lc->work[w].kind, used);
    if (st == STRATA_OK)
        st = refuse_extras(lc, used);
    free(used);
    ERR_CHECK(st);
    for (size_t i = 0; i < nfiles; i++) {
        if (!lc->needed[i])
            continue;
        ERR_CHECK(ckpt_file_open(dir, m, (int)(i / CKPT_FILE_COUNT), (int)(i % CKPT_FILE_COUNT), &lc->files[i]));
        ckpt_file_close(&lc->files[i]);
    }
    return STRATA_OK;
}

/* The file of rank and kind, open. */
static strata_status file_of(load_ctx *lc, int rank, int kind, ckpt_file **out)
{
    ckpt_file *f = &lc->files[(size_t)rank * CKPT_FILE_COUNT + (size_t)kind];
    if (lc->open_rank[kind] != rank) {
        if (lc->open_rank[kind] >= 0)
            ckpt_file_close(&lc->files[(size_t)lc->open_rank[kind] * CKPT_FILE_COUNT + (size_t)kind]);
        lc->open_rank[kind] = -1;
        ERR_CHECK(ckpt_file_reopen(f));
        lc->open_rank[kind] = rank;
    }
    *out = f;
    return STRATA_OK;
}

/* Runs crc over elements [from, to) of piece t that this rank does not keep. */
static strata_status crc_skip(load_ctx *lc, const ckpt_file *f, const ckpt_tensor *t, uint64_t from, uint64_t to,
                              uint32_t *crc)
{
    size_t eb = ckpt_dtype_bytes(t->dtype);
    uint64_t off = t->begin + (from - t->first) * eb, end = t->begin + (to - t->first) * eb;
    for (; off < end; off += SCRATCH_BYTES) {
        size_t n = (size_t)MIN((uint64_t)SCRATCH_BYTES, end - off);
        ERR_CHECK(ckpt_file_read(f, off, lc->scratch, n, t->name));
        *crc = crc32c(*crc, lc->scratch, n);
    }
    return STRATA_OK;
}

/* Elements [x, y) of the tensor of parameter i (position in ord) from its pieces into dst; checks each piece's crc32c
 * once the last element of it this rank keeps (up to keep_hi of the tensor) has arrived. */
static strata_status load_slice(load_ctx *lc, const ckpt_stream *s, int kind, size_t i, uint64_t x, uint64_t y,
                                uint64_t keep_hi, uint8_t *dst)
{
    ckpt_ctx *c = &lc->c;
    const reg_param *p = CKPT_PARAM(c->e, c->ord[i]);
    size_t eb = ckpt_dtype_bytes(s->dtype);
    char name[CKPT_NAME_BYTES];
    ckpt_tensor_name(c->e, p, s->suffix, name);
    if (x == registry_param_tensor(p).first && ckpt_piece_continues(c, s, CKPT_HELD, c->e->rank, i)) {
        c->cur[i] = c->cur[i - 1]; /* the part before it left its piece's checksum running */
        c->crc[i] = c->crc[i - 1];
    }
    while (x < y) {
        const ckpt_tensor *t = ckpt_manifest_piece(&lc->m, kind, name, x);
        ckpt_file *f;
        ERR_CHECK(file_of(lc, t->rank, kind, &f));
        uint64_t te = t->first + t->numel, z = MIN(y, te);
        if (c->cur[i] != t) { /* a new piece: what comes before the part kept counts towards its checksum */
            c->cur[i] = t;
            c->crc[i] = 0;
            ERR_CHECK(crc_skip(lc, f, t, t->first, x, &c->crc[i]));
        }
        ERR_CHECK(ckpt_file_read(f, t->begin + (x - t->first) * eb, dst, (size_t)(z - x) * eb, t->name));
        c->crc[i] = crc32c(c->crc[i], dst, (size_t)(z - x) * eb);
        if (z == MIN(te, keep_hi)) {
            ERR_CHECK(crc_skip(lc, f, t, z, te, &c->crc[i]));
            if (c->crc[i] != t->crc)
                return err_set(STRATA_ECORRUPT, "strata_load: checkpoint \"%s\": tensor \"%s\": crc32c %08x, the "
                               "manifest says %08x (the file was damaged after it was written); load another "
                               "checkpoint", f->path, t->name, c->crc[i], t->crc);
        }
        dst += (size_t)(z - x) * eb;
        x = z;
    }
    return STRATA_OK;
}

/* Fills buf with chunk k of stream s (padding zero, as finalize wrote it), in the array's form. */
static strata_status load_chunk(load_ctx *lc, const ckpt_stream *s, int kind, const ckpt_chunk *k, uint8_t *out)
{
    ckpt_ctx *c = &lc->c;
    size_t eb = ckpt_dtype_bytes(s->dtype);
    uint8_t *buf = s->form == STRATA_MOMENTS_FP32 ? out : (uint8_t *)c->wide;
    memset(buf, 0, k->n * eb);
    for (size_t i = c->mod_first[k->mi]; i < c->mod_first[k->mi + 1]; i++) {
        const reg_param *p = CKPT_PARAM(c->e, c->ord[i]);
        size_t lo = MAX(p->offset, k->lo), hi = MIN(p->offset + p->numel, k->lo + k->n);
        if (lo >= hi)
            continue;
        /* A piece that runs on into the next part of the tensor is checked there, once, not re-read for each. */
        uint64_t first = registry_param_tensor(p).first;
        uint64_t keep_hi = ckpt_piece_continues(c, s, CKPT_HELD, c->e->rank, i + 1)
                               ? UINT64_MAX
                               : first + (MIN(p->offset + p->numel, k->span_end) - p->offset);
        ERR_CHECK(load_slice(lc, s, kind, i, first + (lo - p->offset), first + (hi - p->offset), keep_hi,
                             buf + (lo - k->lo) * eb));
    }
    if (buf != out)
        ckpt_narrow(c, s, k, out);
    return STRATA_OK;
}

/* Streams one family of tensors into its array: the tier write of one chunk overlaps the file reads of the next. */
static strata_status load_stream(load_ctx *lc, const ckpt_stream *s, int kind)
{
    ckpt_ctx *c = &lc->c;
    strata_engine *e = c->e;
    memset(c->crc, 0, registry_nparams(e->reg) * sizeof *c->crc);
    memset(c->cur, 0, registry_nparams(e->reg) * sizeof *c->cur);
    ckpt_chunk k;
    bool have = ckpt_chunk_at(c, s, CKPT_HELD, 0, &k);
    uint8_t *host = tarr_host_ptr(s->arr, &e->tiers.env, 0);
    if (host) { /* host memory: read into place, no copy */
        for (; have; have = ckpt_chunk_next(c, s, CKPT_HELD, &k, &k))
            ERR_CHECK(load_chunk(lc, s, kind, &k, host + k.at * s->arr->elem_bytes));
        return STRATA_OK;
    }
    strata_status st = STRATA_OK;
    for (int b = 0; have && st == STRATA_OK; b ^= 1) {
        st = io_wait_wait(&c->w[b]); /* the buffer's previous write has left it */
        if (st == STRATA_OK)
            st = load_chunk(lc, s, kind, &k, c->buf[b]);
        if (st == STRATA_OK)
            st = tarr_write(s->arr, &e->tiers.env, k.at, k.n, c->buf[b], &c->w[b]);
        have = ckpt_chunk_next(c, s, CKPT_HELD, &k, &k);
    }
    return ckpt_drain(c, st);
}

static strata_status stream_all(load_ctx *lc)
{
    for (int w = 0; w < CKPT_FILE_COUNT; w++)
        for (int s = 0; s < lc->work[w].ns; s++)
            ERR_CHECK(load_stream(lc, &lc->work[w].s[s], lc->work[w].kind));
    return STRATA_OK;
}

static void apply(strata_engine *e, const ckpt_manifest *m, const char *dir)
{
    step_set_count(e->step, m->step);
    driver_restore(e->driver, &(train_progress){.iterations = m->iterations, .steps = (uint64_t)m->steps,
                                                .skipped_steps = (uint64_t)m->skipped_steps,
                                                .loss_scale = m->loss_scale, .good_steps = m->good_steps,
                                                .hysteresis_left = m->hysteresis_left});
    e->tiers.param_front = 0;
    grads_reset(e->grads);
    if (m->pending)
        opt_job_restore(e->opt, &m->pending_result);
    e->ckpt_incomplete = false;
    LOG_INFO(LOG_CORE, "loaded step %" PRId64 " from \"%s\" (saved by %d rank%s)%s", m->step, dir, m->world,
             m->world == 1 ? "" : "s", m->pending ? " with a delayed update pending" : "");
}

/* Whatever this engine had in flight is about to be replaced: finish it, publish nothing. */
static strata_status drop_in_flight(strata_engine *e)
{
    ERR_CHECK(ckpt_quiesce(e, "strata_load"));
    strata_step_result unused;
    bool had;
    ERR_CHECK(opt_job_join(e->opt, &unused, &had));
    ERR_CHECK(step_settle(e, e->step)); /* no write-back may land after the load's writes */
    ERR_CHECK(dev_stream_sync(e->h2d));
    residency_invalidate_all(e);
    step_forget(e->step); /* the optimizer state on NVMe is about to change */
    host_cache_forget(e); /* and so is every mirror of it: the load's writes refill them */
    return STRATA_OK;
}

static strata_status load(strata_engine *e, const char *dir)
{
    load_ctx lc;
    memset(&lc, 0, sizeof lc);
    strata_status st = dir && dir[0] ? STRATA_OK : err_set(STRATA_EINVAL, "strata_load: dir is NULL or empty");
    if (st == STRATA_OK && e->in_backward && step_in_backward_under_way(e->in_backward))
        st = err_set(STRATA_ESTATE, "strata_load: a step in backward is under way (its hand-overs have begun: updates "
                     "ran, or its norm pass measured the state as it was); end it with strata_step (which reports "
                     "its failure, if any), then load, or load before the step's backward");
    bool dropped = false;
    if (st == STRATA_OK)
        dropped = (st = drop_in_flight(e)) == STRATA_OK;
    if (st == STRATA_OK)
        st = ckpt_ctx_init(&lc.c, e);
    if (st == STRATA_OK)
        st = ckpt_manifest_read(dir, &lc.m);
    if (st == STRATA_OK)
        st = check_compatible(e, &lc.m, dir);
    if (st == STRATA_OK)
        st = ckpt_groups_check(e, lc.m.groups_json, dir);
    if (st == STRATA_OK)
        st = prepare(&lc, dir);
    st = ckpt_agree(e, st, "strata_load"); /* nothing is touched unless every rank can load its part */
    if (st == STRATA_OK) {
        e->ckpt_incomplete = true;
        st = ckpt_agree(e, stream_all(&lc), "strata_load");
    }
    if (st == STRATA_OK)
        st = twin_flow_load(e, e->twin); /* the loaded state of the optimizer's device share */
    if (st == STRATA_OK) {
        apply(e, &lc.m, dir);
        ckpt_groups_apply(e, lc.m.groups_json);
    }
    if (st == STRATA_OK && lc.m.moments != e->tiers.moments)
        LOG_INFO(LOG_CKPT, "strata_load(\"%s\"): the checkpoint's moments were trained in %s, this engine keeps them "
                 "in %s (strata.optimizer_moments): converted", dir, cfg_moments_name(lc.m.moments),
                 cfg_moments_name(e->tiers.moments));
    else if (st == STRATA_OK && lc.c.inexact)
        LOG_WARN(LOG_CKPT, "strata_load(\"%s\"): %zu blocks of 8-bit moments (2048 elements each) were quantized "
                 "again inexactly: their scale was below FLT_MIN (values under 1.2e-38, which read back as about 0); "
                 "training goes on from the nearest codes", dir, lc.c.inexact);
    if (dropped)
        residency_invalidate_all(e); /* device-tier modules point into the front copy */
    for (size_t i = 0; lc.files && i < (size_t)lc.m.world * CKPT_FILE_COUNT; i++)
        ckpt_file_close(&lc.files[i]);
    free(lc.files);
    free(lc.needed);
    free(lc.scratch);
    ckpt_manifest_free(&lc.m);
    ckpt_ctx_free(&lc.c);
    return st;
}

STRATA_API strata_status strata_load(strata_engine *e, const char *dir)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_load: engine is NULL");
    return err_copy(&e->err, load(e, dir));
}
