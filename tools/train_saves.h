/*
 * The checkpoints of one `strata train --save ROOT` run: the root checked, locked for the run and cleaned of
 * interrupted saves' staging directories before the first step (engine/ckpt/ckpt_root.h), then ROOT/step-N saves
 * with keep-last-N rotation.
 *
 * A full disk does not end the run: a save that fails with no space left warns (the step, the free space), leaves
 * the previous checkpoint as it was (strata_save removes its partial temporary), and training goes on; the next save
 * tries again. The run then exits 1 with a line that names the failed saves, so that a job scheduler sees that the
 * checkpoints it expects are missing. Any other save failure ends the run as before (exit 1).
 */
#ifndef STRATA_TOOLS_TRAIN_SAVES_H
#define STRATA_TOOLS_TRAIN_SAVES_H

#include <stdint.h>

#include "strata.h"

#define TRAIN_SAVES_LISTED 8 /* failed steps named in the summary */

typedef struct train_saves {
    const char *root;          /* NULL: the run saves nothing */
    int keep;
    int lock_fd;               /* rank 0's lock on root, or -1 */
    int attempts, failed;      /* saves tried, and those that found the disk full */
    int64_t failed_steps[TRAIN_SAVES_LISTED];
    int64_t last_saved;        /* the step of the last checkpoint written, or -1 */
} train_saves;

/* Checks root on every rank of comm, and on rank 0 locks it and removes stale staging directories; every rank
 * learns whether all succeeded. root NULL: nothing to do. Returns 0 or the exit code (2: the root cannot be used or
 * another run holds it), having printed why. */
int train_saves_open(train_saves *sv, const char *root, int keep, strata_comm *comm);
/* Saves root/step-<step> and rotates. STRATA_OK also when the disk was full (warned and counted, see above);
 * any other failure is returned, having been printed. */
strata_status train_saves_save(train_saves *sv, strata_engine *e, int64_t step);
/* Releases the lock; prints the summary of failed saves (rank 0) and returns 1 when any failed, else 0. */
int train_saves_close(train_saves *sv);

#endif
