/* Small helpers every layer uses: array length, min/max, alignment, monotonic time, growing arrays. */
#ifndef STRATA_BASE_UTIL_H
#define STRATA_BASE_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

static inline size_t align_up(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

static inline int is_aligned(uint64_t x, uint64_t a)
{
    return x % a == 0;
}

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Grows *arr (of *cap elements of elem bytes, doubling from 16) to hold at least need; false when out of
 * memory (the array is unchanged then). */
static inline bool array_grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t ncap = *cap ? *cap * 2 : 16;
    while (ncap < need)
        ncap *= 2;
    void *n = realloc(*arr, ncap * elem);
    if (!n)
        return false;
    *arr = n;
    *cap = ncap;
    return true;
}

#endif
