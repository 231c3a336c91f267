/* Gradient accumulation: adds a module's gradients, as the device stored them (fp32, bf16 or
 * fp16), into the fp32 gradient store — or stores them when they are the first of the step. */
#ifndef STRATA_OFFLOAD_ACCUM_H
#define STRATA_OFFLOAD_ACCUM_H

#include <stdbool.h>
#include <stddef.h>

#include "strata.h"

/* dst[i] = (overwrite ? 0 : dst[i]) + (float)src[i] for i in [0, n). */
void accum_add(float *dst, const void *src, strata_dtype src_dtype, size_t n, bool overwrite);
/* The same over an OpenMP team of `threads` (1: accum_add itself), in pieces: bit-identical, as each element is
 * summed alone. For hand-offs that one thread cannot keep up with (a GPU's backward outruns one core's bf16 to fp32
 * additions: 2 G elements/s, about 3 s of a 6.65B step). */
void accum_add_threads(float *dst, const void *src, strata_dtype src_dtype, size_t n, bool overwrite, int threads);

#endif
