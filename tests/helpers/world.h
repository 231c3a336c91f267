/*
 * What the multi-rank tests (tests/mpi_*.c) share: opening the world with one seed for every rank, each rank's
 * scratch directory next to rank 0's, and the check that every rank holds the same weights.
 */
#ifndef STRATA_TEST_WORLD_H
#define STRATA_TEST_WORLD_H

#include <stddef.h>
#include <stdint.h>

#include "strata.h"

typedef struct {
    strata_comm *comm;
    int rank, size;
    uint64_t seed; /* rank 0's, so every rank trains the same model on the same data */
} t_world;

/* Opens the world of this process (a plain run is a world of one); a failure is a failed check and exits. */
t_world t_world_open(void);

/* This rank's scratch directory, <test>_<size>_r<rank> (its NVMe swap files); *shared gets rank 0's, where
 * the checkpoints of the whole world go. */
const char *t_world_scratch(strata_comm *comm, const char *test, char *shared, size_t shared_bytes);

/* Checks that every rank's weights are bitwise rank 0's (a checksum over the world); names the rank that differs. */
void t_world_agree(strata_comm *comm, const char *what, const float *weights, size_t n);

#endif
