/* Choosing what the host cache mirrors; see host_cache.h. */
#include "engine/plan/host_cache.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/util.h"
#include "engine/engine.h"

typedef struct module_rank {
    strata_module_id id;
    size_t fetches, first_use;
} module_rank;

static int by_use(const void *a, const void *b)
{
    const module_rank *x = a, *y = b;
    if (x->fetches != y->fetches)
        return x->fetches > y->fetches ? -1 : 1;
    return x->first_use < y->first_use ? -1 : x->first_use > y->first_use;
}

static int by_first(const void *a, const void *b)
{
    const tcache_range *x = a, *y = b;
    return x->first < y->first ? -1 : x->first > y->first;
}

/* The parameter modules to mirror within bytes, ranked by fetches per step then by how soon they come (from the
 * fetch order when valid, else every module once in id order); ranges sorted by offset into out. */
static strata_status choose_modules(strata_engine *e, size_t bytes, tcache_range **out, size_t *n)
{
    size_t nm = registry_nmodules(e->reg), copies = e->cfg.delayed_update ? 2 : 1;
    module_rank *rank = calloc(nm ? nm : 1, sizeof *rank);
    *out = calloc(nm ? nm : 1, sizeof **out);
    *n = 0;
    if (!rank || !*out) {
        free(rank);
        return err_set(STRATA_ENOMEM, "host cache: out of memory choosing what to mirror");
    }
    for (size_t i = 0; i < nm; i++)
        rank[i] = (module_rank){(strata_module_id)i, fetch_order_valid(e->order) ? 0 : 1, i};
    if (fetch_order_valid(e->order)) {
        size_t len = fetch_order_len(e->order);
        for (size_t k = len; k-- > 0;) {
            module_rank *r = &rank[fetch_order_ahead(e->order, k)];
            r->fetches++;
            r->first_use = k;
        }
    }
    /* A persistent module stays on the device once fetched: the drive serves it once per step (after the update),
     * however often the trainer fetches it. */
    for (size_t i = 0; i < nm; i++)
        if (registry_module(e->reg, rank[i].id)->persistent && rank[i].fetches > 1)
            rank[i].fetches = 1;
    qsort(rank, nm, sizeof *rank, by_use);
    size_t left = bytes;
    for (size_t i = 0; i < nm; i++) {
        const reg_module *m = registry_module(e->reg, rank[i].id);
        size_t count = registry_view_count(m, e->views.param), cost = count * e->tiers.param_bytes * copies;
        /* A module the trainer never fetches gains nothing from a mirror. */
        if (!rank[i].fetches || !count || cost > left)
            continue;
        left -= cost;
        (*out)[(*n)++] = (tcache_range){registry_view_offset(m, e->views.param), count};
    }
    free(rank);
    qsort(*out, *n, sizeof **out, by_first);
    return STRATA_OK;
}

static bool same_ranges(const tier_array *a, const tcache_range *r, size_t n)
{
    size_t numel = 0;
    for (size_t i = 0; i < n; i++) {
        if (!tcache_mirrors(a->cache, r[i].first, r[i].count))
            return false;
        numel += r[i].count;
    }
    return numel == tcache_numel(a->cache);
}

/* Mirrors ranges of both parameter copies; fill reads them from NVMe (else the next writes fill them). */
static strata_status cache_params(strata_engine *e, const tcache_range *r, size_t n, bool fill)
{
    for (int c = 0; c < (e->cfg.delayed_update ? 2 : 1); c++) {
        tier_array *a = &e->tiers.param[c];
        ERR_CHECK(tarr_cache(a, &e->tiers.env, r, n));
        for (size_t i = 0; fill && i < n; i++)
            ERR_CHECK(tarr_cache_fill(a, &e->tiers.env, r[i].first, r[i].count));
    }
    return STRATA_OK;
}

/* Whole sub-groups of the optimizer state, from the first, within bytes (plan_opt_elem_bytes per element: master,
 * m, v; the 8-bit moments' scales are in host memory already): the
 * ordinary step reads it by sub-group. Step in backward reads it module by module (engine/step/step_in_backward.c),
 * pieces that need not fall inside one sub-group, so there the mirrors are whole modules, as many as fit, in
 * partition order. */
static strata_status cache_optimizer(strata_engine *e, size_t bytes)
{
    size_t elem = plan_opt_elem_bytes(e->cfg.optimizer_moments);
    size_t numel = e->tiers.master.numel, sg = MIN(align_up(e->cfg.sub_group_size, ENGINE_MODULE_ALIGN), numel);
    size_t nm = registry_nmodules(e->reg);
    size_t groups = e->cfg.step_in_backward ? nm : sg ? (numel + sg - 1) / sg : 0, n = 0;
    tcache_range *r = calloc(groups ? groups : 1, sizeof *r);
    if (!r)
        return err_set(STRATA_ENOMEM, "host cache: out of memory choosing what to mirror");
    for (size_t k = 0, left = bytes; k < groups; k++) {
        tcache_range g = {k * sg, sg ? MIN(sg, numel - k * sg) : 0};
        if (e->cfg.step_in_backward) {
            const reg_module *m = registry_module(e->reg, (strata_module_id)k);
            g = (tcache_range){registry_view_offset(m, e->views.opt), registry_view_count(m, e->views.opt)};
        }
        if (!g.count || elem * g.count > left)
            continue;
        left -= elem * g.count;
        r[n++] = g;
    }
    qsort(r, n, sizeof *r, by_first);
    tier_array *arrays[] = {&e->tiers.master, &e->tiers.exp_avg, &e->tiers.exp_avg_sq};
    strata_status st = STRATA_OK;
    for (size_t i = 0; i < ARRAY_LEN(arrays) && st == STRATA_OK; i++)
        st = tarr_cache(arrays[i], &e->tiers.env, r, n);
    free(r);
    return st;
}

strata_status host_cache_open(strata_engine *e, const plan *pl)
{
    e->tiers.cache_param_bytes = pl->cache_param_bytes;
    e->tiers.cache_follows_order = false;
    if (pl->cache_param_bytes) {
        tcache_range *r;
        size_t n;
        ERR_CHECK(choose_modules(e, pl->cache_param_bytes, &r, &n));
        e->tiers.cache_follows_order = fetch_order_valid(e->order);
        strata_status st = cache_params(e, r, n, false);
        free(r);
        ERR_CHECK(st);
    }
    if (pl->cache_opt_bytes)
        ERR_CHECK(cache_optimizer(e, pl->cache_opt_bytes));
    return STRATA_OK;
}

strata_status host_cache_follow_order(strata_engine *e)
{
    if (e->tiers.cache_follows_order || !e->tiers.cache_param_bytes || !fetch_order_valid(e->order))
        return STRATA_OK;
    e->tiers.cache_follows_order = true;
    tcache_range *r;
    size_t n;
    ERR_CHECK(choose_modules(e, e->tiers.cache_param_bytes, &r, &n));
    strata_status st = STRATA_OK;
    if (!same_ranges(&e->tiers.param[0], r, n)) {
        LOG_INFO(LOG_SCHED, "host cache: the fetch order changes which modules are mirrored (%zu of %zu)", n,
                 registry_nmodules(e->reg));
        st = cache_params(e, r, n, true);
    }
    free(r);
    return st;
}

void host_cache_forget(strata_engine *e)
{
    tier_array *arrays[] = {&e->tiers.param[0], &e->tiers.param[1], &e->tiers.master, &e->tiers.exp_avg,
                            &e->tiers.exp_avg_sq};
    for (size_t i = 0; i < ARRAY_LEN(arrays); i++)
        tcache_forget(arrays[i]->cache);
}

size_t host_cache_bytes(const strata_engine *e)
{
    const tier_array *arrays[] = {&e->tiers.param[0], &e->tiers.param[1], &e->tiers.master, &e->tiers.exp_avg,
                                  &e->tiers.exp_avg_sq};
    size_t bytes = 0;
    for (size_t i = 0; i < ARRAY_LEN(arrays); i++)
        bytes += tcache_bytes(arrays[i]->cache);
    return bytes;
}
