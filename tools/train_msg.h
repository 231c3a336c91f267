/* Who speaks in `strata train` when it runs as a world of ranks (mpirun -np N): rank 0 prints the header,
 * progress and summary; every rank prints its own errors, prefixed "rank R: " when the world has more than one
 * rank, so that interleaved lines on a shared terminal say where they come from. World 1 prints as it always did. */
#ifndef STRATA_TOOLS_TRAIN_MSG_H
#define STRATA_TOOLS_TRAIN_MSG_H

#include <stdbool.h>

/* This process's place in the world; before it is called, the process counts as rank 0 of 1. */
void train_msg_world(int rank, int world);
/* Whether this rank prints what is not an error (rank 0). */
bool train_msg_root(void);
/* "[rank R: ]strata train: <message>\n" to stderr. */
void train_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The last train_err message, without the prefix ("" when none). */
const char *train_last_error(void);

#endif
