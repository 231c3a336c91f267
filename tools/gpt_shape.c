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

const cli_opt gpt_shape_opts[GPT_SHAPE_NOPTS] = {
    {.name = "--layers", .kind = CLI_INT, .offset = offsetof(gpt_shape, layers), .lo = 1, .hi = 4096, .meta = "N",
     .help = "transformer blocks, {}"},
    {.name = "--heads", .kind = CLI_INT, .offset = offsetof(gpt_shape, heads), .lo = 1, .hi = 1024, .meta = "N",
     .help = "attention heads, {}; they divide --hidden"},
    {.name = "--hidden", .kind = CLI_INT, .offset = offsetof(gpt_shape, hidden), .lo = 1, .hi = 65536, .meta = "N",
     .help = "the model's width, {}"},
    {.name = "--vocab", .kind = CLI_INT, .offset = offsetof(gpt_shape, vocab), .lo = 256, .hi = 1 << 22, .meta = "N",
     .help = "vocabulary size, {} (the byte-level tokens need 256)"},
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
    return GPT_PRESET_NAMES;
}

gpt_dims gpt_shape_dims(const gpt_shape *s)
{
    return (gpt_dims){.layers = s->layers, .heads = s->heads, .hidden = s->hidden, .vocab = s->vocab, .seq = s->seq};
}

/* The parameter layout itself lives with the model (model/gpt_layout.c), so estimate and train agree. */
int gpt_module_count(const gpt_shape *s)
{
    gpt_dims d = gpt_shape_dims(s);
    return gpt_modules(&d);
}

int gpt_module_params(const gpt_shape *s, int i, size_t *sizes)
{
    gpt_dims d = gpt_shape_dims(s);
    return gpt_module_param_sizes(&d, i, sizes);
}

size_t gpt_param_count(const gpt_shape *s)
{
    gpt_dims d = gpt_shape_dims(s);
    return gpt_numel(&d);
}
