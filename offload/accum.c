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

/* 64 Ki elements a piece (256 KiB of fp32); below 4 pieces a team costs more than it saves. */
#define PIECE ((size_t)1 << 16)

void accum_add_threads(float *dst, const void *src, strata_dtype src_dtype, size_t n, bool overwrite, int threads)
{
    size_t pieces = (n + PIECE - 1) / PIECE, eb = strata_dtype_bytes(src_dtype);
    if (threads <= 1 || pieces < 4) {
        accum_add(dst, src, src_dtype, n, overwrite);
        return;
    }
#pragma omp parallel for schedule(static) num_threads(threads)
    for (size_t p = 0; p < pieces; p++) {
        size_t first = p * PIECE, count = n - first < PIECE ? n - first : PIECE;
        accum_add(dst + first, (const char *)src + first * eb, src_dtype, count, overwrite);
    }
}
