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

void moments_narrow(strata_moments form, bool sq, const float *src, size_t n, void *dst, float *scale)
{
    switch (form) {
    case STRATA_MOMENTS_BF16:
        for (size_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = cvt_f32_to_bf16(src[i]);
        break;
    case STRATA_MOMENTS_8BIT:
        for (size_t b = 0; b < n; b += MOMENTS_Q8_BLOCK)
            moments_q8_quantize_block(q8_map(sq), src + b, n - b < MOMENTS_Q8_BLOCK ? n - b : MOMENTS_Q8_BLOCK,
                                      (uint8_t *)dst + b, &scale[b / MOMENTS_Q8_BLOCK]);
        break;
    default: memmove(dst, src, n * sizeof *src); break;
    }
}
