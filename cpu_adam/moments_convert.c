/* Moments between fp32 and their storage form, outside the step; see moments_convert.h. */
#include "cpu_adam/moments_convert.h"

#include <string.h>

#include "base/half.h"
#include "cpu_adam/moments.h"

size_t moments_elem_bytes(strata_moments form)
{
    return form == STRATA_MOMENTS_BF16 ? 2 : form == STRATA_MOMENTS_8BIT ? 1 : 4;
}

size_t moments_scale_count(strata_moments form, size_t numel)
{
    return form == STRATA_MOMENTS_8BIT ? (numel + MOMENTS_Q8_BLOCK - 1) / MOMENTS_Q8_BLOCK : 0;
}

static const moments_q8_map *q8_map(bool sq)
{
    return sq ? moments_q8_unsigned() : moments_q8_signed();
}

void moments_widen(strata_moments form, bool sq, const void *src, const float *scale, size_t n, float *dst)
{
    switch (form) {
    case STRATA_MOMENTS_BF16:
        for (size_t i = 0; i < n; i++)
            dst[i] = cvt_bf16_to_f32(((const uint16_t *)src)[i]);
        break;
    case STRATA_MOMENTS_8BIT: {
        const moments_q8_map *map = q8_map(sq);
        for (size_t i = 0; i < n; i++)
            dst[i] = moments_q8_dequantize(map, ((const uint8_t *)src)[i], scale[i / MOMENTS_Q8_BLOCK]);
        break;
    }
    default: memmove(dst, src, n * sizeof *dst); break;
    }
}

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Quantizes the block x[0, n) at scale s (not necessarily its absmax): true when the codes dequantize to x bit for
 * bit. */
static bool quantize_at(const moments_q8_map *map, const float *x, size_t n, float s, uint8_t *q)
{
    float inv = 1.0f / (s > 0x1p-126f ? s : 0x1p-126f);
    for (size_t i = 0; i < n; i++) {
        q[i] = moments_q8_nearest(map, x[i] * inv);
        if (bits_of(moments_q8_dequantize(map, q[i], s)) != bits_of(x[i]))
            return false;
    }
    return true;
}

/* One block, as the step quantizes it unless that loses values x holds exactly: a block that dequantization made
 * and whose largest magnitude was negative holds it as code[0] x scale, code[0] = -0.99297, so its absmax is not its
 * scale; the scale is then the one a few ulps around |that value| / |code[0]| that gives every value back. Returns
 * false when no scale does (x was not made by dequantization, or its scale was below FLT_MIN). */
static bool narrow_block(const moments_q8_map *map, const float *x, size_t n, uint8_t *q, float *scale)
{
    moments_q8_quantize_block(map, x, n, q, scale);
    /* A NaN block reads back all NaN: nothing finer to keep. quantize_at finds the codes the step found. */
    if (*scale != *scale || quantize_at(map, x, n, *scale, q))
        return true;
    float neg = 0;
    for (size_t i = 0; i < n; i++)
        neg = x[i] < -neg ? -x[i] : neg;
    float s0 = neg / -map->code[0];
    for (int d = -2; d <= 2 && neg > 0; d++) {
        uint32_t b = bits_of(s0) + (uint32_t)d;
        float s;
        memcpy(&s, &b, sizeof s);
        if (s > 0 && quantize_at(map, x, n, s, q)) {
            *scale = s;
            return true;
        }
    }
    moments_q8_quantize_block(map, x, n, q, scale);
    return false;
}

size_t moments_narrow(strata_moments form, bool sq, const float *src, size_t n, void *dst, float *scale)
{
    size_t inexact = 0;
    switch (form) {
    case STRATA_MOMENTS_BF16:
        for (size_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = cvt_f32_to_bf16(src[i]);
        break;
    case STRATA_MOMENTS_8BIT:
        for (size_t b = 0; b < n; b += MOMENTS_Q8_BLOCK)
            inexact += !narrow_block(q8_map(sq), src + b, n - b < MOMENTS_Q8_BLOCK ? n - b : MOMENTS_Q8_BLOCK,
                                     (uint8_t *)dst + b, &scale[b / MOMENTS_Q8_BLOCK]);
        break;
    default: memmove(dst, src, n * sizeof *src); break;
    }
    return inexact;
}
