/*
 * Error detail for strata's internal layers.
 *
 * A failing internal function records a message with err_set() and returns the status;
 * callers that only pass a failure up use ERR_CHECK(), which leaves an NCCL-style trail
 * ("-> STRATA_EIO at nvme/ring.c:120") in the debug log. The message lives in a
 * thread-local slot; public entry points copy it into their handle (engine, aio handle)
 * with err_copy() so that strata_last_error(handle) survives other threads' calls.
 */
#ifndef STRATA_BASE_ERROR_H
#define STRATA_BASE_ERROR_H

#include <stddef.h>

#include "strata.h"

#define ERR_MSG_BYTES 1024

/* A handle's copy of its last error. */
typedef struct err_slot {
    strata_status status;
    char msg[ERR_MSG_BYTES];
} err_slot;

/* Records a formatted message as this thread's last error and returns status (so that
 * `return err_set(STRATA_EIO, "...")` reads naturally). Logged at debug level. */
strata_status err_set(strata_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Clears this thread's last error. */
void err_clear(void);

/* This thread's last message ("" when none). */
const char *err_last(void);
strata_status err_last_status(void);

/* Copies this thread's last error into slot when status is a failure, clears slot on success;
 * returns status unchanged. Public functions end with `return err_copy(&h->err, st);`. */
strata_status err_copy(err_slot *slot, strata_status status);

/* Records a trail entry for a failure passed up unchanged (debug log only). */
void err_trail(strata_status status, const char *file, int line);

/* Propagates a failure with a trail entry. */
#define ERR_CHECK(call)                                         \
    do {                                                        \
        strata_status err_check_st_ = (call);                   \
        if (err_check_st_ != STRATA_OK) {                       \
            err_trail(err_check_st_, __FILE__, __LINE__);       \
            return err_check_st_;                               \
        }                                                       \
    } while (0)

/* Maps an errno value to the closest status (ENOSPC -> STRATA_ENOSPC, ENOMEM -> STRATA_ENOMEM, ...). */
strata_status err_from_errno(int errnum);

/* "Invalid argument (EINVAL)": strerror plus the symbolic name, thread-safe. */
const char *err_errno_str(int errnum, char *buf, size_t len);

#endif
