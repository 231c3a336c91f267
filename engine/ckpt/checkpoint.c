/*
 * strata_save / strata_load: the engine's state to and from a checkpoint directory (format in
 * engine/ckpt/ckpt_format.h). Each state class is streamed from (or into) its tier array through one
 * bounded buffer, module by module in aligned chunks, so the model is never gathered in RAM and
 * NVMe transfers stay 4 KiB-aligned. Tensors are laid out in flat-partition order, which makes both
 * the tier reads and the file writes sequential.
 *
 * Exact resume with the delayed update: a save waits for the update in flight but does not publish
 * it; the checkpoint keeps both parameter copies (visible and pending) and the pending step's result,
 * and a load re-arms it so the next strata_step publishes it exactly as an uninterrupted run would.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/crc32c.h"
#include "base/log.h"
#include "base/util.h"
#include "engine/ckpt/ckpt_files.h"
#include "engine/engine.h"
#include "engine/step.h"
#include "engine/train_step.h"

#define CHUNK_NUMEL ((size_t)1 << 20) /* a multiple of ENGINE_MODULE_ALIGN: chunks stay 4 KiB-aligned */
#define MAX_STREAMS 2                 /* state classes per file */
#define PARAM(e, id) registry_param((e)->reg, (strata_param_id)(id))
#define MODULE(e, id) registry_module((e)->reg, (strata_module_id)(id))

/* One state class <-> one family of tensors ("<name><suffix>") in a file. */
typedef struct stream {
    tier_array *arr;
    const char *suffix;
    strata_dtype dtype;
    const ckpt_tensor **tensor; /* load: per position in ord, its manifest entry */
} stream;

typedef struct ckpt_ctx {
    strata_engine *e;
    size_t *ord;          /* parameter ids in flat-offset order */
    size_t *mod_first;    /* per module: its first index in ord (and one past the last module) */
    uint32_t *crc;        /* per position in ord: the running crc32c of the tensor being streamed */
    uint8_t *buf[2];      /* CHUNK_NUMEL * 4 bytes each, 4 KiB-aligned: tier I/O of one chunk overlaps the
                             file I/O of the other */
    io_wait w[2];
    ckpt_manifest m;
} ckpt_ctx;

/* One aligned piece of one module's range: the unit of streaming. */
typedef struct chunk {
    size_t mi, c0, n;
} chunk;

static int by_offset(const void *a, const void *b, void *ctx)
{
    const registry *reg = ctx;
    size_t oa = registry_param(reg, (strata_param_id)*(const size_t *)a)->offset;
    size_t ob = registry_param(reg, (strata_param_id)*(const size_t *)b)->offset;
    return oa < ob ? -1 : oa > ob;
}

static strata_status ctx_init(ckpt_ctx *c, strata_engine *e)
{
    memset(c, 0, sizeof *c);
    c->e = e;
    io_wait_init(&c->w[0]);
    io_wait_init(&c->w[1]);
    size_t nparams = registry_nparams(e->reg);
    c->ord = malloc(nparams * sizeof *c->ord);
    c->mod_first = malloc((registry_nmodules(e->reg) + 1) * sizeof *c->mod_first);
    c->crc = malloc(registry_nparams(e->reg) * sizeof *c->crc);
    c->m.tensors = calloc(registry_nparams(e->reg) * 5, sizeof *c->m.tensors);
    void *b0 = NULL, *b1 = NULL;
    bool bufs = posix_memalign(&b0, 4096, CHUNK_NUMEL * 4) == 0 && posix_memalign(&b1, 4096, CHUNK_NUMEL * 4) == 0;
    c->buf[0] = b0;
    c->buf[1] = b1;
    if (!c->ord || !c->mod_first || !c->crc || !c->m.tensors || !bufs)
        return err_set(STRATA_ENOMEM, "checkpoint: out of memory for the streaming buffers");
    for (size_t i = 0; i < registry_nparams(e->reg); i++)
        c->ord[i] = i;
    qsort_r(c->ord, nparams, sizeof *c->ord, by_offset, e->reg);
    size_t k = 0;
    for (size_t mi = 0; mi < registry_nmodules(e->reg); mi++) {
        c->mod_first[mi] = k;
        while (k < nparams && PARAM(e, c->ord[k])->module == mi)
            k++;
    }
    c->mod_first[registry_nmodules(e->reg)] = k;
    return STRATA_OK;
}

static void ctx_free(ckpt_ctx *c)
{
    io_wait_destroy(&c->w[0]);
    io_wait_destroy(&c->w[1]);
    free(c->ord);
    free(c->mod_first);
    free(c->crc);
    free(c->buf[0]);
    free(c->buf[1]);
    ckpt_manifest_free(&c->m);
}

static void tensor_name(const strata_engine *e, const reg_param *p, const char *suffix, char *out)
{
    snprintf(out, CKPT_NAME_BYTES, "%s.%s%s", MODULE(e, p->module)->name, p->name, suffix);
}

/* Waits for the engine's own traffic so the arrays hold still: gradient hand-offs, deferred frees. */
static strata_status quiesce(strata_engine *e, const char *what)
{
    ERR_CHECK(engine_require_finalized(e, what));
    strata_module_id held = residency_first_held(e->res);
    if (held != STRATA_INVALID_ID)
        return err_set(STRATA_ESTATE, "%s: module \"%s\" is still held; call it between steps, with every module "
                       "released", what, MODULE(e, held)->name);
    ERR_CHECK(grads_drain(e));
    return deferred_process(e->frees, true);
}

/* The first chunk at or after module mi (false past the last module). */
static bool chunk_at(const strata_engine *e, size_t mi, chunk *k)
{
    for (; mi < registry_nmodules(e->reg); mi++)
        if (MODULE(e, mi)->numel) {
            *k = (chunk){mi, MODULE(e, mi)->offset, MIN(CHUNK_NUMEL, MODULE(e, mi)->numel)};
            return true;
        }
    return false;
}

static bool chunk_next(const strata_engine *e, const chunk *cur, chunk *next)
{
    const reg_module *m = MODULE(e, cur->mi);
    size_t c0 = cur->c0 + cur->n, end = m->offset + m->numel;
    if (c0 < end) {
        *next = (chunk){cur->mi, c0, MIN(CHUNK_NUMEL, end - c0)};
        return true;
    }
    return chunk_at(e, cur->mi + 1, next);
}

/* Waits for both buffers' tier I/O (before returning, even on failure: the buffers are about to be freed). */
static strata_status drain(ckpt_ctx *c, strata_status st)
{
    for (int i = 0; i < 2; i++) {
        strata_status wst = io_wait_wait(&c->w[i]);
        if (st == STRATA_OK)
            st = wst;
    }
    return st;
}

/* ---------------------------------------------------------------- save */

/* Streams one array into the open file: every chunk read from its tier (the next one in flight while this one
 * is written), cut into parameter slices. */
static strata_status save_chunk(ckpt_ctx *c, ckpt_writer *wr, const stream *s, const chunk *k, const uint8_t *buf)
{
    strata_engine *e = c->e;
    size_t eb = s->arr->elem_bytes;
    for (size_t i = c->mod_first[k->mi]; i < c->mod_first[k->mi + 1]; i++) {
        const reg_param *p = PARAM(e, c->ord[i]);
        size_t lo = MAX(p->offset, k->c0), hi = MIN(p->offset + p->numel, k->c0 + k->n);
        if (lo >= hi)
            continue;
        const uint8_t *src = buf + (lo - k->c0) * eb;
        c->crc[i] = crc32c(c->crc[i], src, (hi - lo) * eb);
        ERR_CHECK(ckpt_writer_put(wr, src, (hi - lo) * eb));
    }
    return STRATA_OK;
}

static strata_status save_stream(ckpt_ctx *c, ckpt_writer *wr, const stream *s, ckpt_tensor *out)
{
    strata_engine *e = c->e;
    memset(c->crc, 0, registry_nparams(e->reg) * sizeof *c->crc);
    chunk cur, next;
    bool have = chunk_at(e, 0, &cur);
    const uint8_t *host = tarr_host_ptr(s->arr, &e->tiers.env, 0);
    if (host) { /* host memory: written from where it lies, no copy */
        for (; have; have = chunk_next(e, &cur, &cur))
            ERR_CHECK(save_chunk(c, wr, s, &cur, host + cur.c0 * s->arr->elem_bytes));
        for (size_t k = 0; k < registry_nparams(e->reg); k++)
            out[k].crc = c->crc[k];
        return STRATA_OK;
    }
    strata_status st = have ? tarr_read(s->arr, &e->tiers.env, cur.c0, cur.n, c->buf[0], &c->w[0]) : STRATA_OK;
    for (int b = 0; have && st == STRATA_OK; b ^= 1) {
        bool more = chunk_next(e, &cur, &next);
        if (more)
            st = tarr_read(s->arr, &e->tiers.env, next.c0, next.n, c->buf[b ^ 1], &c->w[b ^ 1]);
        if (st == STRATA_OK)
            st = io_wait_wait(&c->w[b]);
        if (st == STRATA_OK)
            st = save_chunk(c, wr, s, &cur, c->buf[b]);
        cur = next;
        have = more;
    }
    ERR_CHECK(drain(c, st));
    for (size_t k = 0; k < registry_nparams(e->reg); k++)
        out[k].crc = c->crc[k];
    return STRATA_OK;
}

/* Writes one safetensors file holding streams[0..ns) and appends their manifest entries. */
static strata_status save_file(ckpt_ctx *c, const char *tmp, int file, const stream *streams, int ns)
{
    strata_engine *e = c->e;
    ckpt_tensor *first = &c->m.tensors[c->m.ntensors];
    for (int s = 0; s < ns; s++)
        for (size_t k = 0; k < registry_nparams(e->reg); k++) {
            ckpt_tensor *t = &first[(size_t)s * registry_nparams(e->reg) + k];
            const reg_param *p = PARAM(e, c->ord[k]);
            tensor_name(e, p, streams[s].suffix, t->name);
            t->file = file;
            t->dtype = streams[s].dtype;
            t->numel = p->numel;
        }
    uint8_t *head;
    size_t head_len;
    ERR_CHECK(ckpt_st_header_build(first, (size_t)ns * registry_nparams(e->reg), &head, &head_len));
    ckpt_writer wr;
    strata_status st = ckpt_writer_open(&wr, tmp, ckpt_file_names[file]);
    if (st == STRATA_OK)
        st = ckpt_writer_put(&wr, head, head_len);
    free(head);
    for (int s = 0; s < ns && st == STRATA_OK; s++)
        st = save_stream(c, &wr, &streams[s], first + (size_t)s * registry_nparams(e->reg));
    if (st != STRATA_OK) {
        ckpt_writer_abort(&wr);
        return st;
    }
    c->m.file_bytes[file] = wr.written + wr.used;
    ERR_CHECK(ckpt_writer_close(&wr));
    c->m.ntensors += (size_t)ns * registry_nparams(e->reg);
    return STRATA_OK;
}

static strata_status write_manifest(ckpt_ctx *c, const char *tmp)
{
    char *text;
    ERR_CHECK(ckpt_manifest_build(&c->m, &c->e->cfg, &text));
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

/* Checkpoints of a world of several ranks (each rank streaming its shard, one manifest, resharding on load)
 * are not written yet: refuse before anything is touched, the same on every rank. */
static strata_status require_one_rank(const strata_engine *e, const char *what)
{
    if (e->world == 1)
        return STRATA_OK;
    return err_set(STRATA_EUNSUPPORTED, "%s: this engine is rank %d of a world of %d ranks, and sharded checkpoints "
                   "are not implemented yet; checkpoint a run of one rank", what, e->rank, e->world);
}

static strata_status save(strata_engine *e, const char *dir)
{
    if (!dir || !dir[0])
        return err_set(STRATA_EINVAL, "strata_save: dir is NULL or empty");
    ERR_CHECK(require_one_rank(e, "strata_save"));
    ERR_CHECK(quiesce(e, "strata_save"));
    strata_module_id touched = grads_first_unconsumed(e->grads);
    if (touched != STRATA_INVALID_ID)
        return err_set(STRATA_ESTATE, "strata_save: module \"%s\" has gradients accumulated since the last "
                       "strata_step; save right after a step, before the next backward pass", MODULE(e, touched)->name);
    /* The delayed update in flight must finish (its master weights and moments are part of the state) but
     * stay unpublished: the trainer still computes with the older parameters until the next step. */
    strata_step_result pending_res = {0};
    bool pending;
    ERR_CHECK(opt_job_settle(e->opt, &pending_res, &pending));
    bool has_next = pending && !pending_res.skipped;

    ckpt_ctx c;
    char tmp[STRATA_PATH_BYTES + 64];
    strata_status st = ctx_init(&c, e);
    if (st == STRATA_OK)
        st = ckpt_dir_begin(dir, tmp, sizeof tmp);
    if (st != STRATA_OK) {
        ctx_free(&c);
        return st;
    }
    uint64_t t0 = now_ns();
    train_progress pr;
    driver_progress(e->driver, &pr);
    c.m = (ckpt_manifest){.version = CKPT_FORMAT_VERSION, .step = step_count(e->step), .iterations = pr.iterations,
                          .steps = (int64_t)pr.steps, .skipped_steps = (int64_t)pr.skipped_steps,
                          .loss_scale = pr.loss_scale, .good_steps = pr.good_steps,
                          .hysteresis_left = pr.hysteresis_left, .param_dtype = e->cfg.param_dtype,
                          .pending = pending, .pending_result = pending_res, .tensors = c.m.tensors};
    stream model[] = {{&e->tiers.master, "", STRATA_DTYPE_FP32, NULL}};
    stream opt[] = {{&e->tiers.exp_avg, ".exp_avg", STRATA_DTYPE_FP32, NULL},
                    {&e->tiers.exp_avg_sq, ".exp_avg_sq", STRATA_DTYPE_FP32, NULL}};
    stream par[] = {{&e->tiers.param[e->tiers.param_front], "", e->cfg.param_dtype, NULL},
                    {&e->tiers.param[1 - e->tiers.param_front], ".next", e->cfg.param_dtype, NULL}};
    st = save_file(&c, tmp, CKPT_FILE_MODEL, model, 1);
    if (st == STRATA_OK)
        st = save_file(&c, tmp, CKPT_FILE_OPTIMIZER, opt, 2);
    /* fp32 parameters equal the master weights unless an update is pending: no copy needed then. */
    if (st == STRATA_OK && (e->cfg.param_dtype != STRATA_DTYPE_FP32 || has_next))
        st = save_file(&c, tmp, CKPT_FILE_PARAMS, par, has_next ? 2 : 1);
    if (st == STRATA_OK)
        st = write_manifest(&c, tmp);
    if (st == STRATA_OK)
        st = ckpt_dir_commit(tmp, dir);
    if (st != STRATA_OK)
        ckpt_dir_remove(tmp);
    else
        LOG_INFO(LOG_CORE, "saved step %" PRId64 " (%zu tensors) to \"%s\" in %.1f ms", c.m.step, c.m.ntensors, dir,
                 (double)(now_ns() - t0) / 1e6);
    ctx_free(&c);
    return st;
}

STRATA_API strata_status strata_save(strata_engine *e, const char *dir)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_save: engine is NULL");
    return err_copy(&e->err, save(e, dir));
}

/* ---------------------------------------------------------------- load */

/* Maps every parameter to its manifest entry for s, checking that the model matches. */
static strata_status match_stream(ckpt_ctx *c, stream *s, int file)
{
    strata_engine *e = c->e;
    s->tensor = calloc(registry_nparams(e->reg), sizeof *s->tensor);
    if (!s->tensor)
        return err_set(STRATA_ENOMEM, "strata_load: out of memory");
    for (size_t k = 0; k < registry_nparams(e->reg); k++) {
        const reg_param *p = PARAM(e, c->ord[k]);
        char name[CKPT_NAME_BYTES];
        tensor_name(e, p, s->suffix, name);
        const ckpt_tensor *t = ckpt_manifest_find(&c->m, file, name);
        if (!t)
            return err_set(STRATA_ECORRUPT, "strata_load: the checkpoint has no tensor \"%s\" in %s; it was saved from "
                           "a different model", name, ckpt_file_names[file]);
        if (t->dtype != s->dtype || t->numel != p->numel)
            return err_set(STRATA_ECORRUPT, "strata_load: %s: tensor \"%s\" is %s x %" PRIu64 ", the engine's "
                           "parameter is %s x %zu; it was saved from a different model", ckpt_file_names[file], name,
                           ckpt_dtype_name(t->dtype), t->numel, ckpt_dtype_name(s->dtype), p->numel);
        s->tensor[k] = t;
    }
    return STRATA_OK;
}

/* Fills buf with chunk k of stream s from the file, checking each tensor's crc32c as its last slice arrives. */
static strata_status load_chunk(ckpt_ctx *c, const ckpt_file *f, const stream *s, const chunk *k, uint8_t *buf)
{
    strata_engine *e = c->e;
    size_t eb = s->arr->elem_bytes;
    memset(buf, 0, k->n * eb); /* padding between and after parameters is zero, as finalize wrote it */
    for (size_t i = c->mod_first[k->mi]; i < c->mod_first[k->mi + 1]; i++) {
        const reg_param *p = PARAM(e, c->ord[i]);
        size_t lo = MAX(p->offset, k->c0), hi = MIN(p->offset + p->numel, k->c0 + k->n);
        if (lo >= hi)
            continue;
        const ckpt_tensor *t = s->tensor[i];
        uint8_t *dst = buf + (lo - k->c0) * eb;
        ERR_CHECK(ckpt_file_read(f, t->begin + (lo - p->offset) * eb, dst, (hi - lo) * eb, t->name));
        c->crc[i] = crc32c(c->crc[i], dst, (hi - lo) * eb);
        if (hi == p->offset + p->numel && c->crc[i] != t->crc)
            return err_set(STRATA_ECORRUPT, "strata_load: checkpoint \"%s\": tensor \"%s\": crc32c %08x, the manifest "
                           "says %08x (the file was damaged after it was written); load another checkpoint", f->path,
                           t->name, c->crc[i], t->crc);
    }
    return STRATA_OK;
}

/* Streams one family of tensors from f into its array: the tier write of one chunk overlaps the file read of
 * the next. */
static strata_status load_stream(ckpt_ctx *c, const ckpt_file *f, const stream *s)
{
    strata_engine *e = c->e;
    memset(c->crc, 0, registry_nparams(e->reg) * sizeof *c->crc);
    chunk k;
    bool have = chunk_at(e, 0, &k);
    uint8_t *host = tarr_host_ptr(s->arr, &e->tiers.env, 0);
    if (host) { /* host memory: read into place, no copy */
        for (; have; have = chunk_next(e, &k, &k))
            ERR_CHECK(load_chunk(c, f, s, &k, host + k.c0 * s->arr->elem_bytes));
        return STRATA_OK;
    }
    strata_status st = STRATA_OK;
    for (int b = 0; have && st == STRATA_OK; b ^= 1) {
        st = io_wait_wait(&c->w[b]); /* the buffer's previous write has left it */
        if (st == STRATA_OK)
            st = load_chunk(c, f, s, &k, c->buf[b]);
        if (st == STRATA_OK)
            st = tarr_write(s->arr, &e->tiers.env, k.c0, k.n, c->buf[b], &c->w[b]);
        have = chunk_next(e, &k, &k);
    }
    return drain(c, st);
}

static strata_status check_compatible(const strata_engine *e, const ckpt_manifest *m, const char *dir)
{
    if (m->pending && !e->cfg.delayed_update)
        return err_set(STRATA_ECONFIG, "strata_load(\"%s\"): the checkpoint holds a delayed update not yet visible "
                       "to the trainer; set strata.delayed_update = true to resume it exactly", dir);
    if (m->param_dtype != e->cfg.param_dtype && (!m->file_bytes[CKPT_FILE_PARAMS] || m->pending))
        return err_set(STRATA_ECONFIG, "strata_load(\"%s\"): the checkpoint's parameters are %s, the engine's %s; "
                       "resume with the same precision (bf16/fp16 settings)", dir, ckpt_dtype_name(m->param_dtype),
                       ckpt_dtype_name(e->cfg.param_dtype));
    return STRATA_OK;
}

/* Everything that can be checked before the engine's state is touched is checked first: the model's names,
 * dtypes and sizes, each file's size and header. Only checksums are found while streaming. */
static strata_status load_all(ckpt_ctx *c, const char *dir)
{
    strata_engine *e = c->e;
    const ckpt_manifest *m = &c->m;
    bool has_next = m->pending && !m->pending_result.skipped;
    bool params_file = m->file_bytes[CKPT_FILE_PARAMS] && m->param_dtype == e->cfg.param_dtype;
    /* fp32 parameters without a params file are the master weights: read model.safetensors into both. */
    stream st_model[] = {{&e->tiers.master, "", STRATA_DTYPE_FP32, NULL}, {&e->tiers.param[0], "", STRATA_DTYPE_FP32, NULL}};
    stream st_opt[] = {{&e->tiers.exp_avg, ".exp_avg", STRATA_DTYPE_FP32, NULL},
                       {&e->tiers.exp_avg_sq, ".exp_avg_sq", STRATA_DTYPE_FP32, NULL}};
    stream st_par[] = {{&e->tiers.param[0], "", e->cfg.param_dtype, NULL}, {&e->tiers.param[1], ".next", e->cfg.param_dtype, NULL}};
    struct {
        int file;
        stream *s;
        int ns;
    } work[] = {{CKPT_FILE_MODEL, st_model, params_file ? 1 : 2},
                {CKPT_FILE_OPTIMIZER, st_opt, 2},
                {CKPT_FILE_PARAMS, st_par, params_file ? (has_next ? 2 : 1) : 0}};
    ckpt_file files[ARRAY_LEN(work)];
    size_t opened = 0;
    strata_status st = STRATA_OK;
    for (size_t i = 0; i < ARRAY_LEN(work) && st == STRATA_OK && work[i].ns; i++) {
        for (int s = 0; s < work[i].ns && st == STRATA_OK; s++)
            st = match_stream(c, &work[i].s[s], work[i].file);
        if (st == STRATA_OK && (st = ckpt_file_open(dir, m, work[i].file, &files[i])) == STRATA_OK)
            opened = i + 1;
    }
    if (st == STRATA_OK)
        e->ckpt_incomplete = true;
    for (size_t i = 0; i < opened && st == STRATA_OK; i++)
        for (int s = 0; s < work[i].ns && st == STRATA_OK; s++)
            st = load_stream(c, &files[i], &work[i].s[s]);
    for (size_t i = 0; i < opened; i++)
        ckpt_file_close(&files[i]);
    stream *all[] = {&st_model[0], &st_model[1], &st_opt[0], &st_opt[1], &st_par[0], &st_par[1]};
    for (size_t i = 0; i < ARRAY_LEN(all); i++)
        free(all[i]->tensor);
    return st;
}

static strata_status load(strata_engine *e, const char *dir)
{
    if (!dir || !dir[0])
        return err_set(STRATA_EINVAL, "strata_load: dir is NULL or empty");
    ERR_CHECK(require_one_rank(e, "strata_load"));
    ERR_CHECK(quiesce(e, "strata_load"));
    /* Whatever this engine had in flight is about to be replaced: finish it, publish nothing. */
    strata_step_result unused;
    bool had;
    ERR_CHECK(opt_job_join(e->opt, &unused, &had));
    ERR_CHECK(dev_stream_sync(e->h2d));
    residency_invalidate_all(e);
    step_forget(e->step); /* the optimizer state on NVMe is about to change */

    ckpt_ctx c;
    strata_status st = ctx_init(&c, e);
    if (st == STRATA_OK) {
        free(c.m.tensors);
        st = ckpt_manifest_read(dir, &c.m);
    }
    if (st == STRATA_OK)
        st = check_compatible(e, &c.m, dir);
    if (st == STRATA_OK)
        st = load_all(&c, dir);
    if (st == STRATA_OK) {
        const ckpt_manifest *m = &c.m;
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
        LOG_INFO(LOG_CORE, "loaded step %" PRId64 " from \"%s\"%s", m->step, dir,
                 m->pending ? " (with a delayed update pending)" : "");
    }
    residency_invalidate_all(e); /* device-tier modules point into the front copy */
    ctx_free(&c);
    return st;
}

STRATA_API strata_status strata_load(strata_engine *e, const char *dir)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_load: engine is NULL");
    return err_copy(&e->err, load(e, dir));
}
