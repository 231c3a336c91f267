#include "engine/config/config_report.h"

#include <stdarg.h>
#include <stdio.h>

void cfg_report_init(cfg_report *r, char *buf, size_t len)
{
    r->buf = buf;
    r->len = buf ? len : 0;
    r->used = 0;
    r->count = 0;
    r->first[0] = '\0';
    if (r->buf && r->len)
        r->buf[0] = '\0';
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
    if (r->buf && r->used < r->len) {
        int n = snprintf(r->buf + r->used, r->len - r->used, "%sconfig: %s", r->used ? "\n" : "", line);
        if (n > 0)
            r->used += (size_t)n;
        if (r->used >= r->len)
            r->used = r->len;
    }
}

strata_status cfg_report_finish(cfg_report *r, strata_status status)
{
    if (r->count == 0)
        return STRATA_OK;
    if (r->count == 1)
        return err_set(status, "%s", r->first);
    return err_set(status, "%s (and %d more problem%s)", r->first, r->count - 1, r->count == 2 ? "" : "s");
}
