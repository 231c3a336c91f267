/* Collects every configuration problem found (not just the first), one line each. */
#ifndef STRATA_ENGINE_CONFIG_REPORT_H
#define STRATA_ENGINE_CONFIG_REPORT_H

#include <stddef.h>

#include "base/error.h"

typedef struct cfg_report {
    char *buf;      /* caller's buffer, may be NULL */
    size_t len;
    size_t used;    /* bytes of whole lines in buf */
    int count;      /* problems found */
    int dropped;    /* problems that did not fit in buf, counted in its closing "... and N more" line */
    char first[ERR_MSG_BYTES];
} cfg_report;

void cfg_report_init(cfg_report *r, char *buf, size_t len);

/* Adds one problem; the text gets the "config: " prefix. The buffer holds whole lines only: when the list does not
 * fit, its last line is "config: ... and N more problems" (never a line cut in the middle). */
void cfg_report_add(cfg_report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* STRATA_OK when nothing was reported; else records the first problem (with a count of the
 * rest) as the thread's last error and returns status. */
strata_status cfg_report_finish(cfg_report *r, strata_status status);

#endif
