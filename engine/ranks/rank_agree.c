/* Ranks agree on what changes the math: at finalize and at every step; see rank_agree.h. */
#include "engine/ranks/rank_agree.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/crc32c.h"
#include "base/util.h"
#include "engine/config/config_schema.h"
#include "engine/engine.h"

#define AGREE_MAX_ITEMS 16
#define AGREE_NAME_BYTES 48
#define AGREE_TEXT_BYTES 160

/* The settings whose difference between ranks changes the arithmetic or the layout. Budgets, paths, threads, the
 * backend and the I/O settings are each rank's own and may differ. */
static const char *const agreed_keys[] = {
    "zero_optimization.stage",
    "zero_optimization.offload_param.device",
    "zero_optimization.offload_optimizer.device",
    "zero_optimization.offload_optimizer.ratio",
    "zero_optimization.sub_group_size",
    "zero_optimization.stage3_param_persistence_threshold",
    "optimizer.type",
    "optimizer.params.lr",
    "optimizer.params.betas",
    "optimizer.params.eps",
    "optimizer.params.weight_decay",
    "optimizer.params.bias_correction",
    "bf16.enabled",
    "fp16.enabled",
    "fp16.loss_scale",
    "fp16.initial_scale_power",
    "fp16.loss_scale_window",
    "fp16.hysteresis",
    "fp16.min_loss_scale",
    "gradient_clipping",
    "strata.delayed_update",
    "strata.delayed_warmup_steps",
    "strata.step_in_backward",
    "strata.norm_pass",
    "strata.gradient_reduction",
};
#define AGREED_KEYS (sizeof agreed_keys / sizeof agreed_keys[0])

typedef struct agree_item {
    char name[AGREE_NAME_BYTES];
    double value;
} agree_item;

struct rank_agree {
    agree_item items[AGREE_MAX_ITEMS]; /* strata_engine_agree_on, in the order first declared */
    int nitems;
    uint32_t *crcs;                    /* per module: the initial weights' crc32c */
    size_t ncrcs;
};

void agree_destroy(rank_agree *a)
{
    if (!a)
        return;
    free(a->crcs);
    free(a);
}

static rank_agree *agree_of(strata_engine *e)
{
    if (!e->agree)
        e->agree = calloc(1, sizeof *e->agree);
    return e->agree;
}

/* ---------------------------------------------------------------- the trainer's values */

STRATA_API strata_status strata_engine_agree_on(strata_engine *e, const char *name, double value)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_engine_agree_on: engine is NULL");
    if (!name || !name[0] || strlen(name) >= AGREE_NAME_BYTES)
        return err_copy(&e->err, err_set(STRATA_EINVAL, "strata_engine_agree_on: name must be 1 to %d bytes",
                                         AGREE_NAME_BYTES - 1));
    if (e->finalized)
        return err_copy(&e->err, err_set(STRATA_ESTATE, "strata_engine_agree_on(\"%s\"): the engine is finalized; "
                                         "declare the values before strata_engine_finalize, which compares them",
                                         name));
    rank_agree *a = agree_of(e);
    if (!a)
        return err_copy(&e->err, err_set(STRATA_ENOMEM, "strata_engine_agree_on: out of host memory"));
    for (int i = 0; i < a->nitems; i++)
        if (strcmp(a->items[i].name, name) == 0) {
            a->items[i].value = value;
            return STRATA_OK;
        }
    if (a->nitems == AGREE_MAX_ITEMS)
        return err_copy(&e->err, err_set(STRATA_EINVAL, "strata_engine_agree_on(\"%s\"): at most %d values; combine "
                                         "them (a hash of several is one value)", name, AGREE_MAX_ITEMS));
    snprintf(a->items[a->nitems].name, AGREE_NAME_BYTES, "%s", name);
    a->items[a->nitems++].value = value;
    return STRATA_OK;
}

/* ---------------------------------------------------------------- finalize */

uint32_t *agree_weight_crcs(strata_engine *e)
{
    rank_agree *a = agree_of(e);
    size_t n = registry_nmodules(e->reg);
    if (!a)
        return NULL;
    if (a->ncrcs != n) {
        free(a->crcs);
        a->crcs = calloc(n, sizeof *a->crcs);
        a->ncrcs = a->crcs ? n : 0;
    }
    return a->crcs;
}

typedef struct fingerprint {
    int32_t status;
    int32_t nitems;
    uint64_t keys[AGREED_KEYS];   /* crc32c of each agreed key's value as its JSON text */
    uint64_t model, modules, params;
    uint64_t groups, ngroups;     /* the parameter groups: their names, values and members (opt_groups_digest) */
    uint64_t weights;             /* crc32c over the modules' crcs; 0 = not computed */
    agree_item items[AGREE_MAX_ITEMS];
    char msg[400];
} fingerprint;

/* A key's value as the config JSON spells it, exactly. */
static void key_text(const strata_config *cfg, const char *path, char *out, size_t len)
{
    json_t *v = cfg_key_value_json(cfg_key_find(path), cfg);
    char *text = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(17)) : NULL;
    snprintf(out, len, "%s", text ? text : "?");
    free(text);
    json_decref(v);
}

static uint64_t model_hash(const registry *r)
{
    uint32_t h = 0;
    for (size_t i = 0; i < registry_nmodules(r); i++) {
        const reg_module *m = registry_module(r, (strata_module_id)i);
        h = crc32c(h, m->name, strlen(m->name) + 1);
        h = crc32c(h, &m->frozen, sizeof m->frozen);
        for (size_t j = 0; j < m->nparams; j++) {
            const reg_param *p = registry_param(r, m->params[j]);
            h = crc32c(h, p->name, strlen(p->name) + 1);
            h = crc32c(h, &p->numel, sizeof p->numel);
        }
    }
    return h;
}

static void fingerprint_of(strata_engine *e, strata_status local, fingerprint *f)
{
    memset(f, 0, sizeof *f);
    f->status = (int32_t)local;
    if (local != STRATA_OK)
        snprintf(f->msg, sizeof f->msg, "%.399s", err_last());
    for (size_t k = 0; k < AGREED_KEYS; k++) {
        char text[AGREE_TEXT_BYTES];
        key_text(&e->cfg, agreed_keys[k], text, sizeof text);
        f->keys[k] = crc32c(0, text, strlen(text));
    }
    f->model = model_hash(e->reg);
    f->modules = registry_nmodules(e->reg);
    f->params = registry_nparams(e->reg);
    f->groups = opt_groups_digest(e->groups, e->reg);
    f->ngroups = opt_groups_count(e->groups);
    rank_agree *a = e->agree;
    if (a && a->crcs && a->ncrcs == f->modules)
        f->weights = (uint64_t)crc32c(0, a->crcs, a->ncrcs * sizeof *a->crcs) | 1ull << 32;
    if (a) {
        f->nitems = a->nitems;
        memcpy(f->items, a->items, sizeof f->items);
    }
}

/* The first agreed key on which rank r differs from rank 0, or -1. */
static int differing_key(const fingerprint *all, int r)
{
    for (size_t k = 0; k < AGREED_KEYS; k++)
        if (all[r].keys[k] != all[0].keys[k])
            return (int)k;
    return -1;
}

/* Both values of key k, rank 0's and rank r's: every rank sends its own (all ranks found the same k). */
static strata_status key_mismatch(strata_engine *e, size_t k, int r)
{
    char *texts = calloc((size_t)e->world, AGREE_TEXT_BYTES);
    if (!texts)
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory");
    char mine[AGREE_TEXT_BYTES];
    key_text(&e->cfg, agreed_keys[k], mine, sizeof mine);
    strata_status st = comm_allgather(e->comm, mine, texts, AGREE_TEXT_BYTES, COMM_BYTE);
    if (st == STRATA_OK) {
        const char *hint = strstr(agreed_keys[k], ".device")
                               ? " (with offload device \"auto\" each rank places from its own budgets: give them "
                                 "the same budgets, or name the tiers)"
                               : "";
        st = err_set(STRATA_ECONFIG, "strata_engine_finalize: the ranks' configs differ: %s is %.*s on rank 0 but "
                     "%.*s on rank %d; every rank must train with the same value%s", agreed_keys[k],
                     AGREE_TEXT_BYTES, texts, AGREE_TEXT_BYTES, texts + (size_t)r * AGREE_TEXT_BYTES, r, hint);
    }
    free(texts);
    return st;
}

/* The first module whose initial weights differ between rank 0 and rank r: every rank sends its crcs. */
static strata_status weights_mismatch(strata_engine *e, int r)
{
    size_t n = e->agree->ncrcs;
    uint32_t *all = calloc((size_t)e->world * n, sizeof *all);
    if (!all)
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory");
    strata_status st = comm_allgather(e->comm, e->agree->crcs, all, n, COMM_I32);
    size_t i = 0;
    while (st == STRATA_OK && i + 1 < n && all[i] == all[(size_t)r * n + i])
        i++;
    if (st == STRATA_OK)
        st = err_set(STRATA_ECONFIG, "strata_engine_finalize: the initial weights differ between ranks: module "
                     "\"%s\" starts from other values on rank %d than on rank 0 (crc32c %08" PRIx32 " vs %08" PRIx32
                     "); every rank must start from the same weights: give every rank the same seed (strata train "
                     "--seed; torch.manual_seed before the model is built) or load the same checkpoint",
                     registry_module(e->reg, (strata_module_id)i)->name, r, all[(size_t)r * n + i], all[i]);
    free(all);
    return st;
}

/* One parameter group as the ranks compare it. */
typedef struct agree_group {
    char name[ENGINE_NAME_BYTES];
    strata_group_hparams hp;
} agree_group;

/* The first field of group g that differs between rank 0 (a) and rank r (b), as an error. */
static strata_status group_field_mismatch(size_t g, const agree_group *a, const agree_group *b, int r)
{
    if (strcmp(a->name, b->name) != 0)
        return err_set(STRATA_ECONFIG, "strata_engine_finalize: parameter group %zu is \"%s\" on rank 0 but \"%s\" on "
                       "rank %d; every rank must add the same groups in the same order", g, a->name, b->name, r);
    static const char *const fields[] = {"lr", "weight_decay", "beta1", "beta2", "eps"};
    const double *va = &a->hp.lr, *vb = &b->hp.lr;
    for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++)
        if (memcmp(&va[f], &vb[f], sizeof(double)) != 0)
            return err_set(STRATA_ECONFIG, "strata_engine_finalize: parameter group \"%s\" has %s = %.17g on rank 0 but "
                           "%.17g on rank %d; every rank must give every group the same values", a->name, fields[f],
                           va[f], vb[f], r);
    return STRATA_OK;
}

/* Names what differs in the parameter groups of rank r and rank 0 (their digests differ): every rank sends its
 * groups, then, when those agree, which group each parameter is in. A collective (every rank found the same r). */
static strata_status groups_mismatch(strata_engine *e, const fingerprint *all, int r)
{
    size_t most = 0, np = registry_nparams(e->reg), mine = opt_groups_count(e->groups);
    for (int k = 0; k < e->world; k++)
        most = MAX(most, (size_t)all[k].ngroups);
    agree_group *groups = calloc(most * ((size_t)e->world + 1), sizeof *groups);
    uint32_t *members = calloc((np ? np : 1) * ((size_t)e->world + 1), sizeof *members);
    if (!groups || !members) {
        free(groups);
        free(members);
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory");
    }
    agree_group *own = groups + most * (size_t)e->world;
    for (size_t g = 0; g < mine; g++) {
        snprintf(own[g].name, sizeof own[g].name, "%s", opt_groups_name(e->groups, (strata_group_id)g));
        own[g].hp = *opt_groups_get(e->groups, (strata_group_id)g);
    }
    strata_status st = comm_allgather(e->comm, own, groups, most * sizeof *groups, COMM_BYTE);
    const agree_group *a = groups, *b = groups + (size_t)r * most;
    if (st == STRATA_OK && all[r].ngroups != all[0].ngroups)
        st = err_set(STRATA_ECONFIG, "strata_engine_finalize: rank 0 made %llu parameter groups, rank %d %llu; every "
                     "rank must make the same groups (strata_group_add)", (unsigned long long)all[0].ngroups, r,
                     (unsigned long long)all[r].ngroups);
    for (size_t g = 0; st == STRATA_OK && g < (size_t)all[0].ngroups; g++)
        st = group_field_mismatch(g, &a[g], &b[g], r);
    if (st == STRATA_OK) { /* the groups agree: their members do not */
        uint32_t *own_members = members + np * (size_t)e->world;
        for (size_t i = 0; i < np; i++)
            own_members[i] = registry_param(e->reg, (strata_param_id)i)->group;
        st = comm_allgather(e->comm, own_members, members, np, COMM_I32);
        for (size_t i = 0; st == STRATA_OK && i < np; i++) {
            uint32_t ga = members[i], gb = members[(size_t)r * np + i];
            if (ga != gb) {
                const reg_param *p = registry_param(e->reg, (strata_param_id)i);
                st = err_set(STRATA_ECONFIG, "strata_engine_finalize: parameter \"%s.%s\" is in group \"%s\" on rank 0 "
                             "but in \"%s\" on rank %d; every rank must put every parameter in the same group",
                             registry_module(e->reg, p->module)->name, p->name, a[ga].name, a[gb].name, r);
            }
        }
    }
    free(groups);
    free(members);
    return st;
}

/* The first difference between rank r's declared values and rank 0's, or STRATA_OK. */
static strata_status items_mismatch(const fingerprint *all, int r)
{
    const fingerprint *a = &all[0], *b = &all[r];
    int n = a->nitems > b->nitems ? a->nitems : b->nitems;
    for (int i = 0; i < n; i++) {
        const char *na = i < a->nitems ? a->items[i].name : "(nothing)";
        const char *nb = i < b->nitems ? b->items[i].name : "(nothing)";
        if (strcmp(na, nb) != 0)
            return err_set(STRATA_ECONFIG, "strata_engine_finalize: the trainers declared different values to agree "
                           "on (strata_engine_agree_on): \"%s\" on rank 0 where rank %d declared \"%s\"; every rank "
                           "must run the same trainer", na, r, nb);
        if (memcmp(&a->items[i].value, &b->items[i].value, sizeof(double)) != 0)
            return err_set(STRATA_ECONFIG, "strata_engine_finalize: the ranks were given different %s: %.17g on "
                           "rank 0 but %.17g on rank %d; every rank must be given the same value", na,
                           a->items[i].value, b->items[i].value, r);
    }
    return STRATA_OK;
}

strata_status agree_finalize(strata_engine *e, strata_status local)
{
    if (e->world == 1)
        return local;
    char msg[ERR_MSG_BYTES];
    snprintf(msg, sizeof msg, "%s", local != STRATA_OK ? err_last() : "");
    fingerprint mine;
    fingerprint_of(e, local, &mine);
    fingerprint *all = calloc((size_t)e->world, sizeof *all);
    if (!all)
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory");
    strata_status st = comm_allgather(e->comm, &mine, all, sizeof mine, COMM_BYTE);
    /* Every rank walks the same gathered fingerprints in the same order, so all find the same first difference and
     * make the same follow-up exchange (key_mismatch, weights_mismatch). */
    for (int r = 0; st == STRATA_OK && r < e->world; r++)
        if (all[r].status != STRATA_OK)
            st = r == e->rank ? err_set(local, "%s", msg)
                              : err_set(STRATA_ECOMM, "strata_engine_finalize: rank %d of %d failed: %.*s", r,
                                        e->world, (int)sizeof all[r].msg, all[r].msg);
    for (int r = 1; st == STRATA_OK && r < e->world; r++) {
        int k = differing_key(all, r);
        if (k >= 0)
            st = key_mismatch(e, (size_t)k, r);
        else if (all[r].model != all[0].model)
            st = err_set(STRATA_ECONFIG, "strata_engine_finalize: rank %d's model differs from rank 0's (%llu modules "
                         "and %llu parameters vs %llu and %llu, or a name, a size or a frozen module differs); every "
                         "rank must add the same modules and parameters in the same order, and freeze the same "
                         "modules", r, (unsigned long long)all[r].modules,
                         (unsigned long long)all[r].params, (unsigned long long)all[0].modules,
                         (unsigned long long)all[0].params);
        else if (all[r].groups != all[0].groups)
            st = groups_mismatch(e, all, r);
        else if ((st = items_mismatch(all, r)) != STRATA_OK)
            ;
        else if (all[r].weights && all[0].weights && all[r].weights != all[0].weights)
            st = weights_mismatch(e, r);
    }
    free(all);
    return st;
}

/* ---------------------------------------------------------------- the step */

static uint64_t bits_of(double v)
{
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}

void agree_step_pack(const agree_step *s, uint64_t *w)
{
    /* The maximum of x and of ~x over the ranks: they are x and ~x exactly when every rank had the same x. */
    uint64_t v[AGREE_STEP_WORDS / 2] = {bits_of(s->lr), s->step, s->micro_batches, s->groups};
    for (int i = 0; i < AGREE_STEP_WORDS / 2; i++) {
        w[2 * i] = v[i];
        w[2 * i + 1] = ~v[i];
    }
}

strata_status agree_step_check(strata_engine *e, const agree_step *s, const uint64_t *reduced)
{
    bool same = true;
    for (int i = 0; i < AGREE_STEP_WORDS / 2; i++)
        same = same && reduced[2 * i] == ~reduced[2 * i + 1];
    if (same)
        return STRATA_OK;
    agree_step *all = calloc((size_t)e->world, sizeof *all);
    if (!all)
        return err_set(STRATA_ENOMEM, "strata_step: out of memory");
    strata_status st = comm_allgather(e->comm, s, all, sizeof *s, COMM_BYTE);
    for (int r = 1; st == STRATA_OK && r < e->world; r++) {
        const agree_step *a = &all[0], *b = &all[r];
        if (bits_of(a->lr) != bits_of(b->lr))
            st = err_set(STRATA_ECONFIG, "strata_step: the ranks' learning rates differ at step %llu: %.17g on rank 0 "
                         "but %.17g on rank %d; every rank must pass the same lr (the same schedule and --lr)",
                         (unsigned long long)a->step, a->lr, b->lr, r);
        else if (a->step != b->step)
            st = err_set(STRATA_ECONFIG, "strata_step: the ranks are at different steps: step %llu on rank 0 but %llu "
                         "on rank %d; every rank must call strata_step as often (a resumed rank and a fresh one?)",
                         (unsigned long long)a->step, (unsigned long long)b->step, r);
        else if (a->groups != b->groups)
            st = err_set(STRATA_ECONFIG, "strata_step: the ranks' parameter groups differ at step %llu: rank %d set "
                         "another lr, weight_decay, betas or eps in some group than rank 0 (strata_group_set); every "
                         "rank must drive every group with the same schedule", (unsigned long long)a->step, r);
        else if (a->micro_batches != b->micro_batches)
            st = err_set(STRATA_ECONFIG, "strata_step: the ranks handed over gradients a different number of times "
                         "in step %llu: %llu micro-batches on rank 0 but %llu on rank %d; every rank must run the "
                         "same gradient accumulation", (unsigned long long)a->step,
                         (unsigned long long)a->micro_batches, (unsigned long long)b->micro_batches, r);
    }
    free(all);
    /* Every rank saw the same values and fails with the same message: the world itself is fine. */
    e->failed_alike = st == STRATA_ECONFIG;
    return st;
}
