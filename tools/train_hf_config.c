/* The heads of a GPT-2 from the config.json beside its weights (train_hf_config.h). */
#include "tools/train_hf_config.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* The directory holding weights_path's files, into out. */
static void weights_dir(const char *weights_path, char *out, size_t len)
{
    struct stat sb;
    if (stat(weights_path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(out, len, "%s", weights_path);
        return;
    }
    const char *slash = strrchr(weights_path, '/');
    if (!slash)
        snprintf(out, len, ".");
    else
        snprintf(out, len, "%.*s", (int)(slash - weights_path == 0 ? 1 : slash - weights_path), weights_path);
}

hf_heads_verdict hf_config_check_heads(const char *weights_path, int heads, char *config_path, size_t path_len,
                                       char *why, size_t why_len)
{
    char dir[4096];
    weights_dir(weights_path, dir, sizeof dir);
    snprintf(config_path, path_len, "%s/config.json", dir);
    why[0] = '\0';
    json_error_t err;
    json_t *root = json_load_file(config_path, 0, &err);
    if (!root)
        return HF_HEADS_UNCHECKED;
    /* GPT2Config calls it n_head; num_attention_heads is its attribute map's name for it, as other configs write */
    json_t *n = json_object_get(root, "n_head");
    if (!json_is_integer(n))
        n = json_object_get(root, "num_attention_heads");
    hf_heads_verdict v = HF_HEADS_UNCHECKED;
    if (json_is_integer(n)) {
        long long file = json_integer_value(n);
        v = file == heads ? HF_HEADS_AGREE : HF_HEADS_DIFFER;
        if (v == HF_HEADS_DIFFER)
            snprintf(why, why_len, "%s says the model has %lld attention heads, the run %d; set --heads %lld (the "
                     "tensors' shapes do not depend on it, so only the config can tell)", config_path, file, heads,
                     file);
    }
    json_decref(root);
    return v;
}
