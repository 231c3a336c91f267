/* Edit distance and the closeness rule of "did you mean" (see nearest.h). */
#include "base/nearest.h"

#include <stdint.h>
#include <string.h>

#include "base/util.h"

size_t nearest_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64)
        return SIZE_MAX;
    size_t row[65];
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            row[j] = MIN(MIN(row[j] + 1, row[j - 1] + 1), diag + cost);
            diag = up;
        }
    }
    return row[lb];
}

bool nearest_is_close(const char *word, size_t distance)
{
    return distance <= MAX((size_t)2, strlen(word) / 3);
}
