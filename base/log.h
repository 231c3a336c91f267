/*
 * Logging by level and subsystem (STRATA_LOG=warn|info|debug|trace, STRATA_LOG_SUBSYS=io,adam,...).
 *
 * The macros test the level before evaluating their arguments, so a disabled
 * LOG_TRACE in a hot loop costs one load and a compare.
 */
#ifndef STRATA_BASE_LOG_H
#define STRATA_BASE_LOG_H

#include <stdatomic.h>
#include <stdbool.h>

#include "strata.h"

/* Subsystems: one bit each; names as accepted by STRATA_LOG_SUBSYS. */
#define LOG_SUBSYS_LIST(X)         \
    X(LOG_CORE,   "core")          \
    X(LOG_CONFIG, "config")        \
    X(LOG_IO,     "io")            \
    X(LOG_ADAM,   "adam")          \
    X(LOG_DEV,    "dev")           \
    X(LOG_SCHED,  "sched")         \
    X(LOG_CKPT,   "ckpt")          \
    X(LOG_TRAIN,  "train")         \
    X(LOG_COMM,   "comm")

enum log_subsys_bit {
#define LOG_BIT_(id, name) id##_BIT_,
    LOG_SUBSYS_LIST(LOG_BIT_)
#undef LOG_BIT_
    LOG_SUBSYS_COUNT
};
typedef enum log_subsys {
#define LOG_ID_(id, name) id = 1u << id##_BIT_,
    LOG_SUBSYS_LIST(LOG_ID_)
#undef LOG_ID_
} log_subsys;

/* Current filter; read with relaxed atomics by the macros. Initialised from the environment on first use. */
extern _Atomic int log_level_now;
extern _Atomic unsigned log_subsys_mask;
void log_init_once(void);

static inline bool log_enabled(strata_log_level level, log_subsys sub)
{
    log_init_once();
    return (int)level <= atomic_load_explicit(&log_level_now, memory_order_relaxed) &&
           (atomic_load_explicit(&log_subsys_mask, memory_order_relaxed) & (unsigned)sub);
}

void log_emit(strata_log_level level, log_subsys sub, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define LOG_AT(level, sub, ...)                     \
    do {                                            \
        if (log_enabled((level), (sub)))            \
            log_emit((level), (sub), __VA_ARGS__);  \
    } while (0)

#define LOG_ERROR(sub, ...) LOG_AT(STRATA_LOG_ERROR, sub, __VA_ARGS__)
#define LOG_WARN(sub, ...)  LOG_AT(STRATA_LOG_WARN, sub, __VA_ARGS__)
#define LOG_INFO(sub, ...)  LOG_AT(STRATA_LOG_INFO, sub, __VA_ARGS__)
#define LOG_DEBUG(sub, ...) LOG_AT(STRATA_LOG_DEBUG, sub, __VA_ARGS__)
#define LOG_TRACE(sub, ...) LOG_AT(STRATA_LOG_TRACE, sub, __VA_ARGS__)

/* Logs once per call site for the life of the process (e.g. "O_DIRECT refused, using buffered I/O"). */
#define LOG_ONCE(level, sub, ...)                                              \
    do {                                                                       \
        static atomic_flag log_once_flag_ = ATOMIC_FLAG_INIT;                  \
        if (log_enabled((level), (sub)) && !atomic_flag_test_and_set(&log_once_flag_)) \
            log_emit((level), (sub), __VA_ARGS__);                             \
    } while (0)

/* The name of a level ("warn") or subsystem ("io"). */
const char *log_level_name(strata_log_level level);
const char *log_subsys_name(log_subsys sub);

/* Parses a level name; false when unknown. */
bool log_parse_level(const char *text, strata_log_level *out);

#endif
