/* The optimizer parameter groups of a `strata train` run (see train_groups.h). */
#include "tools/train_groups.h"

#include <assert.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "tools/train_msg.h"

static const char *const group_names[DECAY_GROUPS] = {"default", "decay", "no_decay"};

strata_status train_groups_make(train_groups *g, strata_engine *e, gpt_model *m, const decay_recipe *r)
{
    g->recipe = *r;
    g->n = decay_recipe_on(r) ? DECAY_GROUPS : 1;
    strata_status st = strata_group_get(e, DECAY_GROUP_DEFAULT, &g->hp[DECAY_GROUP_DEFAULT]);
    for (size_t i = 1; i < g->n && st == STRATA_OK; i++) {
        g->hp[i] = g->hp[DECAY_GROUP_DEFAULT];
        g->hp[i].weight_decay = i == DECAY_GROUP_DECAY ? r->weight_decay : 0.0;
        strata_group_id id;
        st = strata_group_add(e, group_names[i], &g->hp[i], &id);
        assert(st != STRATA_OK || id == i); /* the layout (decay_recipe_module_groups) counts on these ids */
    }
    if (st == STRATA_OK && g->n > 1)
        st = gpt_model_set_decay_groups(m, r->embeddings, DECAY_GROUP_DECAY, DECAY_GROUP_NO_DECAY);
    return st;
}

strata_status train_groups_set(train_groups *g, strata_engine *e, double lr)
{
    strata_status st = STRATA_OK;
    for (size_t i = 0; i < g->n && st == STRATA_OK; i++) {
        g->hp[i].lr = lr;
        st = strata_group_set(e, (strata_group_id)i, &g->hp[i]);
    }
    return st;
}

/* ---------------------------------------------------------------- a checkpoint's groups */

/* A checkpoint's groups as strata train's flags would make them. */
typedef struct saved_recipe {
    bool ours;       /* the names are a strata train's: "default", or "default", "decay", "no_decay" */
    size_t n;
    double decay;    /* the decay group's weight decay (the one group's when n is 1) */
    bool embeddings; /* the token embedding is in the decay group */
} saved_recipe;

static saved_recipe read_saved(const json_t *groups)
{
    saved_recipe s = {.n = json_array_size(groups)};
    s.ours = s.n == 1 || s.n == DECAY_GROUPS;
    for (size_t i = 0; i < s.n && s.ours; i++) {
        const char *name = json_string_value(json_object_get(json_array_get(groups, i), "name"));
        s.ours = name && strcmp(name, group_names[i]) == 0;
    }
    if (!s.ours)
        return s;
    const json_t *g = json_array_get(groups, s.n == 1 ? DECAY_GROUP_DEFAULT : DECAY_GROUP_DECAY), *v;
    s.decay = json_number_value(json_object_get(g, "weight_decay"));
    size_t k;
    json_array_foreach(json_object_get(g, "params"), k, v) {
        if (json_is_string(v) && strcmp(json_string_value(v), "embeddings.wte") == 0)
            s.embeddings = true;
    }
    return s;
}

/* What the saved groups were made by, in the flags' words where a strata train made them. */
static void describe_saved(const saved_recipe *s, const json_t *groups, char *out, size_t len)
{
    if (s->ours && s->n == 1 && s->decay > 0) {
        snprintf(out, len, "one parameter group with weight decay %.6g on every parameter (not this recipe's groups)",
                 s->decay);
    } else if (s->ours) {
        snprintf(out, len, "--weight-decay %.6g%s", s->decay, s->embeddings ? " --decay-embeddings" : "");
    } else {
        size_t at = (size_t)snprintf(out, len, "parameter groups");
        for (size_t i = 0; i < s->n && at < len; i++) {
            const char *name = json_string_value(json_object_get(json_array_get(groups, i), "name"));
            at += (size_t)snprintf(out + at, len - at, "%s \"%s\"", i ? "," : "", name ? name : "?");
        }
        if (at < len)
            snprintf(out + at, len - at, " (not strata train's)");
    }
}

int train_groups_check_checkpoint(const train_groups *g, const char *dir, double *saved_decay)
{
    *saved_decay = g->recipe.weight_decay;
    char path[4200];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    /* A regular file only, opened without blocking (a FIFO) or following a link: strata_load refuses anything else
     * by name, and says so. */
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    json_t *manifest = fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? json_loadfd(fd, 0, NULL) : NULL;
    if (fd >= 0)
        close(fd);
    const json_t *groups = json_object_get(manifest, "param_groups");
    if (!json_is_array(groups)) { /* before groups, or unreadable: strata_load decides (and says what is wrong) */
        json_decref(manifest);
        return 0;
    }
    const decay_recipe *r = &g->recipe;
    saved_recipe s = read_saved(groups);
    /* The same groups: the names and the embeddings' place. The decay's value may change, as the lr may. */
    bool same = s.ours && s.n == g->n && (s.n == 1 || s.embeddings == r->embeddings);
    char theirs[512];
    describe_saved(&s, groups, theirs, sizeof theirs);
    json_decref(manifest);
    if (!same) {
        train_err("--resume \"%s\": the checkpoint was trained with %s, this run has --weight-decay %.6g%s (%s); the "
                  "parameter groups must be the same to resume: give the --weight-decay (0 or not) and "
                  "--decay-embeddings of the run that saved it", dir, theirs, r->weight_decay,
                  r->embeddings ? " --decay-embeddings" : "",
                  g->n == 1 ? "one group, \"default\"" : "groups \"default\", \"decay\", \"no_decay\"");
        return 2;
    }
    *saved_decay = s.decay;
    return 0;
}
