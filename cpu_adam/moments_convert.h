/*
 * Runs of Adam moments converted between fp32 and their storage form (strata_moments, the forms of moments.h),
 * outside the Adam step: the initial zeros, checkpoints (which hold the moments as fp32: widened on save, narrowed
 * again on load) and a resume that changes the form.
 *
 * Widening is exact. Narrowing a value that widening made gives it back: bf16 rounds to nearest (a widened bf16 has
 * zero low bits: nothing to round); an 8-bit block is quantized as the step does, and when that does not give every
 * value back (a block whose largest magnitude is negative holds it as code[0] x scale, and the signed map's code[0]
 * is -0.99297, not -1, so its absmax is not its scale) with the scale, recovered from that value, that does. What
 * cannot be recovered is a block whose scale was below FLT_MIN (its values are normalised by 1/FLT_MIN): it is
 * quantized as the step would, and counted. tests/t_moments_convert.c checks all of it, with zero, NaN and inf
 * blocks. Narrowing other fp32 values (a resume from fp32 moments) rounds bf16 to nearest and quantizes 8-bit blocks
 * as the step does.
 */
#ifndef STRATA_CPU_ADAM_MOMENTS_CONVERT_H
#define STRATA_CPU_ADAM_MOMENTS_CONVERT_H

#include <stdbool.h>
#include <stddef.h>

#include "strata.h"

/* Bytes of one stored moment element: 4, 2, 1. */
size_t moments_elem_bytes(strata_moments form);
/* The fp32 block scales one moment array of numel elements has: ceil(numel / MOMENTS_Q8_BLOCK) for 8-bit, else 0. */
size_t moments_scale_count(strata_moments form, size_t numel);

/* n elements of one moment (sq: exp_avg_sq, whose 8-bit form uses the unsigned map), starting at a block boundary:
 * src in the form (8-bit: with its block scales, scale[0] that of the first block) to fp32 dst. */
void moments_widen(strata_moments form, bool sq, const void *src, const float *scale, size_t n, float *dst);
/* fp32 src into dst in the form (8-bit: and the blocks' scales). Returns the 8-bit blocks whose values it could
 * not give back exactly although they might have been made by widening (see above); 0 for the other forms. */
size_t moments_narrow(strata_moments form, bool sq, const float *src, size_t n, void *dst, float *scale);

#endif
