/*
 * CPU Adam with compressed moments (the forms of moments.h): each step reads m and v in their stored
 * form, widens them to fp32, runs the very update of adam_step_ref() on them (cpu_adam/adam_scalar.h),
 * and narrows them again: bf16 with stochastic rounding per element, 8-bit per block (the whole block is
 * updated in fp32 first, then its scale is taken and it is quantized). Master weights, gradient and the
 * parameter copy are as in adam_arrays (its exp_avg and exp_avg_sq are not used). Every SIMD variant
 * gives the bits of its _ref; the tests check it.
 */
#ifndef STRATA_CPU_ADAM_ADAM_MOMENTS_H
#define STRATA_CPU_ADAM_ADAM_MOMENTS_H

#include "cpu_adam/adam.h"
#include "cpu_adam/moments.h"

/* bf16 moments. key = moments_sr_key(seed, step): a fresh key each step. Element i's bits are drawn for index
 * base + i (base: where element 0 sits in the whole array), so any cut of an array into calls draws the same. */
typedef struct adam_bf16_moments {
    uint16_t *m, *v;
    uint32_t key;
    size_t base;
} adam_bf16_moments;

/* 8-bit moments: one byte per element and one scale per MOMENTS_Q8_BLOCK elements (scale b covers
 * elements [b * MOMENTS_Q8_BLOCK, (b + 1) * MOMENTS_Q8_BLOCK)). */
typedef struct adam_q8_moments {
    uint8_t *m, *v;
    float *m_scale, *v_scale;
} adam_q8_moments;

/* Update elements [begin, end). For q8, begin is a multiple of MOMENTS_Q8_BLOCK, and end is one too
 * unless it is the end of the array. */
typedef void (*adam_step_bf16_fn)(const adam_consts *c, const adam_arrays *a, const adam_bf16_moments *mo,
                                  size_t begin, size_t end);
typedef void (*adam_step_q8_fn)(const adam_consts *c, const adam_arrays *a, const adam_q8_moments *mo,
                                size_t begin, size_t end);

void adam_step_bf16_ref(const adam_consts *c, const adam_arrays *a, const adam_bf16_moments *mo, size_t begin,
                        size_t end);
void adam_step_bf16_avx2(const adam_consts *c, const adam_arrays *a, const adam_bf16_moments *mo, size_t begin,
                         size_t end);
void adam_step_q8_ref(const adam_consts *c, const adam_arrays *a, const adam_q8_moments *mo, size_t begin,
                      size_t end);
void adam_step_q8_avx2(const adam_consts *c, const adam_arrays *a, const adam_q8_moments *mo, size_t begin,
                       size_t end);

#endif
