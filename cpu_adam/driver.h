/*
 * The OpenMP driver of CPU Adam: runs a kernel over an array range with the caller's thread count,
 * in tiles, and reports each finished tile. This is the interface the engine's optimizer thread uses on
 * a sub-group in pinned RAM (strata_adam_step() is a thin public wrapper around it).
 *
 * Work split: the range is cut into tiles of tile_numel elements (a multiple of ADAM_TILE_ALIGN, so a
 * tile never splits a cache line of any array, and tiles of fp32 arrays start on page boundaries when
 * the arrays do). Tiles are dealt round-robin (OpenMP static schedule, chunk 1), so thread t takes
 * tiles t, t+T, t+2T, ...: the split is fixed (results never depend on timing) and tiles finish
 * roughly in ascending order, which lets the engine copy tile 0 to the device while later ones compute.
 * Threads are bound to distinct cores (hwloc) for the call and get their old binding back after it: thread t
 * to the t-th core of the calling thread's Adam cores (adam_cores_use), by default the cores this process may
 * run on. The driver knows nothing of ranks: who shares a machine, and which share is whose, is the caller's.
 */
#ifndef STRATA_CPU_ADAM_DRIVER_H
#define STRATA_CPU_ADAM_DRIVER_H

#include "cpu_adam/adam.h"
#include "cpu_adam/adam_moments.h"

/* Elements: 1024 fp32 = 4 KiB, 1024 bf16 = 2 KiB; a multiple of every kernel's vector width. */
#define ADAM_TILE_ALIGN ((size_t)1024)
/* The default tile: 1 Mi elements (2 MiB of bf16 parameters per completion callback). */
#define ADAM_TILE_DEFAULT ((size_t)1 << 20)

/* Parameter groups inside one job: run i of a view, elements [runs[i].start, runs[i + 1].start) (the last one to
 * the view's end), updates with consts[runs[i].group]. Runs start on whole 8-bit blocks, so a tile cut at a run
 * boundary keeps every block in one run. */
typedef struct adam_run {
    size_t start;
    uint32_t group;
} adam_run;

typedef struct adam_group_map {
    const adam_consts *consts; /* one per group */
    const adam_run *runs;      /* ascending, runs[0].start = 0 */
    size_t nruns;
} adam_group_map;

/* The index of the run holding view element pos. */
size_t adam_run_at(const adam_group_map *g, size_t pos);

typedef struct adam_job {
    const adam_ops *ops;
    adam_consts consts;           /* every element's constants, unless groups is set */
    const adam_group_map *groups;    /* or NULL: element j of the job is element groups_base + j of the groups' view */
    size_t groups_base;
    adam_arrays arrays;           /* with FP32 moments m and v are arrays.exp_avg / exp_avg_sq, else these are unused */
    strata_moments moments;       /* the form m and v are stored in */
    adam_bf16_moments bf16;       /* BF16: m, v over [0, numel) and this step's key (moments_sr_key) */
    adam_q8_moments q8;           /* 8BIT: m, v over [0, numel), scale b for elements [b * 2048, (b + 1) * 2048);
                                     tiles then start on block boundaries (ADAM_TILE_ALIGN rounds up to them) */
    size_t numel;
    int threads;                  /* > 0 */
    size_t tile_numel;            /* 0 = default; rounded up to ADAM_TILE_ALIGN */
    strata_adam_tile_fn on_tile;  /* may be NULL; called from worker threads, concurrently */
    void *on_tile_user;
    int *team_out;                /* may be NULL; receives how many threads the OpenMP runtime gave the call
                                     (fewer than asked for under OMP_THREAD_LIMIT, for instance) */
} adam_job;

/* The most cores a set holds (strata.cpu_threads allows as many threads). */
#define ADAM_MAX_CORES 1024

/* A set of cores, as hwloc logical core indices ("core 3" of `lstopo`), in ascending order. */
typedef struct adam_cores {
    int count;
    int index[ADAM_MAX_CORES];
} adam_cores;

/* The cores this process may run on: those its CPU binding touches (mpirun's --bind-to, taskset), else the
 * machine's; restricted to the cores of NUMA node numa_node (an OS index) when numa_node >= 0 and that leaves
 * any. count is 0 when hwloc cannot read the topology (threads then run unbound). Thread-safe. */
void adam_cores_allowed(int numa_node, adam_cores *out);

/* Sets the calling thread's Adam cores and returns the previous setting: a team this thread starts (every
 * adam_run_* call) binds its thread t to cores->index[t % count]. NULL (the initial setting) means the
 * cores of adam_cores_allowed(-1). Like OpenMP's own place partition, the setting belongs to the thread
 * that starts the team; the driver keeps the pointer, which must stay valid until it is replaced. */
const adam_cores *adam_cores_use(const adam_cores *cores);

/* Writes the set as a list of ranges ("0-7", "0,2,4-6") into buf (truncated with "..."); "" for none. */
void adam_cores_format(const adam_cores *cores, char *buf, size_t len);

/* One Adam step over job->arrays[0, numel), m and v in the job's form. */
strata_status adam_run_step(const adam_job *job);

/* The gradient pre-pass over grad[0, numel) with threads threads. The sum is deterministic for a given
 * thread count (per-thread partials are added in thread order). */
strata_status adam_run_gradstats(const adam_ops *ops, const void *grad, strata_dtype dtype, size_t numel,
                                 int threads, adam_gradstats *out);

/* The same-shape roofline over job->arrays (consts and callback unused). */
strata_status adam_run_roofline(const adam_job *job, adam_stores stores);

/* The thread count used for 0: the cores this process may run on (adam_cores_allowed(-1)), at least 1. */
int adam_default_threads(void);

/* The tile size a job uses (tile_numel rounded, or the default shrunk so every thread gets work). */
size_t adam_tile_numel(size_t numel, int threads, size_t requested);
/* The tile size of a job: adam_tile_numel, rounded up to whole blocks for 8-bit moments. */
size_t adam_job_tile_numel(const adam_job *job);

#endif
