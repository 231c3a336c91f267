/*
 * The NVMe bandwidth sweep behind `strata nvme-bench`: sequential write, sequential read and
 * concurrent read+write (what the optimizer step does) for one (block size, queue depth,
 * threads) point at a time, over private files striped across one or more paths.
 *
 * Data can be verified: every 4 KiB block written carries its own offset and the run's seed at its
 * start, middle and end, so a read that returns the wrong block, a stale buffer or zeros counts
 * as #wrong. A pass runs verified or not: checking a block holds up the next request on its slot,
 * so an unverified pass (the same reads, not looked at) gives the rate a peer without checks is
 * compared with, and a verified pass the rate with the proof. Writes always carry the pattern.
 * The files are O_TMPFILE (or unlinked at once), so they vanish on any exit.
 */
#ifndef STRATA_TOOLS_NVME_BENCH_RUN_H
#define STRATA_TOOLS_NVME_BENCH_RUN_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strata.h"

typedef enum bench_mode { BENCH_WRITE = 0, BENCH_READ, BENCH_RW, BENCH_MODES } bench_mode;

typedef struct bench_files bench_files;

typedef struct bench_result {
    bench_mode mode;
    bool verified;        /* every block read was checked (wrong counts); false: the reads were only timed */
    size_t block_size;
    int queue_depth;
    int threads;
    uint64_t bytes;
    double seconds;
    double gbps;          /* 1e9 bytes per second */
    double p50_us, p99_us;/* per-request latency, submit to completion */
    double cpu_s_per_gb;  /* user + system CPU of the whole process, per 1e9 bytes */
    uint64_t wrong;       /* 4 KiB blocks that read back wrong (0 when not verified) */
    uint64_t errors;      /* requests that failed */
    char first_error[512];
} bench_result;

/* Progress callback: done and total in bytes of the current pass. */
typedef void (*bench_progress_fn)(uint64_t done, uint64_t total, void *ctx);

/* Creates one private file of file_bytes / npaths (rounded to 8 MiB) per path, written in full
 * with the pattern (so reads anywhere are valid). direct is the aio.direct policy. */
strata_status bench_files_create(const char *const *paths, int npaths, uint64_t file_bytes, strata_switch direct,
                                 uint64_t seed, bench_progress_fn progress, void *ctx, bench_files **out);
void bench_files_destroy(bench_files *bf);
bool bench_files_direct(const bench_files *bf);
uint64_t bench_files_bytes(const bench_files *bf);

/* Runs one pass of mode with cfg (block_size, queue_depth, intra_op_parallelism, ...): the whole
 * file, or until max_seconds (> 0) have passed. verify checks every block read as it completes, on
 * the clock; without it the reads are timed only. *stop set by a signal handler ends it early. */
strata_status bench_run(bench_files *bf, const strata_aio_config *cfg, bench_mode mode, bool verify,
                        double max_seconds, volatile sig_atomic_t *stop, bench_progress_fn progress, void *ctx,
                        bench_result *out);

/* Whether a pass of mode reads (and so has something to verify). */
bool bench_mode_reads(bench_mode mode);

/* Drops the page cache between runs when permitted (root); false (once logged) otherwise. */
bool bench_drop_caches(bench_files *bf);

const char *bench_mode_name(bench_mode mode);

#endif
