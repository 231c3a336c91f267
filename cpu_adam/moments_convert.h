/*
 * Runs of Adam moments converted between fp32 and their storage form (strata_moments, the forms of moments.h),
 * outside the Adam step: the initial zeros, checkpoints (which hold the moments as fp32: widened on save, narrowed
 * again on load) and a resume that changes the form.
 *
 * Widening is exact. Narrowing a value that widening made gives its bits back: bf16 rounds to nearest (a widened
 * bf16 has zero low bits: nothing to round), and re-quantizing a dequantized 8-bit block finds the same scale (the
 * element that set it dequantizes to +-1 x scale) and the same codes (each value lies on its code, half a gap from
 * either midpoint); tests/t_moments_convert.c checks both, with zero, NaN and inf blocks. Narrowing other fp32 values
 * (a resume from fp32 moments) rounds bf16 to nearest and quantizes 8-bit blocks as the step does.
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
/* fp32 src into dst in the form (8-bit: and the blocks' scales). */
void moments_narrow(strata_moments form, bool sq, const float *src, size_t n, void *dst, float *scale);

#endif
