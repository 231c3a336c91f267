/* Small helpers every layer uses: array length, min/max, alignment, monotonic time. */
#ifndef STRATA_BASE_UTIL_H
#define STRATA_BASE_UTIL_H

#include <stddef.h>
#include <stdint.h>
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

#endif
