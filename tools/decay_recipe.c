/* The weight-decay recipe of `strata train` (see decay_recipe.h). */
#include "tools/decay_recipe.h"

#include <stdio.h>

const cli_opt decay_recipe_opts[DECAY_RECIPE_NOPTS] = {
    {.name = "--weight-decay", .kind = CLI_REAL, .offset = offsetof(decay_recipe, weight_decay), .lo = 0, .hi = 1e6,
     .meta = "X", .what = "a weight decay",
     .help = "weight decay in {} (default: the config's optimizer.params.weight_decay, else 0), GPT-2's recipe: X on "
             "every 2-D weight matrix (attention qkv and proj, MLP fc and proj), 0 on biases, LayerNorm weights and "
             "biases and the embeddings; as two optimizer parameter groups, \"decay\" and \"no_decay\" (0: one "
             "group, no decay); AdamW's decoupled decay, or Adam's L2 term with the config's optimizer.type Adam"},
    {.name = "--decay-embeddings", .kind = CLI_SWITCH, .offset = offsetof(decay_recipe, embeddings),
     .help = "with a weight decay: decay the token embedding (tied to the head) and the position embedding too, "
             "as nanoGPT does (every 2-D tensor)"},
};

void decay_recipe_config_init(strata_config *cfg)
{
    cfg->weight_decay = 0.0f;
    cfg->weight_decay_exact = 0.0;
}

bool decay_recipe_settle(decay_recipe *r, strata_config *cfg, char *err, size_t err_bytes)
{
    strata_adam_hparams hp;
    /* The value the engine would run with: the config's double, or a float a caller set. */
    r->config_value = strata_config_adam_hparams(cfg, &hp) == STRATA_OK ? hp.weight_decay : cfg->weight_decay;
    r->from_flag = r->weight_decay >= 0;
    if (!r->from_flag)
        r->weight_decay = r->config_value;
    if (r->embeddings && r->weight_decay == 0) {
        snprintf(err, err_bytes, "--decay-embeddings decays the embeddings by the weight decay, which is 0 here; give "
                 "--weight-decay X (or optimizer.params.weight_decay in the config)");
        return false;
    }
    cfg->weight_decay = (float)r->weight_decay;
    cfg->weight_decay_exact = r->weight_decay;
    return true;
}

bool decay_recipe_on(const decay_recipe *r)
{
    return r->weight_decay > 0;
}

int decay_recipe_module_groups(const gpt_dims *d, int module, const decay_recipe *r, uint32_t *groups)
{
    size_t sizes[GPT_MAX_MODULE_PARAMS];
    int n = gpt_module_param_sizes(d, module, sizes);
    for (int k = 0; k < n; k++)
        groups[k] = !decay_recipe_on(r)                              ? DECAY_GROUP_DEFAULT
                    : gpt_param_decays(d, module, k, r->embeddings) ? DECAY_GROUP_DECAY
                                                                    : DECAY_GROUP_NO_DECAY;
    return n;
}

decay_split decay_recipe_split(const gpt_dims *d, const decay_recipe *r)
{
    decay_split s = {{0, 0}, {0, 0}};
    for (int m = 0; m < gpt_modules(d); m++) {
        size_t sizes[GPT_MAX_MODULE_PARAMS];
        int n = gpt_module_param_sizes(d, m, sizes);
        for (int k = 0; k < n; k++) {
            int other = gpt_param_decays(d, m, k, r->embeddings) ? 0 : 1;
            s.tensors[other]++;
            s.numel[other] += sizes[k];
        }
    }
    return s;
}

void decay_recipe_describe(const gpt_dims *d, const decay_recipe *r, const strata_config *cfg, char *out, size_t len)
{
    char from[160] = "";
    if (r->from_flag && r->config_value > 0 && r->config_value != r->weight_decay)
        snprintf(from, sizeof from, " (--weight-decay; the config's optimizer.params.weight_decay %.6g is overridden)",
                 r->config_value);
    else if (r->from_flag)
        snprintf(from, sizeof from, " (--weight-decay)");
    else if (r->weight_decay > 0)
        snprintf(from, sizeof from, " (the config's optimizer.params.weight_decay)");
    if (!decay_recipe_on(r)) {
        snprintf(out, len, "weight decay 0%s: one parameter group (--weight-decay X decays the 2-D weights)", from);
        return;
    }
    decay_split s = decay_recipe_split(d, r);
    snprintf(out, len,
             "weight decay %.6g%s%s on 2-D weights%s (%zu tensors, %zu params); 0 on biases, norms%s (%zu tensors, "
             "%zu params); parameter groups \"decay\" and \"no_decay\"",
             r->weight_decay, cfg->optimizer == STRATA_OPTIMIZER_ADAM ? " (Adam's L2 term)" : "", from,
             r->embeddings ? " and embeddings" : "", s.tensors[0], s.numel[0], r->embeddings ? "" : ", embeddings",
             s.tensors[1], s.numel[1]);
}
