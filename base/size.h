/* Byte sizes as people write them: 4096, "512MiB", "8GiB", "1.5TB". */
#ifndef STRATA_BASE_SIZE_H
#define STRATA_BASE_SIZE_H

#include <stdbool.h>
#include <stddef.h>

/* Parses a size string. Binary units (KiB, MiB, GiB, TiB, also K, M, G, T) are powers of 1024,
 * decimal ones (kB/KB, MB, GB, TB) powers of 1000; "B" or no unit means bytes; a fraction is
 * allowed when the result is a whole number of bytes. Case-insensitive units, optional space.
 * Returns false on anything else (including overflow and negatives). */
bool size_parse(const char *text, size_t *out);

/* Formats bytes compactly with a binary unit: "512 B", "1.50 GiB". Returns buf. */
const char *size_format(size_t bytes, char *buf, size_t len);

#endif
