/* GPT-2 style model shapes: the presets by name, and the parameter list of each module (from the model's
 * own layout in model/gpt.h), so that `strata estimate` and `strata train` describe the same model. */
#ifndef STRATA_TOOLS_GPT_SHAPE_H
#define STRATA_TOOLS_GPT_SHAPE_H

#include <stdbool.h>
#include <stddef.h>

#include "model/gpt.h"
#include "tools/options.h"

typedef struct gpt_shape {
    const char *name;
    int layers, heads, hidden, vocab, seq;
} gpt_shape;

/* The model-shape options of every command that takes a shape (train, estimate), defined once: --layers, --heads,
 * --hidden and --vocab, into the fields of a gpt_shape at base in the command's arguments (0 = not given). */
#define GPT_SHAPE_NOPTS 4
extern const cli_opt gpt_shape_opts[GPT_SHAPE_NOPTS];
#define GPT_SHAPE_GROUP(base) {gpt_shape_opts, GPT_SHAPE_NOPTS, (base), false, 0, NULL}
/* The context length, into gpt_shape.seq at base, under the name the command gives it: `strata train --context`
 * (its --seq is the tokens of a sequence), `strata estimate --seq` (its --seq-len is). */
#define GPT_SHAPE_CONTEXT_OPT(flag, base)                                                                       \
    {.name = (flag), .kind = CLI_INT, .offset = (base) + offsetof(gpt_shape, seq), .lo = 1, .hi = 1 << 20,      \
     .meta = "N", .help = "the model's context length in tokens, {}"}

/* The preset called name ("tiny", "124M", "350M", "774M", "1.5B", "3B"), or NULL. */
const gpt_shape *gpt_preset(const char *name);
/* "tiny, 124M, 350M, 774M, 1.5B, 3B" for messages and --help. */
#define GPT_PRESET_NAMES "tiny, 124M, 350M, 774M, 1.5B, 3B"
const char *gpt_preset_names(void);
/* The model's dimensions of a shape. */
gpt_dims gpt_shape_dims(const gpt_shape *s);

/* Modules: 0 = embeddings (token + position), 1..layers = blocks, layers+1 = final LayerNorm. */
int gpt_module_count(const gpt_shape *s);
/* The parameter sizes of module i into sizes (at most GPT_MAX_MODULE_PARAMS = 12); returns their count. */
int gpt_module_params(const gpt_shape *s, int i, size_t *sizes);
/* Total parameters (unpadded). */
size_t gpt_param_count(const gpt_shape *s);

#endif
