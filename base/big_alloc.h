/* Large arrays on 2 MiB boundaries with transparent huge pages asked for. Adam streams five arrays of the state at
 * once: with 4 KiB pages the TLB misses cost it about a fifth of its rate (issue 22: strata's step over its own
 * arrays against the same kernel over madvised ones), and where THP is "madvise" (Debian's default) only memory
 * that asks gets huge pages. Free with free(). */
#ifndef STRATA_BASE_BIG_ALLOC_H
#define STRATA_BASE_BIG_ALLOC_H

#include <stdlib.h>
#include <sys/mman.h>

#define BIG_ALLOC_PAGE ((size_t)2 << 20)

/* bytes (rounded up to 2 MiB) aligned to 2 MiB, huge pages asked for; NULL when out of memory. */
static inline void *big_alloc(size_t bytes)
{
    bytes = (bytes ? bytes + BIG_ALLOC_PAGE - 1 : BIG_ALLOC_PAGE) / BIG_ALLOC_PAGE * BIG_ALLOC_PAGE;
    void *p = aligned_alloc(BIG_ALLOC_PAGE, bytes);
    if (p)
        (void)madvise(p, bytes, MADV_HUGEPAGE); /* advice: a kernel without THP leaves normal pages */
    return p;
}

#endif
