/* Copies into (and zeroing of) large host buffers with every core: the kernel zeroes each page a first write touches
 * in the touching thread, so one thread filling tens of GB of fresh arrays (the engine's initial state) runs at the
 * rate one core clears pages. */
#ifndef STRATA_BASE_COPY_H
#define STRATA_BASE_COPY_H

#include <stddef.h>

/* memcpy(dst, src, bytes) in 1 MiB pieces over an OpenMP team when bytes is large; the buffers must not overlap. */
void copy_parallel(void *dst, const void *src, size_t bytes);
/* memset(dst, 0, bytes) the same way. */
void zero_parallel(void *dst, size_t bytes);

#endif
