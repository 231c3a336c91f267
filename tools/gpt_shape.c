#include "tools/gpt_shape.h"

#include <string.h>

static const gpt_shape presets[] = {
    {"tiny", 2, 2, 64, 256, 64},
    {"124M", 12, 12, 768, 50257, 1024},
    {"350M", 24, 16, 1024, 50257, 1024},
    {"774M", 36, 20, 1280, 50257, 1024},
    {"1.5B", 48, 25, 1600, 50257, 1024},
    {"3B", 32, 32, 2816, 50257, 1024},
};

const gpt_shape *gpt_preset(const char *name)
{
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(presets[i].name, name) == 0)
            return &presets[i];
    return NULL;
}

const char *gpt_preset_names(void)
{
    return "tiny, 124M, 350M, 774M, 1.5B, 3B";
}

int gpt_module_count(const gpt_shape *s)
{
    return s->layers + 2;
}

int gpt_module_params(const gpt_shape *s, int i, size_t *sizes)
{
    size_t h = (size_t)s->hidden;
    if (i == 0) {
        sizes[0] = (size_t)s->vocab * h; /* token embedding, tied to the head */
        sizes[1] = (size_t)s->seq * h;   /* position embedding */
        return 2;
    }
    if (i == s->layers + 1) {
        sizes[0] = h; /* final LayerNorm */
        sizes[1] = h;
        return 2;
    }
    size_t block[] = {h, h, 3 * h * h, 3 * h, h * h, h, h, h, 4 * h * h, 4 * h, 4 * h * h, h};
    memcpy(sizes, block, sizeof block); /* ln1, qkv, attn proj, ln2, fc, fc proj (weights, biases) */
    return (int)(sizeof block / sizeof block[0]);
}

size_t gpt_param_count(const gpt_shape *s)
{
    size_t total = 0, sizes[16];
    for (int i = 0; i < gpt_module_count(s); i++) {
        int n = gpt_module_params(s, i, sizes);
        for (int j = 0; j < n; j++)
            total += sizes[j];
    }
    return total;
}
