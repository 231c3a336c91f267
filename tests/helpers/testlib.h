/*
 * What every strata test uses: checks that print both values, skip with a reason (exit 77),
 * fresh random data with the seed printed (STRATA_TEST_SEED reproduces a run), scratch dirs.
 */
#ifndef STRATA_TESTLIB_H
#define STRATA_TESTLIB_H

#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata.h"

extern int t_failures;
extern int t_checks;

void t_fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Exits 77 with the reason printed: the test cannot run here (no GPU, no O_DIRECT, not root). */
void t_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* Prints the summary and returns the exit code for main(): 1 when a check failed, and 1 when none ran (a test
 * that checks nothing proves nothing: "ran no check"). A test process that ends any other way than t_done() or
 * t_skip() having run no check -- main returning 0 early, exit(0) -- is failed the same way at exit (exit
 * status 1). Only the process that loaded the test is judged: forked children end as they please. */
int t_done(void);

#define T_CHECK(cond, ...)                                  \
    do {                                                    \
        t_checks++;                                         \
        if (!(cond))                                        \
            t_fail(__FILE__, __LINE__, __VA_ARGS__);        \
    } while (0)

#define T_EQ_INT(a, b)                                                                             \
    do {                                                                                           \
        long long t_a_ = (long long)(a), t_b_ = (long long)(b);                                    \
        T_CHECK(t_a_ == t_b_, "%s == %s: got %lld, expected %lld", #a, #b, t_a_, t_b_);            \
    } while (0)

#define T_EQ_STR(a, b)                                                                             \
    do {                                                                                           \
        const char *t_a_ = (a), *t_b_ = (b);                                                       \
        T_CHECK(t_a_ && t_b_ && strcmp(t_a_, t_b_) == 0, "%s == %s:\n   got      \"%s\"\n   expected \"%s\"", \
                #a, #b, t_a_ ? t_a_ : "(null)", t_b_ ? t_b_ : "(null)");                           \
    } while (0)

#define T_CONTAINS(hay, needle)                                                                    \
    do {                                                                                           \
        const char *t_h_ = (hay), *t_n_ = (needle);                                                \
        T_CHECK(t_h_ && strstr(t_h_, t_n_), "%s does not contain \"%s\":\n   got \"%s\"", #hay, t_n_,  \
                t_h_ ? t_h_ : "(null)");                                                           \
    } while (0)

/* A call that must succeed; prints the status and the last error when it does not. */
#define T_OK(call)                                                                                 \
    do {                                                                                           \
        strata_status t_s_ = (call);                                                               \
        T_CHECK(t_s_ == STRATA_OK, "%s failed: %s: %s", #call, strata_status_name(t_s_),           \
                strata_last_error(NULL));                                                          \
    } while (0)

/* A call that must fail with a given status. */
#define T_STATUS(call, expected)                                                                   \
    do {                                                                                           \
        strata_status t_s_ = (call);                                                               \
        T_CHECK(t_s_ == (expected), "%s returned %s, expected %s (last error: %s)", #call,         \
                strata_status_name(t_s_), strata_status_name(expected), strata_last_error(NULL));  \
    } while (0)

/* Random data. t_rng_seed() is chosen once per process (printed; STRATA_TEST_SEED overrides). */
uint64_t t_rng_seed(void);
uint64_t t_rand_u64(void);
double t_rand_unit(void);                 /* [0, 1) */
float t_rand_normal(void);                /* standard normal */
void t_rand_bytes(void *buf, size_t len);
size_t t_rand_range(size_t lo, size_t hi); /* [lo, hi] */

/* How many entries dir holds, "." and ".." aside (0 when it cannot be opened): private swap and
 * benchmark files must never be visible. */
int t_dir_entries(const char *dir);

/* Calls fn for each descriptor this process holds open, with what /proc/self/fd says it is
 * ("/dir/#1234 (deleted)" for a private swap file, "anon_inode:[io_uring]"), until fn returns true.
 * Returns the descriptor fn stopped at, or -1. How a test finds the files strata keeps private. */
int t_each_open_fd(bool (*fn)(int fd, const char *target, void *ctx), void *ctx);

/* A fresh directory under $STRATA_SCRATCH (or /tmp) for this test; removed by t_scratch_cleanup(). */
const char *t_scratch_dir(const char *name);
void t_scratch_cleanup(void);

#endif
