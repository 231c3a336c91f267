/* Write checks of stdio streams (see stream.h). */
#include "base/stream.h"

#include <errno.h>

int stream_flush_errno(FILE *f)
{
    /* After a failed write the stream keeps its error flag and the bytes that failed: the flush tries them again,
     * so errno says why (ENOSPC) rather than what some earlier call left in it. */
    errno = 0;
    if (fflush(f) != 0)
        return errno ? errno : EIO;
    return ferror(f) ? EIO : 0;
}

int stream_close_errno(FILE *f)
{
    int e = stream_flush_errno(f);
    errno = 0;
    if (fclose(f) != 0 && e == 0)
        e = errno ? errno : EIO;
    return e;
}
