/* Messages of `strata train` by rank (see train_msg.h). */
#include "tools/train_msg.h"

#include <stdarg.h>
#include <stdio.h>

/* Process-wide on purpose: the CLI trains in one world per process, and every error path, deep in the trainer or
 * in argument checks, must prefix the same way without each caller carrying the rank. */
static int msg_rank, msg_world = 1;

void train_msg_world(int rank, int world)
{
    msg_rank = rank;
    msg_world = world;
}

bool train_msg_root(void)
{
    return msg_rank == 0;
}

static char last_err[1024]; /* the last message, without its prefix: what the other ranks are told */

const char *train_last_error(void)
{
    return last_err;
}

void train_err(const char *fmt, ...)
{
    /* One buffered write per message, so that ranks writing at once do not interleave inside a line. */
    char line[8192];
    int n = msg_world > 1 ? snprintf(line, sizeof line, "rank %d: strata train: ", msg_rank)
                          : snprintf(line, sizeof line, "strata train: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
    fflush(stderr);
    snprintf(last_err, sizeof last_err, "%s", line + n);
}
