/*
 * Proves that strata_convert, the public bulk conversion, gives base/half.h's bits for every pair of fp32, bf16 and
 * fp16 on random bit patterns (NaNs, infinities and subnormals included), both below and above the count at which it
 * goes parallel and at counts that end inside a unit of work; that equal dtypes copy, overlapping regions included;
 * and that a dtype that stores no elements or a NULL buffer is STRATA_EINVAL with a message that names it.
 */
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "testlib.h"

/* One element of dtype at index i, widened to fp32 by base/half.h (exact). */
static float widen(const void *p, strata_dtype dtype, size_t i)
{
    switch (dtype) {
    case STRATA_DTYPE_BF16: return cvt_bf16_to_f32(((const uint16_t *)p)[i]);
    case STRATA_DTYPE_FP16: return cvt_fp16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

/* The bits base/half.h gives for element i of src converted to dst_dtype. */
static uint32_t spec_bits(const void *src, strata_dtype src_dtype, strata_dtype dst_dtype, size_t i)
{
    if (src_dtype == dst_dtype)
        return src_dtype == STRATA_DTYPE_FP32 ? ((const uint32_t *)src)[i] : ((const uint16_t *)src)[i];
    float f = widen(src, src_dtype, i);
    switch (dst_dtype) {
    case STRATA_DTYPE_BF16: return cvt_f32_to_bf16(f);
    case STRATA_DTYPE_FP16: return cvt_f32_to_fp16(f);
    default: return cvt_f32_bits(f);
    }
}

static uint32_t bits_at(const void *p, strata_dtype dtype, size_t i)
{
    return dtype == STRATA_DTYPE_FP32 ? ((const uint32_t *)p)[i] : ((const uint16_t *)p)[i];
}

static const strata_dtype dtypes[] = {STRATA_DTYPE_FP32, STRATA_DTYPE_BF16, STRATA_DTYPE_FP16};

static void check_pair(strata_dtype dst_dtype, strata_dtype src_dtype, size_t count)
{
    void *src = malloc(count * 4 + 4), *dst = malloc(count * 4 + 4);
    t_rand_bytes(src, count * strata_dtype_bytes(src_dtype));
    T_OK(strata_convert(dst, dst_dtype, src, src_dtype, count));
    size_t wrong = 0, first = 0;
    for (size_t i = 0; i < count; i++)
        if (bits_at(dst, dst_dtype, i) != spec_bits(src, src_dtype, dst_dtype, i) && wrong++ == 0)
            first = i;
    T_CHECK(wrong == 0, "strata_convert %s -> %s, %zu elements: %zu differ from base/half.h; first [%zu]: 0x%x -> 0x%x, "
            "base/half.h 0x%x", strata_dtype_name(src_dtype), strata_dtype_name(dst_dtype), count, wrong, first,
            bits_at(src, src_dtype, first), bits_at(dst, dst_dtype, first), spec_bits(src, src_dtype, dst_dtype, first));
    free(src);
    free(dst);
}

static void check_overlapping_copy(void)
{
    uint16_t buf[64], want[64];
    for (int i = 0; i < 64; i++)
        buf[i] = (uint16_t)(i * 977);
    memcpy(want, buf, sizeof buf);
    T_OK(strata_convert(buf + 8, STRATA_DTYPE_BF16, buf, STRATA_DTYPE_BF16, 48));
    T_CHECK(memcmp(buf + 8, want, 48 * sizeof *buf) == 0, "an overlapping bf16 copy moved the elements as memmove does");
}

static void check_errors(void)
{
    float f = 1.0f;
    uint16_t h = 0;
    T_STATUS(strata_convert(&h, STRATA_DTYPE_NONE, &f, STRATA_DTYPE_FP32, 1), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "strata_convert: dst_dtype = none (3) stores no elements; allowed: fp32");
    T_STATUS(strata_convert(&f, STRATA_DTYPE_FP32, &h, (strata_dtype)7, 1), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "strata_convert: src_dtype = ? (7) stores no elements");
    T_STATUS(strata_convert(NULL, STRATA_DTYPE_BF16, &f, STRATA_DTYPE_FP32, 1), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "strata_convert: dst is NULL with count = 1");
    T_OK(strata_convert(NULL, STRATA_DTYPE_BF16, NULL, STRATA_DTYPE_FP32, 0));
    T_EQ_STR(strata_last_error(NULL), "");
}

int main(void)
{
    t_rng_seed();
    /* Below the parallel threshold, at one unit of work and a tail, and well above it with a ragged end. */
    const size_t counts[] = {1, 1000, 16384 + 3, 300007};
    for (size_t d = 0; d < 3; d++)
        for (size_t s = 0; s < 3; s++)
            for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
                check_pair(dtypes[d], dtypes[s], counts[c]);
    check_overlapping_copy();
    check_errors();
    return t_done();
}
