/*
 * strata_save: the engine's state into a checkpoint directory (format in engine/ckpt/ckpt_format.h). Each state
 * class is streamed from its tier array through one bounded buffer, module by module in aligned chunks, so the
 * model is never gathered in RAM and NVMe transfers stay 4 KiB-aligned. Pieces are laid out in flat-partition
 * order, which makes both the tier reads and the file writes sequential.
 *
 * A world of N ranks saves one checkpoint together (ckpt_stream.h, Pieces by rank): rank 0 makes the temporary
 * directory; every rank writes and fsyncs its own files, N writers in parallel; rank 0 learns every rank's file
 * sizes and checksums, writes the one manifest and makes the set visible with the single atomic exchange a world
 * of one uses. Until that exchange nothing the previous checkpoint holds is touched, so a crash or a failure on any
 * rank leaves it loadable; every rank returns the same status.
 *
 * Exact resume with the delayed update: a save waits for the update in flight but does not publish it; the
 * checkpoint keeps both parameter copies (visible and pending) and the pending step's result, and a load re-arms
 * it so the next strata_step publishes it exactly as an uninterrupted run would. At stages 1 and 2 with several
 * ranks the pending copy is still this rank's shard (ranks.c publishes it at the next step): it is saved from there.
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
#include "engine/ranks/ranks.h"
#include "engine/step/step.h"
#include "engine/step/train_step.h"
#include "engine/step/twin_flow.h"

#define MAX_STREAMS 2 /* state classes per file */

/* The state classes of each kind of file, as this save writes them. */
typedef struct save_plan {
    ckpt_stream s[CKPT_FILE_COUNT][MAX_STREAMS];
    int ns[CKPT_FILE_COUNT]; /* 0: the kind is not written */
} save_plan;

typedef struct save_ctx {
    ckpt_ctx c;
    save_plan plan;
    char tmp[STRATA_PATH_BYTES + 64];
    uint32_t *crcs;          /* this rank's pieces' checksums, in file order (model, optimizer, params) */
    size_t ncrcs, cap;
    uint64_t bytes[CKPT_FILE_COUNT];
} save_ctx;

/* The pieces rank writes into its file of a kind, in file order (without checksums or offsets); returns their
 * count. out holds ns * nparams entries. */
static size_t rank_pieces(const ckpt_ctx *c, const save_plan *pl, int kind, int rank, int world, ckpt_tensor *out)
{
    strata_engine *e = c->e;
    size_t n = 0;
    for (int s = 0; s < pl->ns[kind]; s++)
        for (size_t k = 0; k < registry_nparams(e->reg); k++) {
            const reg_param *p = CKPT_PARAM(e, c->ord[k]);
            uint64_t first, numel;
            if (!ckpt_stream_covers(e, &pl->s[kind][s], p) || !ckpt_own_piece(e, p, rank, &first, &numel))
                continue;
            if (ckpt_piece_continues(c, &pl->s[kind][s], CKPT_OWN, rank, k)) {
                out[n - 1].numel += numel; /* the next part of the tensor: the same piece */
                continue;
            }
            reg_tensor whole = registry_param_tensor(p);
            ckpt_tensor *t = &out[n++];
            memset(t, 0, sizeof *t);
            ckpt_tensor_name(e, p, pl->s[kind][s].suffix, t->name);
            t->file = kind;
            t->rank = world == 1 ? 0 : rank;
            t->dtype = pl->s[kind][s].dtype;
            t->total = whole.total;
            t->first = whole.first + first;
            t->numel = numel;
            t->ndim = whole.ndim;
            memcpy(t->dims, whole.dims, (size_t)whole.ndim * sizeof *t->dims);
        }
    return n;
}

/* Writes the slices of one chunk (cut at parameter boundaries) and runs their checksums. */
static strata_status save_chunk(ckpt_ctx *c, ckpt_writer *wr, const ckpt_stream *s, const ckpt_chunk *k,
                                const uint8_t *buf)
{
    strata_engine *e = c->e;
    size_t eb = ckpt_dtype_bytes(s->dtype);
    buf = ckpt_widen(c, s, k, buf);
    for (size_t i = c->mod_first[k->mi]; i < c->mod_first[k->mi + 1]; i++) {
        const reg_param *p = CKPT_PARAM(e, c->ord[i]);
        size_t lo = MAX(p->offset, k->lo), hi = MIN(p->offset + p->numel, k->lo + k->n);
        if (lo >= hi)
            continue;
        const uint8_t *src = buf + (lo - k->lo) * eb;
        if (lo == p->offset && ckpt_piece_continues(c, s, CKPT_OWN, e->rank, i))
            c->crc[i] = c->crc[i - 1]; /* the part before it is written whole: one piece, one checksum */
        c->crc[i] = crc32c(c->crc[i], src, (hi - lo) * eb);
        ERR_CHECK(ckpt_writer_put(wr, src, (hi - lo) * eb));
    }
    return STRATA_OK;
}

/* Streams this rank's part of one array into the open file: every chunk read from its tier (the next one in flight
 * while this one is written). */
static strata_status save_stream(ckpt_ctx *c, ckpt_writer *wr, const ckpt_stream *s)
{
    strata_engine *e = c->e;
    memset(c->crc, 0, registry_nparams(e->reg) * sizeof *c->crc);
    ckpt_chunk cur, next;
    bool have = ckpt_chunk_at(c, s, CKPT_OWN, 0, &cur);
    const uint8_t *host = tarr_host_ptr(s->arr, &e->tiers.env, 0);
    if (host) { /* host memory: written from where it lies, no copy */
        for (; have; have = ckpt_chunk_next(c, s, CKPT_OWN, &cur, &cur))
            ERR_CHECK(save_chunk(c, wr, s, &cur, host + cur.at * s->arr->elem_bytes));
        return STRATA_OK;
    }
    strata_status st = have ? tarr_read(s->arr, &e->tiers.env, cur.at, cur.n, c->buf[0], &c->w[0]) : STRATA_OK;
    for (int b = 0; have && st == STRATA_OK; b ^= 1) {
        bool more = ckpt_chunk_next(c, s, CKPT_OWN, &cur, &next);
        if (more)
            st = tarr_read(s->arr, &e->tiers.env, next.at, next.n, c->buf[b ^ 1], &c->w[b ^ 1]);
        if (st == STRATA_OK)
            st = io_wait_wait(&c->w[b]);
        if (st == STRATA_OK)
            st = save_chunk(c, wr, s, &cur, c->buf[b]);
        cur = next;
        have = more;
    }
    return ckpt_drain(c, st);
}

/* Writes this rank's file of a kind and appends its pieces' checksums to sc->crcs. */
static strata_status save_file(save_ctx *sc, int kind, ckpt_tensor *pieces)
{
    ckpt_ctx *c = &sc->c;
    strata_engine *e = c->e;
    size_t n = rank_pieces(c, &sc->plan, kind, e->rank, e->world, pieces);
    uint8_t *head;
    size_t head_len;
    ERR_CHECK(ckpt_st_header_build(pieces, n, false, &head, &head_len));
    char name[CKPT_FILE_NAME_BYTES];
    ckpt_file_name(e->world, e->rank, kind, name);
    ckpt_writer wr;
    strata_status st = ckpt_writer_open(&wr, sc->tmp, name);
    if (st != STRATA_OK && e->rank > 0)
        st = err_set(st, "%s; every rank writes its files into the directory rank 0 made, which must be on a "
                     "filesystem all ranks share", err_last());
    if (st == STRATA_OK)
        st = ckpt_writer_put(&wr, head, head_len);
    free(head);
    for (int s = 0; s < sc->plan.ns[kind] && st == STRATA_OK; s++) {
        const ckpt_stream *cs = &sc->plan.s[kind][s];
        st = save_stream(c, &wr, cs);
        for (size_t k = 0; k < registry_nparams(e->reg) && st == STRATA_OK; k++) {
            uint64_t first, numel;
            const reg_param *p = CKPT_PARAM(e, c->ord[k]);
            /* A piece's checksum is complete at its last part. */
            if (ckpt_stream_covers(e, cs, p) && ckpt_own_piece(e, p, e->rank, &first, &numel) &&
                !ckpt_piece_continues(c, cs, CKPT_OWN, e->rank, k + 1))
                sc->crcs[sc->ncrcs++] = c->crc[k];
        }
    }
    if (st != STRATA_OK) {
        ckpt_writer_abort(&wr);
        return st;
    }
    sc->bytes[kind] = wr.written + wr.used;
    return ckpt_writer_close(&wr);
}

/* Pieces rank writes in all its files. */
static size_t count_pieces(const ckpt_ctx *c, const save_plan *pl, int rank)
{
    size_t n = 0;
    for (int kind = 0; kind < CKPT_FILE_COUNT; kind++)
        for (int s = 0; s < pl->ns[kind]; s++)
            for (size_t k = 0; k < registry_nparams(c->e->reg); k++) {
                uint64_t first, numel;
                const reg_param *p = CKPT_PARAM(c->e, c->ord[k]);
                if (ckpt_stream_covers(c->e, &pl->s[kind][s], p) && ckpt_own_piece(c->e, p, rank, &first, &numel) &&
                    !ckpt_piece_continues(c, &pl->s[kind][s], CKPT_OWN, rank, k))
                    n++;
            }
    return n;
}

/* What each rank reports after writing its files, in 32-bit words: its files' sizes (two words each, low first),
 * then its pieces' checksums in file order. */
#define REPORT_HEAD (2 * CKPT_FILE_COUNT)

/* Rank 0: the manifest's pieces of every rank (recomputed from the layout, as each rank laid out its files) with
 * the checksums and file sizes the ranks reported (rank r's at reps + r * stride). */
static strata_status collect(save_ctx *sc, ckpt_manifest *m, const uint32_t *reps, size_t stride)
{
    ckpt_ctx *c = &sc->c;
    strata_engine *e = c->e;
    size_t per_file = MAX_STREAMS * registry_nparams(e->reg);
    m->tensors = calloc((size_t)e->world * CKPT_FILE_COUNT * per_file + 1, sizeof *m->tensors);
    m->file_bytes = calloc((size_t)e->world * CKPT_FILE_COUNT, sizeof *m->file_bytes);
    if (!m->tensors || !m->file_bytes)
        return err_set(STRATA_ENOMEM, "strata_save: out of memory for the manifest of %d ranks", e->world);
    for (int r = 0; r < e->world; r++) {
        const uint32_t *rep = reps + (size_t)r * stride, *crc = rep + REPORT_HEAD;
        for (int kind = 0; kind < CKPT_FILE_COUNT; kind++) {
            if (!sc->plan.ns[kind])
                continue;
            ckpt_tensor *t = &m->tensors[m->ntensors];
            size_t n = rank_pieces(c, &sc->plan, kind, r, e->world, t);
            uint8_t *head;
            size_t head_len;
            ERR_CHECK(ckpt_st_header_build(t, n, false, &head, &head_len));
            free(head);
            uint64_t want = head_len + (n ? t[n - 1].end : 0);
            uint64_t got = (uint64_t)rep[2 * kind] | (uint64_t)rep[2 * kind + 1] << 32;
            char file[CKPT_FILE_NAME_BYTES];
            ckpt_file_name(e->world, r, kind, file);
            if (got != want)
                return err_set(STRATA_EINTERNAL, "strata_save: rank %d wrote %" PRIu64 " bytes into its %s; rank 0 "
                               "expects %" PRIu64 " for its %zu pieces", r, got, file, want, n);
            for (size_t i = 0; i < n; i++)
                t[i].crc = *crc++;
            m->file_bytes[(size_t)r * CKPT_FILE_COUNT + kind] = got;
            m->ntensors += n;
        }
    }
    return STRATA_OK;
}

static strata_status write_manifest(const ckpt_manifest *m, const strata_config *cfg, const char *tmp)
{
    char *text;
    ERR_CHECK(ckpt_manifest_build(m, cfg, &text));
    ckpt_writer wr;
    strata_status st = ckpt_writer_open(&wr, tmp, CKPT_MANIFEST);
    if (st == STRATA_OK)
        st = ckpt_writer_put(&wr, text, strlen(text));
    free(text);
    if (st != STRATA_OK) {
        ckpt_writer_abort(&wr);
        return st;
    }
    return ckpt_writer_close(&wr);
}

/* After every rank wrote its files (local: this rank's status): every rank learns whether all succeeded; rank 0
 * gathers the sizes and checksums, writes the manifest and commits. The same status on every rank. */
static strata_status finish(save_ctx *sc, strata_status local, ckpt_manifest *m, const char *dir)
{
    strata_engine *e = sc->c.e;
    /* Every rank knows how many pieces each rank writes: the reports travel as equal blocks of the longest. */
    size_t stride = 0;
    for (int r = 0; r < e->world; r++)
        stride = MAX(stride, REPORT_HEAD + count_pieces(&sc->c, &sc->plan, r));
    uint32_t *mine = calloc(stride, sizeof *mine), *reps = calloc((size_t)e->world * stride, sizeof *reps);
    if (local == STRATA_OK && (!mine || !reps))
        local = err_set(STRATA_ENOMEM, "strata_save: out of memory for the ranks' checksums (%d x %zu)", e->world,
                        stride);
    if (local == STRATA_OK && sc->ncrcs != count_pieces(&sc->c, &sc->plan, e->rank))
        local = err_set(STRATA_EINTERNAL, "strata_save: rank %d wrote %zu pieces, the layout says %zu", e->rank,
                        sc->ncrcs, count_pieces(&sc->c, &sc->plan, e->rank));
    strata_status st = ckpt_agree(e, local, "strata_save");
    if (st == STRATA_OK) {
        for (int kind = 0; kind < CKPT_FILE_COUNT; kind++) {
            mine[2 * kind] = (uint32_t)sc->bytes[kind];
            mine[2 * kind + 1] = (uint32_t)(sc->bytes[kind] >> 32);
        }
        if (sc->ncrcs)
            memcpy(mine + REPORT_HEAD, sc->crcs, sc->ncrcs * sizeof *mine);
        if (e->world == 1)
            memcpy(reps, mine, stride * sizeof *mine);
        else
            st = comm_allgather(e->comm, mine, reps, stride, COMM_I32);
    }
    strata_status st0 = st;
    if (e->rank == 0 && st == STRATA_OK) {
        st0 = collect(sc, m, reps, stride);
        if (st0 == STRATA_OK)
            st0 = write_manifest(m, &e->cfg, sc->tmp);
        if (st0 == STRATA_OK)
            st0 = ckpt_dir_commit(sc->tmp, dir);
    }
    free(mine);
    free(reps);
    if (e->rank == 0 && st0 != STRATA_OK)
        ckpt_dir_remove(sc->tmp); /* every rank is past its writes: what they wrote goes too */
    if (st != STRATA_OK)
        return st;
    /* Rank 0's outcome is every rank's (it alone can have failed since the last agreement). */
    return ckpt_agree(e, st0, "strata_save");
}

/* Everything a save checks before it writes: the same answer on every rank comes from ckpt_agree. */
static strata_status prepare(strata_engine *e, const char *dir, strata_step_result *pending_res, bool *pending)
{
    if (!dir || !dir[0])
        return err_set(STRATA_EINVAL, "strata_save: dir is NULL or empty");
    ERR_CHECK(ckpt_quiesce(e, "strata_save"));
    strata_module_id touched = grads_first_unconsumed(e->grads);
    if (touched != STRATA_INVALID_ID)
        return err_set(STRATA_ESTATE, "strata_save: module \"%s\" has gradients accumulated since the last "
                       "strata_step; save right after a step, before the next backward pass",
                       CKPT_MODULE(e, touched)->name);
    /* The delayed update in flight must finish (its master weights and moments are part of the state) but stay
     * unpublished: the trainer still computes with the older parameters until the next step. */
    ERR_CHECK(opt_job_settle(e->opt, pending_res, pending));
    ERR_CHECK(step_settle(e, e->step)); /* the drive holds the newest optimizer state */
    return twin_flow_store(e, e->twin); /* the optimizer's device share into the arrays saved */
}

static void plan_streams(strata_engine *e, bool has_next, save_plan *pl)
{
    memset(pl, 0, sizeof *pl);
    int back = 1 - e->tiers.param_front;
    pl->s[CKPT_FILE_MODEL][0] = ckpt_plain_stream(&e->tiers.master, e->views.opt, "", STRATA_DTYPE_FP32);
    pl->ns[CKPT_FILE_MODEL] = 1;
    ckpt_moment_streams(e, pl->s[CKPT_FILE_OPTIMIZER]);
    pl->ns[CKPT_FILE_OPTIMIZER] = 2;
    pl->s[CKPT_FILE_PARAMS][0] = ckpt_plain_stream(&e->tiers.param[e->tiers.param_front], e->views.param, "",
                                                  e->cfg.param_dtype);
    if (has_next)
        pl->s[CKPT_FILE_PARAMS][1] = ckpt_plain_stream(ranks_step_params(e, back), ranks_step_params_view(e), ".next",
                                                      e->cfg.param_dtype);
    /* fp32 parameters equal the master weights unless an update is pending, or a frozen module has none: no copy
     * needed then. */
    if (e->cfg.param_dtype != STRATA_DTYPE_FP32 || has_next || registry_nfrozen(e->reg))
        pl->ns[CKPT_FILE_PARAMS] = has_next ? 2 : 1;
}

static strata_status save(strata_engine *e, const char *dir)
{
    strata_step_result pending_res = {0};
    bool pending = false;
    save_ctx sc;
    memset(&sc, 0, sizeof sc);
    strata_status st = prepare(e, dir, &pending_res, &pending);
    if (st == STRATA_OK)
        st = ckpt_ctx_init(&sc.c, e);
    size_t nparams = e->reg ? registry_nparams(e->reg) : 0;
    ckpt_tensor *pieces = calloc(MAX_STREAMS * nparams + 1, sizeof *pieces);
    sc.cap = CKPT_FILE_COUNT * MAX_STREAMS * nparams + 1;
    sc.crcs = calloc(sc.cap, sizeof *sc.crcs);
    if (st == STRATA_OK && (!pieces || !sc.crcs))
        st = err_set(STRATA_ENOMEM, "strata_save: out of memory for %zu parameters", nparams);
    bool made = false;
    if (st == STRATA_OK && e->rank == 0)
        made = (st = ckpt_dir_begin(dir, sc.tmp, sizeof sc.tmp)) == STRATA_OK;
    else if (st == STRATA_OK)
        st = ckpt_dir_tmp(dir, sc.tmp, sizeof sc.tmp);
    st = ckpt_agree(e, st, "strata_save"); /* the temporary directory exists, and every rank can write */
    uint64_t t0 = now_ns();
    ckpt_manifest m = {0};
    if (st == STRATA_OK) {
        bool has_next = pending && !pending_res.skipped;
        plan_streams(e, has_next, &sc.plan);
        for (int kind = 0; kind < CKPT_FILE_COUNT && st == STRATA_OK; kind++)
            if (sc.plan.ns[kind])
                st = save_file(&sc, kind, pieces);
        train_progress pr;
        driver_progress(e->driver, &pr);
        m = (ckpt_manifest){.version = CKPT_FORMAT_VERSION, .world = e->world, .step = step_count(e->step),
                            .iterations = pr.iterations, .steps = (int64_t)pr.steps,
                            .skipped_steps = (int64_t)pr.skipped_steps, .loss_scale = pr.loss_scale,
                            .good_steps = pr.good_steps, .hysteresis_left = pr.hysteresis_left,
                            .param_dtype = e->cfg.param_dtype, .pending = pending, .pending_result = pending_res};
        if (st == STRATA_OK)
            st = ckpt_groups_text(e, &m.groups_json);
        st = finish(&sc, st, &m, dir); /* every rank's status is agreed there */
    } else if (made) {
        ckpt_dir_remove(sc.tmp);
    }
    if (st == STRATA_OK)
        LOG_INFO(LOG_CORE, "saved step %" PRId64 " (rank %d of %d: %zu pieces) to \"%s\" in %.1f ms", m.step,
                 e->rank, e->world, sc.ncrcs, dir, (double)(now_ns() - t0) / 1e6);
    ckpt_manifest_free(&m);
    free(pieces);
    free(sc.crcs);
    ckpt_ctx_free(&sc.c);
    return st;
}

STRATA_API strata_status strata_save(strata_engine *e, const char *dir)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_save: engine is NULL");
    /* "dir/" names dir, but its trailing slash would make the kernel follow a link at dir where a save replaces the
     * name itself (ckpt_dir.c): saved without it. Too long a path is left for ckpt_dir_sibling to refuse. */
    char norm[STRATA_PATH_BYTES + 64];
    if (dir && strlen(dir) < sizeof norm) {
        memcpy(norm, dir, strlen(dir) + 1);
        for (size_t n = strlen(norm); n > 1 && norm[n - 1] == '/'; n--)
            norm[n - 1] = '\0';
        dir = norm;
    }
    return err_copy(&e->err, save(e, dir));
}
