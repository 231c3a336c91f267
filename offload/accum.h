/* Gradient accumulation: adds a module's gradients, as the device stored them (fp32, bf16 or
 * fp16), into the fp32 gradient store — or stores them when they are the first of the step. */
#ifndef STRATA_OFFLOAD_ACCUM_H
#define STRATA_OFFLOAD_ACCUM_H

#include <stdbool.h>
#include <stddef.h>

#include "strata.h"

/* dst[i] = (overwrite ? 0 : dst[i]) + (float)src[i] for i in [0, n). */
void accum_add(float *dst, const void *src, strata_dtype src_dtype, size_t n, bool overwrite);

#endif
