#include "offload/accum.h"

#include <stdint.h>

#include "base/half.h"

void accum_add(float *dst, const void *src, strata_dtype src_dtype, size_t n, bool overwrite)
{
    /* One pass, vectorised by the compiler; the conversions are the same scalar ones Adam's
     * reference uses, so accumulation is exact in the same way on every path. */
    switch (src_dtype) {
    case STRATA_DTYPE_FP32: {
        const float *s = src;
        if (overwrite)
            for (size_t i = 0; i < n; i++)
                dst[i] = s[i];
        else
            for (size_t i = 0; i < n; i++)
                dst[i] += s[i];
        break;
    }
    case STRATA_DTYPE_BF16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++)
            dst[i] = (overwrite ? 0.0f : dst[i]) + cvt_bf16_to_f32(s[i]);
        break;
    }
    case STRATA_DTYPE_FP16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++)
            dst[i] = (overwrite ? 0.0f : dst[i]) + cvt_fp16_to_f32(s[i]);
        break;
    }
    case STRATA_DTYPE_NONE:
        break;
    }
}
