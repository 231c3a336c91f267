/*
 * Adam with compressed moments, AVX2 + FMA + F16C: 8 elements per iteration, the bits of
 * adam_moments_ref.c. The update itself is avx2_adam_update() (the fp32 kernel's); around it the moments
 * are widened and narrowed as moments.h specifies: bf16 with the hash bits computed on 8 lanes, 8-bit by
 * gathering codes to widen and by the bucket search (one gather of the bucket entry, one integer
 * compare) to narrow. Tails under 8 elements run through the same vector code on zero-padded copies.
 */
#include <string.h>

#include "cpu_adam/adam_moments.h"
#include "cpu_adam/simd_avx2.h"

/* ------------------------------------------------------------------ bf16, stochastic rounding */

/* moments_sr_mix() on 8 lanes, split into the halves that round m (low, zero-extended) and v (high):
 * the last xorshift leaves the high half as it is, so v's bits are the shift itself. */
AVX2_ALWAYS_INLINE void sr_mix(__m256i x, __m256i *for_m, __m256i *for_v)
{
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)0x85ebca6bu));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 13));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)0xc2b2ae35u));
    __m256i high = _mm256_srli_epi32(x, 16);
    *for_m = _mm256_and_si256(_mm256_xor_si256(x, high), _mm256_set1_epi32(0xffff));
    *for_v = high;
}

/* The hash inputs of elements i .. i+7 (moments_sr_bits: the low half of the index plus its key): a lane
 * whose low half wrapped past 2^32 takes the next high half's key. Adding 8 gives the next vector's, up
 * to the next 2^32 boundary. */
AVX2_ALWAYS_INLINE __m256i sr_counter(uint32_t key, size_t i)
{
    uint32_t lo = (uint32_t)i, hi = (uint32_t)((uint64_t)i >> 32);
    __m256i idx = _mm256_add_epi32(_mm256_set1_epi32((int)lo), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i bias = _mm256_set1_epi32(INT32_MIN); /* unsigned compare as signed */
    __m256i wrapped = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(lo ^ 0x80000000u)), _mm256_xor_si256(idx, bias));
    __m256i keys = _mm256_blendv_epi8(_mm256_set1_epi32((int)moments_sr_key_hi(key, hi)),
                                      _mm256_set1_epi32((int)moments_sr_key_hi(key, hi + 1)), wrapped);
    return _mm256_add_epi32(idx, keys);
}

/* One load into both 128-bit halves and one shuffle that puts each value in the high half of its lane: a
 * zero-extension would need a shift after it. */
AVX2_ALWAYS_INLINE __m256 load_bf16(const uint16_t *s)
{
    __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)s));
    __m256i to_high = _mm256_setr_epi8(-1, -1, 0, 1, -1, -1, 2, 3, -1, -1, 4, 5, -1, -1, 6, 7, -1, -1, 8, 9, -1, -1,
                                       10, 11, -1, -1, 12, 13, -1, -1, 14, 15);
    return _mm256_castsi256_ps(_mm256_shuffle_epi8(both, to_high));
}

/* Arrays at element i, the hash inputs `ctr` (sr_counter). */
AVX2_ALWAYS_INLINE void bf16_step8(const adam_consts *c, const adam_arrays *a, const adam_bf16_moments *mo, size_t i,
                                   __m256i ctr, strata_dtype gd, strata_dtype pd, bool l2, bool stream)
{
    __m256 p = _mm256_loadu_ps(a->master + i), m = load_bf16(mo->m + i), v = load_bf16(mo->v + i);
    avx2_adam_update(c, avx2_load_grad(a->grad, gd, i), &p, &m, &v, l2);
    _mm256_storeu_ps(a->master + i, p);
    avx2_store_param(a->param, pd, i, p, stream);
    __m256i rm, rv, m16, v16;
    sr_mix(ctr, &rm, &rv);
    /* A NaN in m or v makes p NaN (the update multiplies by m and divides by sqrt(v)): one compare of p
     * finds the rare vector that needs the NaN rule, which costs six instructions per moment. */
    if (__builtin_expect(_mm256_movemask_ps(_mm256_cmp_ps(p, p, _CMP_UNORD_Q)) != 0, 0)) {
        m16 = avx2_bf16_round(m, rm);
        v16 = avx2_bf16_round(v, rv);
    } else {
        m16 = _mm256_srli_epi32(_mm256_add_epi32(_mm256_castps_si256(m), rm), 16);
        v16 = _mm256_srli_epi32(_mm256_add_epi32(_mm256_castps_si256(v), rv), 16);
    }
    __m256i both = avx2_pack16(m16, v16);
    _mm_storeu_si128((__m128i *)(mo->m + i), _mm256_castsi256_si128(both));
    _mm_storeu_si128((__m128i *)(mo->v + i), _mm256_extracti128_si256(both, 1));
}

AVX2_ALWAYS_INLINE void bf16_run(const adam_consts *c_in, const adam_arrays *a_in, const adam_bf16_moments *mo_in,
                                 size_t begin, size_t end, strata_dtype gd, strata_dtype pd, bool l2)
{
    /* Local copies: the vector stores (may_alias types) could otherwise alias the callers' structs, and
     * every constant and pointer would be loaded again after each store. */
    const adam_consts lc = *c_in, *c = &lc;
    const adam_arrays la = *a_in, *a = &la;
    const adam_bf16_moments lmo = *mo_in, *mo = &lmo;
    bool stream = a->stream_param && adam_arrays_aligned(a, begin, false);
    size_t i = begin;
    while (i + 8 <= end) {
        /* The counter steps by 8 up to the next 2^32 boundary of the drawn index (base + i); a vector across it
         * has its own. */
        uint64_t g = (uint64_t)mo->base + i, gend = (uint64_t)mo->base + end;
        __m256i ctr = sr_counter(mo->key, g);
        uint64_t boundary = ((g >> 32) + 1) << 32;
        size_t stop = (size_t)((g + 8 > boundary ? g + 8 : (boundary < gend ? boundary : gend)) - mo->base);
        for (; i + 8 <= stop; i += 8, ctr = _mm256_add_epi32(ctr, _mm256_set1_epi32(8)))
            bf16_step8(c, a, mo, i, ctr, gd, pd, l2, stream);
    }
    /* Non-temporal stores are weakly ordered: fence them before anyone is told the range is done. */
    if (stream)
        _mm_sfence();
    if (i == end)
        return;
    size_t n = end - i;
    uint16_t m[8] = {0}, v[8] = {0};
    memcpy(m, mo->m + i, n * 2);
    memcpy(v, mo->v + i, n * 2);
    avx2_tail t;
    avx2_tail_load(&t, a, i, n);
    adam_bf16_moments tail_mo = {m, v, mo->key, 0};
    bf16_step8(c, &t.a, &tail_mo, 0, sr_counter(mo->key, mo->base + i), gd, pd, l2, false);
    avx2_tail_store(&t, a, i, n);
    memcpy(mo->m + i, m, n * 2);
    memcpy(mo->v + i, v, n * 2);
}

#define BF16_RUN(G, P, l2) bf16_run(c, a, mo, begin, end, G, P, l2)

void adam_step_bf16_avx2(const adam_consts *c, const adam_arrays *a, const adam_bf16_moments *mo, size_t begin,
                         size_t end)
{
    if (c->use_l2) {
        ADAM_SPECIALISE(a->grad_dtype, a->param_dtype, BF16_RUN, true);
    } else {
        ADAM_SPECIALISE(a->grad_dtype, a->param_dtype, BF16_RUN, false);
    }
}

/* ------------------------------------------------------------------ 8-bit block-wise */

/* The block being updated: its moments in fp32 (widened first, updated in place, quantized last), and
 * the largest bits of the updated ones with the sign cleared, per lane. Three passes rather than one, so
 * that the slow gathers of widening and narrowing do not share the out-of-order window with the update's
 * long sqrt and division chain (b_adam_moments: widening inside the update pass is 10% slower). The four
 * gathers per 8 elements bound this step: on a Zen 3 one 8-lane gather alone takes about 70% of the time
 * the whole fp32 step takes for 8 elements (benchmarks/RESULTS.md, "Compressed moments: kernel speed"). */
typedef struct q8_block {
    float *m, *v;
    __m256i m_max, v_max;
} q8_block;

AVX2_ALWAYS_INLINE __m256 dequantize8(const moments_q8_map *map, const uint8_t *q, __m256 scale)
{
    __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q));
    return _mm256_mul_ps(_mm256_i32gather_ps(map->code, idx, 4), scale);
}

/* Widens n codes to out[0 .. n rounded up to 8) (the padding lanes read the map's zero). */
AVX2_ALWAYS_INLINE void dequantize_block(const moments_q8_map *map, const uint8_t *q, size_t n, float scale, float *out)
{
    __m256 s = _mm256_set1_ps(scale);
    size_t k = 0;
    for (; k + 8 <= n; k += 8)
        _mm256_storeu_ps(out + k, dequantize8(map, q + k, s));
    if (k < n) {
        uint8_t pad[8];
        memset(pad, map->zero, sizeof pad);
        memcpy(pad, q + k, n - k);
        _mm256_storeu_ps(out + k, dequantize8(map, pad, s));
    }
}

AVX2_ALWAYS_INLINE __m256i abs_bits(__m256 x, __m256i valid)
{
    return _mm256_and_si256(_mm256_castps_si256(x), _mm256_and_si256(valid, _mm256_set1_epi32(0x7fffffff)));
}

/* Element i of the arrays, element k of the block; lanes outside `valid` do not count for the scale. */
AVX2_ALWAYS_INLINE void q8_update8(const adam_consts *c, const adam_arrays *a, q8_block *b, size_t i, size_t k,
                                   __m256i valid, strata_dtype gd, strata_dtype pd, bool l2, bool stream)
{
    __m256 p = _mm256_loadu_ps(a->master + i), m = _mm256_loadu_ps(b->m + k), v = _mm256_loadu_ps(b->v + k);
    avx2_adam_update(c, avx2_load_grad(a->grad, gd, i), &p, &m, &v, l2);
    _mm256_storeu_ps(a->master + i, p);
    avx2_store_param(a->param, pd, i, p, stream);
    _mm256_storeu_ps(b->m + k, m);
    _mm256_storeu_ps(b->v + k, v);
    b->m_max = _mm256_max_epu32(b->m_max, abs_bits(m, valid));
    b->v_max = _mm256_max_epu32(b->v_max, abs_bits(v, valid));
}

/* moments_q8_nearest_fast() on 8 lanes, packed to 8 bytes. */
AVX2_ALWAYS_INLINE __m128i quantize8(const moments_q8_map *map, __m256 y)
{
    __m256i u = _mm256_castps_si256(y);
    __m256i mag = _mm256_srli_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), MOMENTS_Q8_BUCKET_SHIFT);
    mag = _mm256_min_epi32(_mm256_max_epi32(mag, _mm256_set1_epi32(MOMENTS_Q8_BUCKET_LO)),
                           _mm256_set1_epi32(MOMENTS_Q8_BUCKET_HI));
    __m256i key = _mm256_sub_epi32(mag, _mm256_set1_epi32(MOMENTS_Q8_BUCKET_LO));
    __m256i neg = _mm256_srai_epi32(u, 31);
    __m256i idx = _mm256_blendv_epi8(_mm256_add_epi32(key, _mm256_set1_epi32(MOMENTS_Q8_BUCKETS)),
                                     _mm256_sub_epi32(_mm256_set1_epi32(MOMENTS_Q8_BUCKETS - 1), key), neg);
    __m256i entry = _mm256_i32gather_epi32((const int *)map->bucket, idx, 4);
    __m256i low_bits = _mm256_set1_epi32(MOMENTS_Q8_BUCKET_LOW_BITS);
    __m256i low = _mm256_xor_si256(_mm256_and_si256(u, low_bits), _mm256_and_si256(neg, low_bits));
    __m256i above = _mm256_cmpgt_epi32(low, _mm256_srli_epi32(entry, 16));
    __m256i q = _mm256_sub_epi32(_mm256_and_si256(entry, _mm256_set1_epi32(0xff)), above);
    __m256i w = _mm256_packus_epi32(q, q);                 /* per 128-bit lane: q0..3 q0..3 | q4..7 q4..7 */
    __m256i bytes = _mm256_packus_epi16(w, w);              /* bytes 0..3 of each lane: q0..3 | q4..7 */
    return _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4)));
}

static uint32_t hmax_epu32(__m256i x)
{
    uint32_t lanes[8], best = 0;
    _mm256_storeu_si256((__m256i *)lanes, x);
    for (int k = 0; k < 8; k++)
        best = lanes[k] > best ? lanes[k] : best;
    return best;
}

/* moments_q8_quantize_block() given the block's largest bits (x is padded to a multiple of 8). */
AVX2_ALWAYS_INLINE void quantize_block(const moments_q8_map *map, const float *x, size_t n, uint32_t absmax, uint8_t *q,
                                       float *scale_out)
{
    float inv;
    if (!moments_q8_scale(absmax, scale_out, &inv)) {
        memset(q, map->zero, n);
        return;
    }
    __m256 vinv = _mm256_set1_ps(inv);
    size_t k = 0;
    for (; k + 8 <= n; k += 8)
        _mm_storel_epi64((__m128i *)(q + k), quantize8(map, _mm256_mul_ps(_mm256_loadu_ps(x + k), vinv)));
    if (k < n) {
        uint8_t out[8];
        _mm_storel_epi64((__m128i *)out, quantize8(map, _mm256_mul_ps(_mm256_loadu_ps(x + k), vinv)));
        memcpy(q + k, out, n - k);
    }
}

/* The last (under 8) elements of a block, through q8_update8 on zero-padded copies of the arrays (the
 * block buffers have room for 8). */
AVX2_ALWAYS_INLINE void q8_tail(const adam_consts *c, const adam_arrays *a, q8_block *b, size_t i, size_t k, size_t n,
                                strata_dtype gd, strata_dtype pd, bool l2)
{
    avx2_tail t;
    avx2_tail_load(&t, a, i, n);
    __m256i valid = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    q8_update8(c, &t.a, b, 0, k, valid, gd, pd, l2, false);
    avx2_tail_store(&t, a, i, n);
}

AVX2_ALWAYS_INLINE void q8_run(const adam_consts *c_in, const adam_arrays *a_in, const adam_q8_moments *mo_in,
                               size_t begin, size_t end, strata_dtype gd, strata_dtype pd, bool l2)
{
    const adam_consts lc = *c_in, *c = &lc; /* local copies, as in bf16_run */
    const adam_arrays la = *a_in, *a = &la;
    const adam_q8_moments lmo = *mo_in, *mo = &lmo;
    const moments_q8_map *sm = moments_q8_signed(), *um = moments_q8_unsigned();
    bool stream = a->stream_param && adam_arrays_aligned(a, begin, false);
    _Alignas(32) float m[MOMENTS_Q8_BLOCK], v[MOMENTS_Q8_BLOCK];
    __m256i all = _mm256_set1_epi32(-1);
    for (size_t start = begin; start < end; start += MOMENTS_Q8_BLOCK) {
        size_t n = end - start < MOMENTS_Q8_BLOCK ? end - start : MOMENTS_Q8_BLOCK, blk = start / MOMENTS_Q8_BLOCK;
        q8_block b = {m, v, _mm256_setzero_si256(), _mm256_setzero_si256()};
        dequantize_block(sm, mo->m + start, n, mo->m_scale[blk], m);
        dequantize_block(um, mo->v + start, n, mo->v_scale[blk], v);
        size_t k = 0;
        for (; k + 8 <= n; k += 8)
            q8_update8(c, a, &b, start + k, k, all, gd, pd, l2, stream);
        if (k < n)
            q8_tail(c, a, &b, start + k, k, n - k, gd, pd, l2);
        quantize_block(sm, m, n, hmax_epu32(b.m_max), mo->m + start, &mo->m_scale[blk]);
        quantize_block(um, v, n, hmax_epu32(b.v_max), mo->v + start, &mo->v_scale[blk]);
    }
    if (stream)
        _mm_sfence();
}

#define Q8_RUN(G, P, l2) q8_run(c, a, mo, begin, end, G, P, l2)

void adam_step_q8_avx2(const adam_consts *c, const adam_arrays *a, const adam_q8_moments *mo, size_t begin,
                       size_t end)
{
    if (c->use_l2) {
        ADAM_SPECIALISE(a->grad_dtype, a->param_dtype, Q8_RUN, true);
    } else {
        ADAM_SPECIALISE(a->grad_dtype, a->param_dtype, Q8_RUN, false);
    }
}
