/*
 * The engine's safetensors weights (strata_weights_open) and which parameter loads which tensor
 * (strata_param_load): each loaded parameter's strata_init_fn reads its tensor from its source (weights_source.h)
 * chunk by chunk during finalize. Private to the engine; owned by strata_engine (e->weights, made at the first open).
 */
#ifndef STRATA_ENGINE_WEIGHTS_H
#define STRATA_ENGINE_WEIGHTS_H

#include "strata.h"

typedef struct strata_engine strata_engine;
typedef struct weights_set weights_set;

/* Checks every loaded parameter against its tensor as strata_param_load documents (shape, dtype, numel, the file's
 * size), before finalize writes any state: STRATA_OK when none is loaded; else the first failure, its message naming
 * the parameter, the tensor and the file, and how many others failed too. */
strata_status weights_check(strata_engine *e);
/* After a finalize that read them: closes every file (the tensor lists stay). */
void weights_finalized(weights_set *w);
void weights_destroy(weights_set *w); /* NULL is a no-op */

#endif
