/* The parameter groups in a checkpoint's manifest; see ckpt_groups.h. */
#include "engine/ckpt/ckpt_groups.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "engine/ckpt/ckpt_stream.h"
#include "engine/engine.h"

strata_status ckpt_groups_text(strata_engine *e, char **out)
{
    *out = NULL;
    size_t n = opt_groups_count(e->groups);
    json_t *all = json_array();
    for (size_t g = 0; all && g < n; g++) {
        const strata_group_hparams *hp = opt_groups_get(e->groups, (strata_group_id)g);
        json_t *params = json_array();
        char name[CKPT_NAME_BYTES];
        for (size_t i = 0; g > 0 && params && i < registry_nparams(e->reg); i++) {
            const reg_param *p = registry_param(e->reg, (strata_param_id)i);
            if (p->group != g || registry_param_tensor(p).first != 0)
                continue; /* a tensor in parts is listed once (its parts are in one group) */
            ckpt_tensor_name(e, p, "", name);
            json_array_append_new(params, json_string(name));
        }
        json_t *o = json_pack("{s:s, s:f, s:f, s:[f,f], s:f}", "name", opt_groups_name(e->groups, (strata_group_id)g),
                              "lr", hp->lr, "weight_decay", hp->weight_decay, "betas", hp->beta1, hp->beta2, "eps",
                              hp->eps);
        if (o && g > 0)
            json_object_set(o, "params", params);
        json_decref(params);
        json_array_append_new(all, o);
    }
    char *text = all ? json_dumps(all, JSON_COMPACT | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(all);
    if (!text)
        return err_set(STRATA_ENOMEM, "strata_save: out of memory for the parameter groups");
    *out = text;
    return STRATA_OK;
}

static bool get_real(const json_t *o, const char *key, double *out)
{
    const json_t *v = json_object_get(o, key);
    *out = json_number_value(v);
    return json_is_number(v) && isfinite(*out);
}

/* The saved values of group o (STRATA_ECORRUPT naming it when malformed). */
static strata_status saved_hparams(const json_t *o, size_t g, const char *dir, strata_group_hparams *hp)
{
    const json_t *b = json_object_get(o, "betas");
    if (!json_is_object(o) || !json_is_string(json_object_get(o, "name")) || !get_real(o, "lr", &hp->lr) ||
        !get_real(o, "weight_decay", &hp->weight_decay) || !get_real(o, "eps", &hp->eps) || !json_is_array(b) ||
        json_array_size(b) != 2 || !json_is_number(json_array_get(b, 0)) || !json_is_number(json_array_get(b, 1)))
        return err_set(STRATA_ECORRUPT, "strata_load(\"%s\"): param_groups[%zu] is malformed (a group has a name, "
                       "lr, weight_decay, betas [b1, b2] and eps)", dir, g);
    hp->beta1 = json_number_value(json_array_get(b, 0));
    hp->beta2 = json_number_value(json_array_get(b, 1));
    return STRATA_OK;
}

/* The saved group of each engine parameter (0 unless listed), into saved[]; STRATA_ECONFIG for a name the engine
 * does not have. */
static strata_status saved_members(strata_engine *e, const json_t *all, const char *dir, strata_group_id *saved)
{
    size_t np = registry_nparams(e->reg);
    char(*names)[CKPT_NAME_BYTES] = malloc((np ? np : 1) * sizeof *names);
    if (!names)
        return err_set(STRATA_ENOMEM, "strata_load: out of memory for %zu parameter names", np);
    for (size_t i = 0; i < np; i++)
        ckpt_tensor_name(e, registry_param(e->reg, (strata_param_id)i), "", names[i]);
    strata_status st = STRATA_OK;
    for (size_t g = 1; g < json_array_size(all); g++) {
        const json_t *params = json_object_get(json_array_get(all, g), "params"), *v;
        size_t k;
        json_array_foreach(params, k, v) {
            size_t found = 0; /* every part of a tensor in parts has its name */
            for (size_t i = 0; i < np; i++)
                if (json_is_string(v) && strcmp(names[i], json_string_value(v)) == 0) {
                    saved[i] = (strata_group_id)g;
                    found++;
                }
            if (!found) {
                st = err_set(STRATA_ECONFIG, "strata_load(\"%s\"): parameter group \"%s\" was saved with parameter "
                               "\"%s\", which this engine does not have", dir,
                               json_string_value(json_object_get(json_array_get(all, g), "name")),
                             json_is_string(v) ? json_string_value(v) : "?");
                break;
            }
        }
    }
    free(names);
    return st;
}

strata_status ckpt_groups_check(strata_engine *e, const char *text, const char *dir)
{
    if (!text)
        return STRATA_OK; /* saved before groups: one group, whatever the engine has now */
    json_t *all = json_loads(text, 0, NULL);
    size_t n = opt_groups_count(e->groups), np = registry_nparams(e->reg);
    strata_status st = json_is_array(all) && json_array_size(all) >= 1
                           ? STRATA_OK
                           : err_set(STRATA_ECORRUPT, "strata_load(\"%s\"): \"param_groups\" is not a list of groups",
                                     dir);
    strata_group_hparams hp;
    for (size_t g = 0; st == STRATA_OK && g < json_array_size(all); g++) {
        st = saved_hparams(json_array_get(all, g), g, dir, &hp);
        if (st == STRATA_OK && opt_groups_check("strata_load", "saved", &hp) != STRATA_OK)
            st = err_set(STRATA_ECORRUPT, "strata_load(\"%s\"): param_groups[%zu]: %s", dir, g, err_last());
    }
    if (st == STRATA_OK && json_array_size(all) != n)
        st = err_set(STRATA_ECONFIG, "strata_load(\"%s\"): the checkpoint has %zu parameter groups, this engine %zu; "
                     "make the same groups (strata_group_add; from Python the optimizer's param_groups) to resume it",
                     dir, json_array_size(all), n);
    for (size_t g = 0; st == STRATA_OK && g < n; g++) {
        const char *saved = json_string_value(json_object_get(json_array_get(all, g), "name"));
        if (strcmp(saved, opt_groups_name(e->groups, (strata_group_id)g)) != 0)
            st = err_set(STRATA_ECONFIG, "strata_load(\"%s\"): parameter group %zu was saved as \"%s\", this "
                         "engine's is \"%s\"; make the same groups in the same order", dir, g, saved,
                         opt_groups_name(e->groups, (strata_group_id)g));
    }
    strata_group_id *members = st == STRATA_OK ? calloc(np ? np : 1, sizeof *members) : NULL;
    if (st == STRATA_OK && !members)
        st = err_set(STRATA_ENOMEM, "strata_load: out of memory");
    if (st == STRATA_OK)
        st = saved_members(e, all, dir, members);
    for (size_t i = 0; st == STRATA_OK && i < np; i++) {
        const reg_param *p = registry_param(e->reg, (strata_param_id)i);
        if (p->group != members[i]) {
            char name[CKPT_NAME_BYTES];
            ckpt_tensor_name(e, p, "", name);
            st = err_set(STRATA_ECONFIG, "strata_load(\"%s\"): parameter \"%s\" was saved in group \"%s\" and is in "
                         "group \"%s\" here; put every parameter in the group it was trained in", dir, name,
                         opt_groups_name(e->groups, members[i]), opt_groups_name(e->groups, p->group));
        }
    }
    free(members);
    json_decref(all);
    return st;
}

void ckpt_groups_apply(strata_engine *e, const char *text)
{
    json_t *all = text ? json_loads(text, 0, NULL) : NULL;
    strata_group_hparams hp;
    for (size_t g = 0; g < json_array_size(all); g++)
        if (saved_hparams(json_array_get(all, g), g, "", &hp) == STRATA_OK)
            opt_groups_set(e->groups, (strata_group_id)g, &hp); /* checked by ckpt_groups_check */
    json_decref(all);
}
