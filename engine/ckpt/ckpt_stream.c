/* The walk over a state class that save and load share, and the ranks' agreement; see ckpt_stream.h. */
#include "engine/ckpt/ckpt_stream.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/util.h"
#include "cpu_adam/moments.h"
#include "cpu_adam/moments_convert.h"

/* Module by module in id order (the walks' order), each module's parameters by offset. */
static int by_module_offset(const void *a, const void *b, void *ctx)
{
    const registry *reg = ctx;
    const reg_param *pa = registry_param(reg, (strata_param_id)*(const size_t *)a);
    const reg_param *pb = registry_param(reg, (strata_param_id)*(const size_t *)b);
    if (pa->module != pb->module)
        return pa->module < pb->module ? -1 : 1;
    return pa->offset < pb->offset ? -1 : pa->offset > pb->offset;
}

strata_status ckpt_ctx_init(ckpt_ctx *c, strata_engine *e)
{
    memset(c, 0, sizeof *c);
    c->e = e;
    io_wait_init(&c->w[0]);
    io_wait_init(&c->w[1]);
    size_t nparams = registry_nparams(e->reg), nmods = registry_nmodules(e->reg);
    c->ord = malloc((nparams + 1) * sizeof *c->ord);
    c->mod_first = malloc((nmods + 1) * sizeof *c->mod_first);
    c->crc = malloc((nparams + 1) * sizeof *c->crc);
    c->cur = malloc((nparams + 1) * sizeof *c->cur);
    void *b0 = NULL, *b1 = NULL, *wide = NULL;
    bool bufs = posix_memalign(&b0, 4096, CKPT_CHUNK_NUMEL * 4) == 0 &&
                posix_memalign(&b1, 4096, CKPT_CHUNK_NUMEL * 4) == 0 &&
                (e->tiers.moments == STRATA_MOMENTS_FP32 || posix_memalign(&wide, 4096, CKPT_CHUNK_NUMEL * 4) == 0);
    c->buf[0] = b0;
    c->buf[1] = b1;
    c->wide = wide;
    if (!c->ord || !c->mod_first || !c->crc || !c->cur || !bufs)
        return err_set(STRATA_ENOMEM, "checkpoint: out of memory for the streaming buffers");
    for (size_t i = 0; i < nparams; i++)
        c->ord[i] = i;
    qsort_r(c->ord, nparams, sizeof *c->ord, by_module_offset, e->reg);
    size_t k = 0;
    for (size_t mi = 0; mi < nmods; mi++) {
        c->mod_first[mi] = k;
        while (k < nparams && CKPT_PARAM(e, c->ord[k])->module == mi)
            k++;
    }
    c->mod_first[nmods] = k;
    return STRATA_OK;
}

void ckpt_ctx_free(ckpt_ctx *c)
{
    if (!c->e)
        return; /* never initialised */
    io_wait_destroy(&c->w[0]);
    io_wait_destroy(&c->w[1]);
    free(c->ord);
    free(c->mod_first);
    free(c->crc);
    free(c->cur);
    free(c->buf[0]);
    free(c->buf[1]);
    free(c->wide);
    memset(c, 0, sizeof *c);
}

void ckpt_moment_streams(strata_engine *e, ckpt_stream out[2])
{
    engine_tiers *t = &e->tiers;
    out[0] = ckpt_plain_stream(&t->exp_avg, e->views.opt, ".exp_avg", STRATA_DTYPE_FP32);
    out[1] = ckpt_plain_stream(&t->exp_avg_sq, e->views.opt, ".exp_avg_sq", STRATA_DTYPE_FP32);
    for (int i = 0; i < 2; i++) {
        out[i].form = t->moments;
        out[i].sq = i == 1;
        out[i].scale = i ? &t->exp_avg_sq_scale : &t->exp_avg_scale;
    }
}

/* The 8-bit block scales of chunk k (which starts on a block: modules and shards do); NULL for the other forms. */
static float *chunk_scales(ckpt_ctx *c, const ckpt_stream *s, const ckpt_chunk *k)
{
    return s->form == STRATA_MOMENTS_8BIT ? tarr_host_ptr(s->scale, &c->e->tiers.env, k->at / MOMENTS_Q8_BLOCK) : NULL;
}

const uint8_t *ckpt_widen(ckpt_ctx *c, const ckpt_stream *s, const ckpt_chunk *k, const uint8_t *raw)
{
    if (s->form == STRATA_MOMENTS_FP32)
        return raw;
    moments_widen(s->form, s->sq, raw, chunk_scales(c, s, k), k->n, c->wide);
    return (const uint8_t *)c->wide;
}

void ckpt_narrow(ckpt_ctx *c, const ckpt_stream *s, const ckpt_chunk *k, uint8_t *dst)
{
    c->inexact += moments_narrow(s->form, s->sq, c->wide, k->n, dst, chunk_scales(c, s, k));
}

void ckpt_tensor_name(const strata_engine *e, const reg_param *p, const char *suffix, char *out)
{
    if (registry_param_is_part(p))
        snprintf(out, CKPT_NAME_BYTES, "%s%s", p->part_of, suffix);
    else
        snprintf(out, CKPT_NAME_BYTES, "%s.%s%s", CKPT_MODULE(e, p->module)->name, p->name, suffix);
}

strata_status ckpt_quiesce(strata_engine *e, const char *what)
{
    ERR_CHECK(engine_require_finalized(e, what));
    strata_module_id held = residency_first_held(e->res);
    if (held != STRATA_INVALID_ID)
        return err_set(STRATA_ESTATE, "%s: module \"%s\" is still held; call it between steps, with every module "
                       "released", what, CKPT_MODULE(e, held)->name);
    ERR_CHECK(grads_drain(e));
    return deferred_process(e->frees, true);
}

/* The range of module mi a walk covers, as a chunk of length 0 at its start. */
static void span_of(const strata_engine *e, const ckpt_stream *s, ckpt_walk walk, size_t mi, ckpt_chunk *k)
{
    const reg_module *m = CKPT_MODULE(e, mi);
    bool whole = walk == CKPT_HELD && !registry_view_sharded(s->view);
    size_t lo = whole ? m->offset : m->offset + (size_t)e->rank * m->shard_numel;
    size_t n = !registry_view_count(m, s->view) ? 0 : whole ? m->numel : m->shard_numel;
    size_t at = registry_view_sharded(s->view) ? m->shard_offset : lo;
    *k = (ckpt_chunk){.mi = mi, .lo = lo, .n = 0, .at = at, .span_lo = lo, .span_end = lo + n};
}

bool ckpt_chunk_at(const ckpt_ctx *c, const ckpt_stream *s, ckpt_walk walk, size_t mi, ckpt_chunk *k)
{
    for (; mi < registry_nmodules(c->e->reg); mi++) {
        span_of(c->e, s, walk, mi, k);
        if (k->span_end > k->span_lo) {
            k->n = MIN(CKPT_CHUNK_NUMEL, k->span_end - k->span_lo);
            return true;
        }
    }
    return false;
}

bool ckpt_chunk_next(const ckpt_ctx *c, const ckpt_stream *s, ckpt_walk walk, const ckpt_chunk *cur,
                     ckpt_chunk *next)
{
    size_t lo = cur->lo + cur->n;
    if (lo < cur->span_end) {
        ckpt_chunk k = *cur;
        k.at += cur->n;
        k.lo = lo;
        k.n = MIN(CKPT_CHUNK_NUMEL, cur->span_end - lo);
        *next = k;
        return true;
    }
    return ckpt_chunk_at(c, s, walk, cur->mi + 1, next);
}

bool ckpt_own_piece(const strata_engine *e, const reg_param *p, int rank, uint64_t *first, uint64_t *numel)
{
    const reg_module *m = CKPT_MODULE(e, p->module);
    size_t lo = m->offset + (size_t)rank * m->shard_numel, hi = lo + m->shard_numel;
    lo = MAX(lo, p->offset);
    hi = MIN(hi, p->offset + p->numel);
    if (lo >= hi)
        return false;
    *first = lo - p->offset;
    *numel = hi - lo;
    return true;
}

bool ckpt_stream_covers(const strata_engine *e, const ckpt_stream *s, const reg_param *p)
{
    return registry_view_count(CKPT_MODULE(e, p->module), s->view) > 0;
}

bool ckpt_held_piece(const strata_engine *e, const ckpt_stream *s, const reg_param *p, uint64_t *first,
                     uint64_t *numel)
{
    if (!ckpt_stream_covers(e, s, p))
        return false;
    if (registry_view_sharded(s->view))
        return ckpt_own_piece(e, p, e->rank, first, numel);
    *first = 0;
    *numel = p->numel;
    return true;
}

strata_status ckpt_drain(ckpt_ctx *c, strata_status st)
{
    for (int i = 0; i < 2; i++) {
        strata_status wst = io_wait_wait(&c->w[i]);
        if (st == STRATA_OK)
            st = wst;
    }
    return st;
}

typedef struct vote {
    int32_t status;
    char msg[ERR_MSG_BYTES < 1020 ? ERR_MSG_BYTES : 1020];
} vote;

strata_status ckpt_agree(strata_engine *e, strata_status local, const char *what)
{
    if (e->world == 1)
        return local;
    char own[ERR_MSG_BYTES];
    snprintf(own, sizeof own, "%s", local != STRATA_OK ? err_last() : "");
    vote mine = {.status = (int32_t)local};
    snprintf(mine.msg, sizeof mine.msg, "%.*s", (int)sizeof mine.msg - 1, own);
    vote *all = calloc((size_t)e->world, sizeof *all);
    if (!all)
        return err_set(STRATA_ENOMEM, "%s: out of memory for the ranks' statuses", what);
    strata_status st = comm_allgather(e->comm, &mine, all, sizeof mine, COMM_BYTE);
    if (st != STRATA_OK && local != STRATA_OK)
        st = err_set(local, "%s", own); /* this rank's own failure says more than the collective's */
    for (int r = 0; st == STRATA_OK && r < e->world; r++) {
        if (all[r].status == STRATA_OK)
            continue;
        all[r].msg[sizeof all[r].msg - 1] = '\0';
        if (r == e->rank)
            st = err_set(local, "%s", own);
        else
            st = err_set((strata_status)all[r].status, "%s: rank %d of %d failed: %s", what, r, e->world,
                         all[r].msg);
    }
    free(all);
    return st;
}

/* The piece of p a walk covers: what rank writes (CKPT_OWN), or what this rank's array of s holds (CKPT_HELD). */
static bool walk_piece(const strata_engine *e, const ckpt_stream *s, ckpt_walk walk, int rank, const reg_param *p,
                       uint64_t *first, uint64_t *numel)
{
    if (walk == CKPT_HELD)
        return ckpt_held_piece(e, s, p, first, numel);
    return ckpt_stream_covers(e, s, p) && ckpt_own_piece(e, p, rank, first, numel);
}

bool ckpt_piece_continues(const ckpt_ctx *c, const ckpt_stream *s, ckpt_walk walk, int rank, size_t k)
{
    if (k == 0 || k >= registry_nparams(c->e->reg))
        return false;
    const reg_param *a = CKPT_PARAM(c->e, c->ord[k - 1]), *b = CKPT_PARAM(c->e, c->ord[k]);
    if (!registry_param_is_part(a) || !registry_param_is_part(b) || strcmp(a->part_of, b->part_of) != 0 ||
        b->part_first != a->part_first + a->numel)
        return false;
    uint64_t af, an, bf, bn;
    return walk_piece(c->e, s, walk, rank, a, &af, &an) && walk_piece(c->e, s, walk, rank, b, &bf, &bn) &&
           af + an == a->numel && bf == 0;
}
