/* "Did you mean": the one rule for how close a misspelt name must be to a known one to be suggested, shared by
 * the config keys (engine/config/config_schema.c) and the command-line options (tools/cmd_train.c). */
#ifndef STRATA_BASE_NEAREST_H
#define STRATA_BASE_NEAREST_H

#include <stdbool.h>
#include <stddef.h>

/* Levenshtein distance of a and b; SIZE_MAX when either is longer than 64 characters (such names are never
 * close to ours). */
size_t nearest_distance(const char *a, const char *b);

/* Whether a known name at distance d from word is close enough to suggest: at most max(2, strlen(word) / 3)
 * edits. */
bool nearest_is_close(const char *word, size_t distance);

#endif
