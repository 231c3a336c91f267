/* strata_convert: bulk dtype conversion with base/half.h's rounding, for callers that see only include/strata.h
 * (the model's host kernels, embedders). */
#include <string.h>

#include "base/error.h"
#include "base/half.h"
#include "strata.h"

/* Elements per unit of work: each unit is one direct, vectorizable loop, and the pair's function is chosen once per
 * unit rather than per element. Below PARALLEL_MIN_ELEMS starting threads costs more than it saves. */
#define CHUNK_ELEMS ((size_t)16384)
#define PARALLEL_MIN_ELEMS ((size_t)65536)

typedef void (*convert_fn)(void *dst, const void *src, size_t n);

static void bf16_to_f32(void *dst, const void *src, size_t n)
{
    float *d = dst;
    const uint16_t *s = src;
    for (size_t i = 0; i < n; i++)
        d[i] = cvt_bf16_to_f32(s[i]);
}

static void fp16_to_f32(void *dst, const void *src, size_t n)
{
    float *d = dst;
    const uint16_t *s = src;
    for (size_t i = 0; i < n; i++)
        d[i] = cvt_fp16_to_f32(s[i]);
}

static void f32_to_bf16(void *dst, const void *src, size_t n)
{
    uint16_t *d = dst;
    const float *s = src;
    for (size_t i = 0; i < n; i++)
        d[i] = cvt_f32_to_bf16(s[i]);
}

static void f32_to_fp16(void *dst, const void *src, size_t n)
{
    uint16_t *d = dst;
    const float *s = src;
    for (size_t i = 0; i < n; i++)
        d[i] = cvt_f32_to_fp16(s[i]);
}

/* Between the two 16-bit types through fp32: widening is exact, so the one narrowing is the only rounding. */
static void bf16_to_fp16(void *dst, const void *src, size_t n)
{
    uint16_t *d = dst;
    const uint16_t *s = src;
    for (size_t i = 0; i < n; i++)
        d[i] = cvt_f32_to_fp16(cvt_bf16_to_f32(s[i]));
}

static void fp16_to_bf16(void *dst, const void *src, size_t n)
{
    uint16_t *d = dst;
    const uint16_t *s = src;
    for (size_t i = 0; i < n; i++)
        d[i] = cvt_f32_to_bf16(cvt_fp16_to_f32(s[i]));
}

/* [dst][src]; the diagonal is a copy, handled before the table is read. */
static const convert_fn convert_table[3][3] = {
    [STRATA_DTYPE_FP32] = {[STRATA_DTYPE_BF16] = bf16_to_f32, [STRATA_DTYPE_FP16] = fp16_to_f32},
    [STRATA_DTYPE_BF16] = {[STRATA_DTYPE_FP32] = f32_to_bf16, [STRATA_DTYPE_FP16] = fp16_to_bf16},
    [STRATA_DTYPE_FP16] = {[STRATA_DTYPE_FP32] = f32_to_fp16, [STRATA_DTYPE_BF16] = bf16_to_fp16},
};

/* The dtypes that store elements: fp32, bf16, fp16 (not none, nor a value outside the enum). */
static strata_status check_dtype(const char *name, strata_dtype dtype)
{
    if (dtype == STRATA_DTYPE_FP32 || dtype == STRATA_DTYPE_BF16 || dtype == STRATA_DTYPE_FP16)
        return STRATA_OK;
    return err_set(STRATA_EINVAL, "strata_convert: %s = %s (%d) stores no elements; allowed: fp32, bf16, fp16", name,
                   strata_dtype_name(dtype), (int)dtype);
}

STRATA_API strata_status strata_convert(void *dst, strata_dtype dst_dtype, const void *src, strata_dtype src_dtype,
                                        size_t count)
{
    ERR_CHECK(check_dtype("dst_dtype", dst_dtype));
    ERR_CHECK(check_dtype("src_dtype", src_dtype));
    if (count > 0 && (!dst || !src))
        return err_set(STRATA_EINVAL, "strata_convert: %s is NULL with count = %zu", !dst ? "dst" : "src", count);
    err_clear();
    if (count == 0)
        return STRATA_OK;
    if (dst_dtype == src_dtype) {
        memmove(dst, src, count * strata_dtype_bytes(src_dtype));
        return STRATA_OK;
    }
    convert_fn fn = convert_table[dst_dtype][src_dtype];
    size_t dst_bytes = strata_dtype_bytes(dst_dtype), src_bytes = strata_dtype_bytes(src_dtype);
    size_t chunks = (count + CHUNK_ELEMS - 1) / CHUNK_ELEMS;
#pragma omp parallel for schedule(static) if (count > PARALLEL_MIN_ELEMS)
    for (size_t c = 0; c < chunks; c++) {
        size_t first = c * CHUNK_ELEMS;
        size_t n = count - first < CHUNK_ELEMS ? count - first : CHUNK_ELEMS;
        fn((char *)dst + first * dst_bytes, (const char *)src + first * src_bytes, n);
    }
    return STRATA_OK;
}
