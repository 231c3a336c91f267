/* GPT-2 style model shapes: the presets and the parameter list of each module, so that
 * `strata estimate` (and later `strata train`) describe the same model. */
#ifndef STRATA_TOOLS_GPT_SHAPE_H
#define STRATA_TOOLS_GPT_SHAPE_H

#include <stdbool.h>
#include <stddef.h>

typedef struct gpt_shape {
    const char *name;
    int layers, heads, hidden, vocab, seq;
} gpt_shape;

/* The preset called name ("tiny", "124M", "350M", "774M", "1.5B", "3B"), or NULL. */
const gpt_shape *gpt_preset(const char *name);
/* "tiny, 124M, 350M, 774M, 1.5B, 3B" for messages. */
const char *gpt_preset_names(void);

/* Modules: 0 = embeddings (token + position), 1..layers = blocks, layers+1 = final LayerNorm. */
int gpt_module_count(const gpt_shape *s);
/* The parameter sizes of module i into sizes (at most 16); returns their count. */
int gpt_module_params(const gpt_shape *s, int i, size_t *sizes);
/* Total parameters (unpadded). */
size_t gpt_param_count(const gpt_shape *s);

#endif
