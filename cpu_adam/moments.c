/*
 * The compressed moment forms (moments.h): the step keys of stochastic rounding, the two 8-bit dynamic
 * maps and their bucket tables, and block quantization in scalar form.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_adam/moments.h"

uint32_t moments_sr_key(uint64_t seed, int64_t step)
{
    uint64_t z = seed + (uint64_t)step * 0x9e3779b97f4a7c15ull + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (uint32_t)(z ^ (z >> 32));
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* The dynamic map of the paper (bitsandbytes' create_dynamic_map with 7 exponent bits, 8 bits in all):
 * for decade e = 0..6 the means of 2^e (signed) or 2^(e+1) (unsigned) equal steps of [0.1, 1], times
 * 10^(e-6), and their negatives when signed; then 0 and 1. 254 + 2 = 256 codes. The means are computed
 * in double and rounded once to fp32. */
static void make_codes(float code[256], bool is_signed)
{
    int n = 0;
    for (int e = 0; e < 7; e++) {
        int count = is_signed ? 1 << e : 1 << (e + 1);
        double scale = pow(10.0, e - 6);
        for (int k = 0; k < count; k++) {
            double lo = 0.1 + 0.9 * k / count, hi = 0.1 + 0.9 * (k + 1) / count;
            code[n++] = (float)(scale * (lo + hi) / 2.0);
            if (is_signed)
                code[n++] = (float)(-scale * (lo + hi) / 2.0);
        }
    }
    code[n++] = 0.0f;
    code[n++] = 1.0f;
    qsort(code, 256, sizeof code[0], cmp_float);
}

static float bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The lowest and highest value of bucket idx (moments.h: negative buckets first, mirrored). The
 * lowest positive bucket reaches down to +0, the highest negative one up to -0. */
static void bucket_range(uint32_t idx, float *lowest, float *highest)
{
    bool neg = idx < MOMENTS_Q8_BUCKETS;
    uint32_t key = neg ? MOMENTS_Q8_BUCKETS - 1 - idx : idx - MOMENTS_Q8_BUCKETS;
    uint32_t bottom = (MOMENTS_Q8_BUCKET_LO + key) << MOMENTS_Q8_BUCKET_SHIFT;
    float small = key == 0 ? 0.0f : bits_float(bottom);
    float large = bits_float(bottom | ((1u << MOMENTS_Q8_BUCKET_SHIFT) - 1));
    *lowest = neg ? -large : small;
    *highest = neg ? -small : large;
}

/* The entry of bucket idx (moments.h): the midpoints below it, and the low bits of the one inside it. */
static uint32_t bucket_entry(const moments_q8_map *map, uint32_t idx)
{
    float lowest, highest;
    bucket_range(idx, &lowest, &highest);
    uint32_t first = 0;
    while (first < 255 && map->mid[first] < lowest)
        first++;
    bool neg = idx < MOMENTS_Q8_BUCKETS;
    uint32_t key = neg ? MOMENTS_Q8_BUCKETS - 1 - idx : idx - MOMENTS_Q8_BUCKETS;
    bool clamped = key == 0 || key == MOMENTS_Q8_BUCKETS - 1;
    bool inside = map->mid[first] < highest;
    /* One compare decides only if the next midpoint lies above the whole bucket; in a clamped bucket the
     * low bits do not order the values, so no midpoint may lie inside. */
    if ((inside && clamped) || (first < 255 && map->mid[first + 1] < highest)) {
        fprintf(stderr, "strata: the 8-bit moment map has a midpoint the bucket search cannot place (bucket %u)\n", idx);
        abort();
    }
    uint32_t low = MOMENTS_Q8_BUCKET_LOW_BITS;
    if (inside) {
        uint32_t bits;
        memcpy(&bits, &map->mid[first], sizeof bits);
        low = (bits & MOMENTS_Q8_BUCKET_LOW_BITS) ^ (neg ? MOMENTS_Q8_BUCKET_LOW_BITS : 0);
    }
    return first | low << 16;
}

static void make_map(moments_q8_map *map, bool is_signed)
{
    make_codes(map->code, is_signed);
    for (int k = 0; k < 255; k++) {
        map->mid[k] = (map->code[k] + map->code[k + 1]) / 2.0f;
        if (map->code[k] == 0.0f)
            map->zero = (uint8_t)k;
    }
    map->mid[255] = INFINITY;
    for (uint32_t idx = 0; idx < 2 * MOMENTS_Q8_BUCKETS; idx++)
        map->bucket[idx] = bucket_entry(map, idx);
}

static moments_q8_map signed_map, unsigned_map;
static pthread_once_t maps_once = PTHREAD_ONCE_INIT;

static void make_maps(void)
{
    make_map(&signed_map, true);
    make_map(&unsigned_map, false);
}

const moments_q8_map *moments_q8_signed(void)
{
    pthread_once(&maps_once, make_maps);
    return &signed_map;
}

const moments_q8_map *moments_q8_unsigned(void)
{
    pthread_once(&maps_once, make_maps);
    return &unsigned_map;
}

uint8_t moments_q8_nearest(const moments_q8_map *map, float y)
{
    uint32_t lo = 0, hi = 255;
    while (lo < hi) {
        uint32_t m = (lo + hi) / 2;
        if (map->mid[m] < y)
            lo = m + 1;
        else
            hi = m;
    }
    return (uint8_t)lo;
}

void moments_q8_quantize_block(const moments_q8_map *map, const float *x, size_t n, uint8_t *q, float *scale)
{
    uint32_t absmax = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t mag;
        memcpy(&mag, &x[i], sizeof mag);
        mag &= 0x7fffffffu;
        absmax = mag > absmax ? mag : absmax;
    }
    float inv;
    if (!moments_q8_scale(absmax, scale, &inv)) {
        memset(q, map->zero, n);
        return;
    }
    for (size_t i = 0; i < n; i++)
        q[i] = moments_q8_nearest(map, x[i] * inv);
}
