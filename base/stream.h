/* Whether what was written to a stdio stream reached the file. fprintf into a buffer succeeds on a full disk; the
 * failure shows only when the buffer is flushed, and a last one only at fclose: the writers whose output a user is
 * pointed at (a trace, a log) ask here instead of trusting their fprintf calls. */
#ifndef STRATA_BASE_STREAM_H
#define STRATA_BASE_STREAM_H

#include <stdio.h>

/* Flushes f; 0 when everything written to it so far has reached the file, else the errno of the failure (EIO when
 * the stream recorded an error whose errno is gone). */
int stream_flush_errno(FILE *f);

/* Flushes and closes f (it is closed whatever happens); 0, or the errno of the first failure among its writes, the
 * flush and the close. */
int stream_close_errno(FILE *f);

#endif
