/* Which checkpoint a directory on the command line means (see ckpt_locate.h). */
#include "tools/ckpt_locate.h"

const char *ckpt_locate(const char *dir, char *buf, size_t len)
{
    strata_checkpoint_info info;
    /* Only a missing manifest means "not a checkpoint": any other failure belongs to the checkpoint at dir. */
    if (strata_checkpoint_inspect(dir, &info) != STRATA_ENOTFOUND)
        return dir;
    return strata_checkpoint_latest(dir, buf, len) == STRATA_OK ? buf : NULL;
}
