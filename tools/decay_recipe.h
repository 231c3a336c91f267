/* The weight-decay recipe of `strata train` (GPT-2's): AdamW's weight decay X on every 2-D weight matrix of the blocks
 * (attention qkv and proj, MLP fc and proj), 0 on biases, LayerNorm weights and biases and, unless asked, the
 * embeddings (model/gpt.h, gpt_param_decays). With X > 0 that is two optimizer parameter groups beside the empty
 * "default" one (strata.h, "parameter groups"): "decay" and "no_decay"; with X = 0 the one group "default", as before
 * the recipe. The flags are shared with `strata estimate`, whose layout pads the groups' boundaries as training's
 * does. X comes from --weight-decay, else from the config's optimizer.params.weight_decay, else it is 0. */
#ifndef STRATA_TOOLS_DECAY_RECIPE_H
#define STRATA_TOOLS_DECAY_RECIPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/gpt.h"
#include "strata.h"
#include "tools/options.h"

/* The groups' ids, in the order strata_group_add gives them. */
enum { DECAY_GROUP_DEFAULT = 0, DECAY_GROUP_DECAY = 1, DECAY_GROUP_NO_DECAY = 2, DECAY_GROUPS = 3 };

typedef struct decay_recipe {
    double weight_decay; /* --weight-decay; < 0 until given, then (decay_recipe_settle) the value in force */
    bool embeddings;     /* --decay-embeddings */
    bool from_flag;      /* settled: the value is the flag's (else the config's, or 0) */
    double config_value; /* settled: the config's optimizer.params.weight_decay (0 without a config) */
} decay_recipe;

#define DECAY_RECIPE_INIT {.weight_decay = -1}

/* --weight-decay and --decay-embeddings, into a decay_recipe at base in the command's arguments. */
#define DECAY_RECIPE_NOPTS 2
extern const cli_opt decay_recipe_opts[DECAY_RECIPE_NOPTS];
#define DECAY_RECIPE_GROUP(base) {decay_recipe_opts, DECAY_RECIPE_NOPTS, (base), false, 0, NULL}

/* strata train's default before a config is read: no weight decay (strata_config_init's is DeepSpeed's 0.01). */
void decay_recipe_config_init(strata_config *cfg);

/* After the config was read into cfg: settles r's value (the flag's, else the config's) and writes it into cfg's
 * optimizer.params.weight_decay, which group "default" and the decay group take. false with the reason in err
 * (--decay-embeddings without a weight decay to apply). */
bool decay_recipe_settle(decay_recipe *r, strata_config *cfg, char *err, size_t err_bytes);

/* The recipe makes the two groups (a settled weight decay above 0). */
bool decay_recipe_on(const decay_recipe *r);
/* The group of each parameter of module (DECAY_GROUP_DEFAULT for all when the recipe is off) into groups; returns
 * the count (gpt_module_param_sizes's). */
int decay_recipe_module_groups(const gpt_dims *d, int module, const decay_recipe *r, uint32_t *groups);

/* What the recipe decays and what not: tensors and elements of the decay group ([0]) and of the others ([1]). */
typedef struct decay_split {
    size_t tensors[2], numel[2];
} decay_split;
decay_split decay_recipe_split(const gpt_dims *d, const decay_recipe *r);

/* The header's line: the value and where it came from, which tensors it decays and which not, and the groups. */
void decay_recipe_describe(const gpt_dims *d, const decay_recipe *r, const strata_config *cfg, char *out,
                           size_t len);

#endif
