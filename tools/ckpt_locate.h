/* Which checkpoint a directory on the command line means, shared by `strata train --resume DIR` and
 * `strata ckpt inspect|verify DIR` so both take what `strata train --save DIR` wrote. */
#ifndef STRATA_TOOLS_CKPT_LOCATE_H
#define STRATA_TOOLS_CKPT_LOCATE_H

#include <stddef.h>

#include "strata.h"

/* What the commands say they expected when ckpt_locate finds nothing. */
#define CKPT_LOCATE_EXPECTED                                                                                         \
    "expected a checkpoint directory (holding manifest.json) or a directory holding checkpoints, such as the DIR "  \
    "that `strata train --save DIR` fills with DIR/step-N"

/* Returns dir itself when it holds a manifest (even a damaged one: inspect and verify report the damage, strata_load
 * refuses it), else buf (len bytes) holding the latest checkpoint under dir (strata_checkpoint_latest), else NULL
 * with strata_last_error(NULL) saying what was looked at. */
const char *ckpt_locate(const char *dir, char *buf, size_t len);

#endif
