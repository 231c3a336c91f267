#include "engine/config/config_report.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* Room kept at the end of the caller's buffer for the closing line of a list that does not fit. */
#define TAIL_BYTES 64

void cfg_report_init(cfg_report *r, char *buf, size_t len)
{
    r->buf = buf;
    r->len = buf ? len : 0;
    r->used = 0;
    r->count = 0;
    r->dropped = 0;
    r->first[0] = '\0';
    if (r->buf && r->len)
        r->buf[0] = '\0';
}

/* Writes the closing line after the lines shown; rewritten with the new count as more are dropped, so the
 * buffer reads well whenever the caller stops. */
static void write_tail(cfg_report *r)
{
    const char *sep = r->used ? "\n" : "";
    snprintf(r->buf + r->used, r->len - r->used, "%sconfig: ... and %d more problem%s", sep, r->dropped,
             r->dropped == 1 ? "" : "s");
}

void cfg_report_add(cfg_report *r, const char *fmt, ...)
{
    char line[ERR_MSG_BYTES - 16];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (r->count == 0)
        snprintf(r->first, sizeof r->first, "config: %s", line);
    r->count++;
    if (!r->buf || !r->len)
        return;
    /* Whole lines only: a line is shown when it fits with room left for the closing line; once one does not, it
     * and every later one are counted in the closing "... and N more" (so what is shown keeps the order found). */
    size_t need = (r->used ? 1 : 0) + strlen("config: ") + strlen(line);
    bool fits = r->dropped == 0 && r->used + need + TAIL_BYTES < r->len;
    if (fits) {
        snprintf(r->buf + r->used, r->len - r->used, "%sconfig: %s", r->used ? "\n" : "", line);
        r->used += need;
        return;
    }
    r->dropped++;
    write_tail(r);
}

strata_status cfg_report_finish(cfg_report *r, strata_status status)
{
    if (r->count == 0)
        return STRATA_OK;
    if (r->count == 1)
        return err_set(status, "%s", r->first);
    return err_set(status, "%s (and %d more problem%s)", r->first, r->count - 1, r->count == 2 ? "" : "s");
}
