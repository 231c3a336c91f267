/* The state tiers: swap space, pinned pool, parameter and optimizer arrays; see tiers.h. */
#include "engine/tiers.h"

#include <stdlib.h>
#include <string.h>

#include "base/copy.h"
#include "base/crc32c.h"
#include "base/error.h"
#include "base/half.h"
#include "base/util.h"
#include "cpu_adam/moments.h"
#include "cpu_adam/moments_convert.h"

/* A multiple of ENGINE_MODULE_ALIGN; 4M elements: the chunk's buffers (values, parameters, zero moments) take at most
 * 64 MiB, and each chunk's copies are large enough to spread over the cores. */
#define INIT_CHUNK_NUMEL ((size_t)1 << 22)

/* Modules, shards and sub-groups start on ENGINE_MODULE_ALIGN elements: for 8-bit moments that is a whole number of
 * quantization blocks (every kernel call, checkpoint chunk and initial chunk starts on a block) and of 4 KiB pages of
 * one-byte elements (NVMe transfers stay aligned). */
_Static_assert(ENGINE_MODULE_ALIGN % MOMENTS_Q8_BLOCK == 0 && ENGINE_MODULE_ALIGN % 4096 == 0,
               "8-bit moments need module ranges of whole blocks and whole pages");

/* The swap space spans the NVMe paths of every state class placed on NVMe (plan_swap_paths). */
static strata_status open_nvme(engine_tiers *t, const strata_config *cfg, size_t capacity)
{
    const char *paths[PLAN_MAX_SWAP_PATHS];
    int n = plan_swap_paths(cfg, paths);
    ERR_CHECK(nvme_io_create(&cfg->aio, &t->io));
    ERR_CHECK(swap_create(t->io, paths, n, capacity, &t->swap));
    swap_set_checksum(t->swap, cfg->swap_checksum);
    return STRATA_OK;
}

static bool param_shares_master(const engine_tiers *t, const strata_config *cfg, size_t param_numel,
                                size_t opt_numel, bool one_rank)
{
    return one_rank && param_numel == opt_numel && cfg->param_dtype == STRATA_DTYPE_FP32 && !cfg->delayed_update &&
           !cfg->step_in_backward && cfg->offload_optimizer_ratio >= 1.0 && t->param_tier == STRATA_TIER_HOST &&
           t->opt_tier == STRATA_TIER_HOST;
}

strata_status tiers_open(engine_tiers *t, const strata_config *cfg, device *dev, dev_stream *copy_stream,
                         bool host_addressable_device, const plan *pl, size_t param_numel, size_t opt_numel,
                         bool one_rank)
{
    if (pl->tier_bytes[STRATA_TIER_NVME])
        ERR_CHECK(open_nvme(t, cfg, pl->tier_bytes[STRATA_TIER_NVME]));
    t->env = (tier_env){.dev = dev, .copy_stream = copy_stream, .swap = t->swap,
                        .host_addressable_device = host_addressable_device, .ctr = &t->ctr};
    t->host_tier_bytes = pl->tier_bytes[STRATA_TIER_HOST];
    t->kept_tier = pl->kept_tier;
    ERR_CHECK(pool_create(dev, t->io, pl->pool_part_bytes, &t->pool));
    size_t n = opt_numel;
    /* Parameters in host memory are fetched by device copies: when they are the master weights, those stay pinned. */
    t->param_is_master = param_shares_master(t, cfg, param_numel, opt_numel, one_rank);
    ERR_CHECK((t->param_is_master ? tarr_alloc : tarr_alloc_cpu)(&t->master, &t->env, t->opt_tier, n, 4,
                                                                  "master weights"));
    if (t->param_is_master)
        t->param[0] = t->master; /* the same memory: tiers_close frees it once */
    else
        ERR_CHECK(tarr_alloc(&t->param[0], &t->env, t->param_tier, param_numel, t->param_bytes, "parameters"));
    if (cfg->delayed_update)
        ERR_CHECK(tarr_alloc(&t->param[1], &t->env, t->param_tier, param_numel, t->param_bytes,
                             "parameters (second copy)"));
    t->moments = cfg->optimizer_moments;
    size_t mb = moments_elem_bytes(t->moments), scales = moments_scale_count(t->moments, n);
    ERR_CHECK(tarr_alloc_cpu(&t->exp_avg, &t->env, t->opt_tier, n, mb, "Adam exp_avg"));
    ERR_CHECK(tarr_alloc_cpu(&t->exp_avg_sq, &t->env, t->opt_tier, n, mb, "Adam exp_avg_sq"));
    if (scales) {
        ERR_CHECK(tarr_alloc_cpu(&t->exp_avg_scale, &t->env, STRATA_TIER_HOST, scales, 4,
                                 "Adam exp_avg block scales"));
        ERR_CHECK(tarr_alloc_cpu(&t->exp_avg_sq_scale, &t->env, STRATA_TIER_HOST, scales, 4,
                                 "Adam exp_avg_sq block scales"));
    }
    return STRATA_OK;
}

/* Fills one chunk [first, first + count) of module m's fp32 initial values, calling each parameter's init for the
 * part of it inside the chunk; padding is zero. *param_cursor: the module's parameter (its index in m->params) the
 * chunk starts in, 0 for the module's first chunk. */
static strata_status fill_chunk(const registry *reg, const reg_module *m, size_t first, size_t count, float *out,
                                size_t *param_cursor)
{
    memset(out, 0, count * sizeof *out);
    size_t end = first + count;
    while (*param_cursor < m->nparams) {
        strata_param_id id = m->params[*param_cursor];
        const reg_param *p = registry_param(reg, id);
        if (p->offset >= end)
            break;
        size_t lo = MAX(p->offset, first), hi = MIN(p->offset + p->numel, end);
        if (p->init && hi > lo) {
            strata_status st = p->init(p->init_ctx, id, lo - p->offset, hi - lo, out + (lo - first));
            if (st != STRATA_OK)
                return err_set(st, "init of parameter \"%s.%s\" failed at elements [%zu, %zu): %s",
                               registry_module(reg, p->module)->name, p->name, lo - p->offset, hi - p->offset,
                               err_last()[0] ? err_last() : strata_status_str(st));
        }
        if (p->offset + p->numel > end)
            break; /* continues in the next chunk */
        (*param_cursor)++;
    }
    return STRATA_OK;
}

/* Spread over the cores past a few MB, like copy_parallel: a 7B model converts billions of elements here. Below that
 * on the calling thread: a process forked from one that has run an OpenMP team hangs at its own first team (libgomp
 * keeps the parent's pool), and tests/t_ckpt_crash builds small engines in such children (a large engine in a forked
 * child hangs, as at strata's other teams). */
static void to_param_dtype(const float *src, void *dst, strata_dtype dtype, size_t n)
{
    if (dtype == STRATA_DTYPE_FP32) {
        copy_parallel(dst, src, n * sizeof *src);
        return;
    }
    enum { PIECE = 1 << 18 };
    long pieces = (long)((n + PIECE - 1) / PIECE);
    uint16_t *d = dst;
#pragma omp parallel for schedule(static) if (n * sizeof *src >= ((size_t)4 << 20))
    for (long k = 0; k < pieces; k++)
        for (size_t i = (size_t)k * PIECE; i < MIN(n, (size_t)(k + 1) * PIECE); i++)
            d[i] = dtype == STRATA_DTYPE_BF16 ? cvt_f32_to_bf16(src[i]) : cvt_f32_to_fp16(src[i]);
}

/* tarr_write, with the copies into host memory spread over the cores: the arrays are fresh, and their first
 * touch (the kernel zeroing each page) is most of the start-up of a large model. */
static strata_status write_initial(engine_tiers *t, tier_array *a, size_t first, size_t n, const void *buf,
                                   io_wait *w)
{
    void *dst = a->tier == STRATA_TIER_NVME ? NULL : tarr_host_ptr(a, &t->env, first);
    if (!dst)
        return tarr_write(a, &t->env, first, n, buf, w);
    copy_parallel(dst, buf, n * a->elem_bytes);
    return STRATA_OK;
}

/* Writes elements [first, first + n) of the full view, held in buf, into array a in view v: all of them in the
 * full view, the part inside this rank's shard of module m in the shard view. */
static strata_status write_view(engine_tiers *t, tier_array *a, reg_view v, const reg_module *m, int rank,
                                size_t first, size_t n, const void *buf, io_wait *w)
{
    if (!a->numel || !registry_view_count(m, v))
        return STRATA_OK; /* a frozen module's optimizer state does not exist */
    if (!registry_view_sharded(v))
        return write_initial(t, a, first, n, buf, w);
    size_t lo = m->offset + (size_t)rank * m->shard_numel, hi = lo + m->shard_numel;
    lo = MAX(lo, first);
    hi = MIN(hi, first + n);
    if (hi <= lo)
        return STRATA_OK;
    size_t skip = lo - first, at = m->shard_offset + (lo - (m->offset + (size_t)rank * m->shard_numel));
    return write_initial(t, a, at, hi - lo, (const char *)buf + skip * a->elem_bytes, w);
}

/* Buffers of chunk (whole blocks) zero moments in their form for m and v, and every block scale the zeros' (chunk is
 * a multiple of MOMENTS_Q8_BLOCK, so every block of the arrays is one such block). False without memory. */
static bool zero_moments(engine_tiers *t, size_t chunk, void **m, void **v)
{
    static const float zeros[ENGINE_MODULE_ALIGN];
    float scale[2] = {0};
    size_t bytes = chunk * t->exp_avg.elem_bytes;
    if (posix_memalign(m, 4096, bytes) || posix_memalign(v, 4096, bytes))
        return false;
    for (size_t b = 0; b < chunk; b += ENGINE_MODULE_ALIGN) {
        moments_narrow(t->moments, false, zeros, ENGINE_MODULE_ALIGN, (char *)*m + b * t->exp_avg.elem_bytes, scale);
        moments_narrow(t->moments, true, zeros, ENGINE_MODULE_ALIGN, (char *)*v + b * t->exp_avg_sq.elem_bytes, scale);
    }
    float *ms = tarr_host_ptr(&t->exp_avg_scale, &t->env, 0), *vs = tarr_host_ptr(&t->exp_avg_sq_scale, &t->env, 0);
    for (size_t i = 0; i < t->exp_avg_scale.numel; i++)
        ms[i] = vs[i] = scale[0];
    return true;
}

strata_status tiers_write_initial(engine_tiers *t, const registry *reg, strata_dtype param_dtype,
                                  const engine_views *views, int rank, uint32_t *module_crc)
{
    size_t chunk = MIN(INIT_CHUNK_NUMEL, registry_largest_module_numel(reg));
    float *vals = NULL;
    void *pbuf = NULL, *zero_m = NULL, *zero_v = NULL;
    strata_status st = STRATA_OK;
    /* pbuf is pinned: from it the parameters go to the device (or the drive) a chunk at a time, at DMA speed. */
    if (posix_memalign((void **)&vals, 4096, chunk * 4) ||
        dev_host_alloc(t->env.dev, chunk * t->param_bytes, &pbuf) != STRATA_OK ||
        !zero_moments(t, chunk, &zero_m, &zero_v)) {
        st = err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory for the initialisation buffers");
        goto out;
    }
    io_wait w;
    io_wait_init(&w);
    
    /* Module by module over the full view in position order (chunks never straddle two modules, so each lies in one
     * module's shards), each chunk written to every array in that array's view. */
    for (size_t pos = 0; pos < registry_nmodules(reg) && st == STRATA_OK; pos++) {
        strata_module_id i = registry_module_by_position(reg, pos);
        const reg_module *m = registry_module(reg, i);
        uint32_t crc = 0;
        size_t cursor = 0;
        for (size_t first = m->offset; first < m->offset + m->numel && st == STRATA_OK; first += chunk) {
            size_t n = MIN(chunk, m->offset + m->numel - first);
            st = fill_chunk(reg, m, first, n, vals, &cursor);
            if (st != STRATA_OK)
                break;
            if (module_crc)
                crc = crc32c(crc, vals, n * sizeof *vals);
            to_param_dtype(vals, pbuf, param_dtype, n);
            tier_array *targets[] = {&t->master, &t->exp_avg, &t->exp_avg_sq, &t->param[0], &t->param[1]};
            const void *sources[] = {vals, zero_m, zero_v, pbuf, pbuf};
            reg_view in[] = {views->opt, views->opt, views->opt, views->param, views->param};
            for (size_t k = 0; k < ARRAY_LEN(targets) && st == STRATA_OK; k++)
                st = write_view(t, targets[k], in[k], m, rank, first, n, sources[k], &w);
            /* NVMe writes read from the buffers: wait before refilling them. */
            strata_status wst = io_wait_wait(&w);
            if (st == STRATA_OK)
                st = wst;
        }
        if (module_crc)
            module_crc[i] = crc;
    }
    io_wait_destroy(&w);
out:
    free(vals);
    (void)dev_host_free(t->env.dev, pbuf);
    free(zero_m);
    free(zero_v);
    return st;
}

void tiers_close(engine_tiers *t)
{
    if (t->param_is_master)
        memset(&t->param[0], 0, sizeof t->param[0]);
    tier_array *arrays[] = {&t->param[0], &t->param[1], &t->master, &t->exp_avg, &t->exp_avg_sq, &t->exp_avg_scale,
                            &t->exp_avg_sq_scale};
    for (size_t i = 0; i < ARRAY_LEN(arrays); i++)
        tarr_free(arrays[i], &t->env);
    pool_destroy(t->pool);
    swap_destroy(t->swap);
    nvme_io_destroy(t->io);
    memset(t, 0, sizeof *t);
}
