/* Thread-local last error, handle copies and the debug trail. */
#include "base/error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"

static _Thread_local err_slot tls_err;

strata_status err_set(strata_status status, const char *fmt, ...)
{
    /* Formatted aside first: a message that wraps the last one passes err_last(), this very buffer, as an argument. */
    char msg[sizeof tls_err.msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(tls_err.msg, msg, sizeof msg);
    tls_err.status = status;
    LOG_DEBUG(LOG_CORE, "%s: %s", strata_status_name(status), tls_err.msg);
    return status;
}

void err_clear(void)
{
    tls_err.status = STRATA_OK;
    tls_err.msg[0] = '\0';
}

const char *err_last(void)
{
    return tls_err.msg;
}

strata_status err_last_status(void)
{
    return tls_err.status;
}

strata_status err_copy(err_slot *slot, strata_status status)
{
    if (!slot)
        return status;
    if (status == STRATA_OK) {
        slot->status = STRATA_OK;
        slot->msg[0] = '\0';
        return status;
    }
    slot->status = status;
    /* A failure whose origin recorded no message still gets one that names the status. */
    if (tls_err.status == status && tls_err.msg[0])
        snprintf(slot->msg, sizeof slot->msg, "%s", tls_err.msg);
    else
        snprintf(slot->msg, sizeof slot->msg, "%s", strata_status_str(status));
    return status;
}

void err_trail(strata_status status, const char *file, int line)
{
    LOG_DEBUG(LOG_CORE, "-> %s at %s:%d", strata_status_name(status), file, line);
}

strata_status err_from_errno(int errnum)
{
    switch (errnum) {
    case 0: return STRATA_OK;
    case ENOSPC: case EDQUOT: return STRATA_ENOSPC;
    case ENOMEM: return STRATA_ENOMEM;
    case EINVAL: return STRATA_EINVAL;
    case ENOENT: return STRATA_ENOTFOUND;
    case EBUSY: case EAGAIN: return STRATA_EBUSY;
    case ECANCELED: return STRATA_ECANCELED;
    case EOPNOTSUPP: case ENOSYS: return STRATA_EUNSUPPORTED;
    default: return STRATA_EIO;
    }
}

const char *err_errno_str(int errnum, char *buf, size_t len)
{
    const char *name = strerrorname_np(errnum);
    snprintf(buf, len, "%s (%s)", strerrordesc_np(errnum) ? strerrordesc_np(errnum) : "unknown error",
             name ? name : "?");
    return buf;
}
