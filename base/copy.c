#include "base/copy.h"

#include <string.h>

#define PIECE ((size_t)1 << 20)
#define PARALLEL_MIN ((size_t)4 << 20) /* below this a team costs more than it saves */

/* memcpy from src, or memset to zero where src is NULL, a piece per iteration. */
static void fill(void *dst, const void *src, size_t bytes)
{
    size_t pieces = (bytes + PIECE - 1) / PIECE;
#pragma omp parallel for schedule(static) if (bytes >= PARALLEL_MIN)
    for (size_t p = 0; p < pieces; p++) {
        size_t off = p * PIECE, n = bytes - off < PIECE ? bytes - off : PIECE;
        if (src)
            memcpy((char *)dst + off, (const char *)src + off, n);
        else
            memset((char *)dst + off, 0, n);
    }
}

void copy_parallel(void *dst, const void *src, size_t bytes)
{
    fill(dst, src, bytes);
}

void zero_parallel(void *dst, size_t bytes)
{
    fill(dst, NULL, bytes);
}
