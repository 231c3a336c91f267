/* The optimizer's parameter groups: their values, the copy a step runs with, and the constants they give. */
#include "engine/step/opt_groups.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/crc32c.h"
#include "base/error.h"
#include "base/util.h"
#include "engine/config/config.h"

typedef struct opt_group {
    char name[ENGINE_NAME_BYTES];
    strata_group_hparams hp;     /* as the trainer set them */
    strata_group_hparams frozen; /* the step's */
} opt_group;

struct opt_groups {
    opt_group *g;
    size_t n, cap;
    adam_run *runs; /* the optimizer view's (opt_groups_map) */
    size_t nruns;
};

strata_status opt_groups_create(const strata_config *cfg, opt_groups **out)
{
    opt_groups *g = calloc(1, sizeof *g);
    if (!g || !array_grow((void **)&g->g, &g->cap, 1, sizeof *g->g)) {
        free(g);
        return err_set(STRATA_ENOMEM, "strata_engine_create: out of memory for the parameter groups");
    }
    opt_group *d = &g->g[g->n++];
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "default");
    d->hp = (strata_group_hparams){.lr = cfg->lr_exact, .weight_decay = cfg->weight_decay_exact,
                                   .beta1 = cfg->beta1_exact, .beta2 = cfg->beta2_exact, .eps = cfg->eps_exact};
    d->frozen = d->hp;
    *out = g;
    return STRATA_OK;
}

void opt_groups_destroy(opt_groups *g)
{
    if (!g)
        return;
    free(g->g);
    free(g->runs);
    free(g);
}

static bool in(double v, double lo, double hi)
{
    return isfinite(v) && v >= lo && v <= hi;
}

strata_status opt_groups_check(const char *what, const char *name, const strata_group_hparams *hp)
{
    if (!hp)
        return err_set(STRATA_EINVAL, "%s: the hyperparameters are NULL", what);
    const char *field = NULL, *range = NULL;
    double v = 0;
    if (!in(hp->lr, 0, 1e6))
        field = "lr", v = hp->lr, range = "[0, 1e6]";
    else if (!in(hp->weight_decay, 0, 1e6))
        field = "weight_decay", v = hp->weight_decay, range = "[0, 1e6]";
    else if (!in(hp->beta1, 0, 1) || hp->beta1 == 1)
        field = "beta1", v = hp->beta1, range = "[0, 1)";
    else if (!in(hp->beta2, 0, 1) || hp->beta2 == 1)
        field = "beta2", v = hp->beta2, range = "[0, 1)";
    else if (!in(hp->eps, 0, 1) || hp->eps == 0)
        field = "eps", v = hp->eps, range = "(0, 1]";
    if (field)
        return err_set(STRATA_EINVAL, "%s: parameter group \"%s\": %s = %g is out of range %s", what, name, field, v,
                       range);
    return STRATA_OK;
}

strata_status opt_groups_add(opt_groups *g, const char *name, const strata_group_hparams *hp, strata_group_id *out)
{
    if (!name || !*name || strlen(name) >= ENGINE_NAME_BYTES)
        return err_set(STRATA_EINVAL, "strata_group_add: a group's name is 1..%d bytes (got %zu)",
                       ENGINE_NAME_BYTES - 1, name ? strlen(name) : 0);
    ERR_CHECK(opt_groups_check("strata_group_add", name, hp));
    for (size_t i = 0; i < g->n; i++)
        if (strcmp(g->g[i].name, name) == 0)
            return err_set(STRATA_EINVAL, "strata_group_add: a parameter group named \"%s\" already exists (id %zu)",
                           name, i);
    if (g->n >= STRATA_MAX_GROUPS)
        return err_set(STRATA_ENOMEM, "strata_group_add(\"%s\"): at most %d parameter groups", name,
                       STRATA_MAX_GROUPS);
    if (!array_grow((void **)&g->g, &g->cap, g->n + 1, sizeof *g->g))
        return err_set(STRATA_ENOMEM, "strata_group_add(\"%s\"): out of memory", name);
    opt_group *d = &g->g[g->n];
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "%s", name);
    d->hp = d->frozen = *hp;
    *out = (strata_group_id)g->n++;
    return STRATA_OK;
}

strata_status opt_groups_set(opt_groups *g, strata_group_id id, const strata_group_hparams *hp)
{
    ERR_CHECK(opt_groups_check("strata_group_set", g->g[id].name, hp));
    g->g[id].hp = *hp;
    return STRATA_OK;
}

size_t opt_groups_count(const opt_groups *g)
{
    return g->n;
}

const strata_group_hparams *opt_groups_get(const opt_groups *g, strata_group_id id)
{
    return id < g->n ? &g->g[id].hp : NULL;
}

const char *opt_groups_name(const opt_groups *g, strata_group_id id)
{
    return id < g->n ? g->g[id].name : NULL;
}

strata_status opt_groups_map(opt_groups *g, const registry *r, reg_view v, int rank)
{
    free(g->runs);
    g->runs = NULL;
    return registry_group_runs(r, v, rank, &g->runs, &g->nruns);
}

strata_status opt_groups_check_step_lr(const opt_groups *g, double lr, const char *what)
{
    if (lr > 0 && g->n > 1)
        return err_set(STRATA_EINVAL, "%s: lr = %g with %zu parameter groups; a step's lr is per group: set each "
                       "group's with strata_group_set and pass lr 0", what, lr, g->n);
    return STRATA_OK;
}

strata_status opt_groups_freeze(opt_groups *g, double lr, const char *what)
{
    ERR_CHECK(opt_groups_check_step_lr(g, lr, what));
    for (size_t i = 0; i < g->n; i++)
        g->g[i].frozen = g->g[i].hp;
    if (lr > 0)
        g->g[0].frozen.lr = lr;
    return STRATA_OK;
}

double opt_groups_frozen_lr(const opt_groups *g)
{
    return g->g[0].frozen.lr;
}

uint64_t opt_groups_frozen_digest(const opt_groups *g)
{
    uint32_t lo = 0, hi = 0x9e3779b9u;
    for (size_t i = 0; i < g->n; i++) {
        lo = crc32c(lo, &g->g[i].frozen, sizeof g->g[i].frozen);
        hi = crc32c(hi, &g->g[i].frozen, sizeof g->g[i].frozen);
    }
    return (uint64_t)hi << 32 | lo;
}

void step_consts_free(step_consts *sc)
{
    free(sc->by_group);
    *sc = (step_consts){0};
}

uint64_t opt_groups_digest(const opt_groups *g, const registry *r)
{
    uint32_t h = 0;
    for (size_t i = 0; i < g->n; i++) {
        h = crc32c(h, g->g[i].name, strlen(g->g[i].name) + 1);
        h = crc32c(h, &g->g[i].hp, sizeof g->g[i].hp);
    }
    for (size_t i = 0; i < registry_nparams(r); i++) {
        strata_group_id id = registry_param(r, (strata_param_id)i)->group;
        h = crc32c(h, &id, sizeof id);
    }
    return h;
}

strata_status step_consts_fill(step_consts *sc, const opt_groups *g, const strata_config *cfg, int64_t step,
                               double grad_scale)
{
    if (sc->ngroups != g->n) {
        step_consts_free(sc);
        sc->by_group = calloc(g->n, sizeof *sc->by_group);
        if (!sc->by_group)
            return err_set(STRATA_ENOMEM, "optimizer step: out of memory for the constants of %zu parameter groups",
                           g->n);
        sc->ngroups = g->n;
    }
    sc->groups = (adam_group_map){.consts = sc->by_group, .runs = g->runs, .nruns = g->nruns};
    for (size_t i = 0; i < sc->ngroups; i++) {
        const strata_group_hparams *f = &g->g[i].frozen;
        strata_adam_hparams hp = cfg_adam_hparams(cfg, f->lr);
        hp.weight_decay = f->weight_decay;
        hp.beta1 = f->beta1;
        hp.beta2 = f->beta2;
        hp.eps = f->eps;
        adam_consts_init(&sc->by_group[i], &hp, step, grad_scale);
    }
    return STRATA_OK;
}

void step_consts_apply(const step_consts *sc, size_t first, adam_job *job)
{
    job->consts = sc->by_group[0];
    job->groups = sc->groups.nruns > 1 ? &sc->groups : NULL;
    job->groups_base = first;
    if (!job->groups)
        job->consts = sc->by_group[sc->groups.nruns ? sc->groups.runs[0].group : 0];
}

void step_consts_run(const step_consts *sc, size_t first, size_t numel, uint32_t *group, size_t *count)
{
    const adam_group_map *g = &sc->groups;
    size_t lo = adam_run_at(g, first);
    *group = g->nruns ? g->runs[lo].group : 0;
    size_t end = lo + 1 < g->nruns ? g->runs[lo + 1].start : first + numel;
    *count = MIN(end, first + numel) - first;
}
