/* The OpenMP driver: tiles, round-robin static split, hwloc binding, completion callbacks (see driver.h). */
#include "cpu_adam/driver.h"

#include <hwloc.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "base/util.h"

static pthread_once_t topo_once = PTHREAD_ONCE_INIT;
static hwloc_topology_t topo;
static int core_count;
static adam_cores process_cores; /* the default set: adam_cores_allowed(-1) when the topology was read */
static _Thread_local const adam_cores *thread_cores;

static void cores_of(int numa_node, adam_cores *out);

static void load_topology(void)
{
    if (hwloc_topology_init(&topo) != 0 || hwloc_topology_load(topo) != 0) {
        LOG_WARN(LOG_ADAM, "hwloc could not read the CPU topology; Adam threads will not be bound to cores");
        topo = NULL;
        return;
    }
    core_count = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
    cores_of(-1, &process_cores);
}

/* The process's CPU binding, else the PUs it is allowed (a cgroup), into set. */
static void process_binding(hwloc_bitmap_t set)
{
    if (hwloc_get_cpubind(topo, set, HWLOC_CPUBIND_PROCESS) != 0 || hwloc_bitmap_iszero(set))
        hwloc_bitmap_copy(set, hwloc_topology_get_allowed_cpuset(topo));
}

static void cores_of(int numa_node, adam_cores *out)
{
    out->count = 0;
    hwloc_bitmap_t bound = hwloc_bitmap_alloc();
    if (!topo || core_count <= 0 || !bound) {
        hwloc_bitmap_free(bound);
        return;
    }
    process_binding(bound);
    hwloc_obj_t node = numa_node >= 0 ? hwloc_get_numanode_obj_by_os_index(topo, (unsigned)numa_node) : NULL;
    /* A node that holds none of the bound cores (or that hwloc does not know) restricts nothing. */
    bool restrict_node = node && node->cpuset && hwloc_bitmap_intersects(node->cpuset, bound);
    for (int c = 0; c < core_count && out->count < ADAM_MAX_CORES; c++) {
        hwloc_obj_t core = hwloc_get_obj_by_type(topo, HWLOC_OBJ_CORE, (unsigned)c);
        if (core && hwloc_bitmap_intersects(core->cpuset, bound) &&
            (!restrict_node || hwloc_bitmap_intersects(core->cpuset, node->cpuset)))
            out->index[out->count++] = c;
    }
    hwloc_bitmap_free(bound);
}

void adam_cores_allowed(int numa_node, adam_cores *out)
{
    pthread_once(&topo_once, load_topology);
    cores_of(numa_node, out);
}

const adam_cores *adam_cores_use(const adam_cores *cores)
{
    const adam_cores *prev = thread_cores;
    thread_cores = cores;
    return prev;
}

void adam_cores_format(const adam_cores *cores, char *buf, size_t len)
{
    size_t at = 0;
    if (len)
        buf[0] = '\0';
    for (int i = 0; i < cores->count && at < len;) {
        int j = i;
        while (j + 1 < cores->count && cores->index[j + 1] == cores->index[j] + 1)
            j++;
        char part[32];
        if (j == i)
            snprintf(part, sizeof part, "%s%d", i ? "," : "", cores->index[i]);
        else
            snprintf(part, sizeof part, "%s%d-%d", i ? "," : "", cores->index[i], cores->index[j]);
        if (at + strlen(part) + 4 > len) { /* room for "..." and the terminator */
            snprintf(buf + at, len - at, "...");
            return;
        }
        at += (size_t)snprintf(buf + at, len - at, "%s", part);
        i = j + 1;
    }
}

int adam_default_threads(void)
{
    pthread_once(&topo_once, load_topology);
    if (process_cores.count > 0)
        return process_cores.count;
    int n = omp_get_num_procs();
    return n > 0 ? n : 1;
}

size_t adam_tile_numel(size_t numel, int threads, size_t requested)
{
    if (requested)
        return align_up(requested, ADAM_TILE_ALIGN);
    /* Small arrays: one tile per thread, so every thread gets work. */
    size_t per_thread = align_up((numel + (size_t)threads - 1) / (size_t)threads, ADAM_TILE_ALIGN);
    return MIN(ADAM_TILE_DEFAULT, MAX(per_thread, ADAM_TILE_ALIGN));
}

size_t adam_job_tile_numel(const adam_job *job)
{
    size_t tile = adam_tile_numel(job->numel, job->threads, job->tile_numel);
    return job->moments == STRATA_MOMENTS_8BIT ? align_up(tile, MOMENTS_Q8_BLOCK) : tile;
}

/* Binds the calling thread to the core of set at `index` (modulo its size) and saves its old binding in *saved. */
static void bind_thread(const adam_cores *set, int index, hwloc_bitmap_t *saved)
{
    *saved = NULL;
    if (!topo || set->count <= 0)
        return;
    hwloc_obj_t core = hwloc_get_obj_by_type(topo, HWLOC_OBJ_CORE, (unsigned)set->index[index % set->count]);
    hwloc_bitmap_t old = hwloc_bitmap_alloc();
    if (!core || !old || hwloc_get_cpubind(topo, old, HWLOC_CPUBIND_THREAD) != 0) {
        hwloc_bitmap_free(old);
        return;
    }
    if (hwloc_set_cpubind(topo, core->cpuset, HWLOC_CPUBIND_THREAD) != 0) {
        LOG_ONCE(STRATA_LOG_INFO, LOG_ADAM, "hwloc could not bind an Adam thread to a core; running unbound");
        hwloc_bitmap_free(old);
        return;
    }
    *saved = old;
}

static void unbind_thread(hwloc_bitmap_t saved)
{
    if (!saved)
        return;
    hwloc_set_cpubind(topo, saved, HWLOC_CPUBIND_THREAD);
    hwloc_bitmap_free(saved);
}

/* What one kind of work does to one tile. */
typedef enum work_kind { WORK_STEP, WORK_GRADSTATS, WORK_ROOFLINE } work_kind;

/* Per-thread partial sums on their own cache lines. */
typedef struct padded_stats {
    adam_gradstats s;
    char pad[64 - sizeof(adam_gradstats) % 64];
} padded_stats;

typedef struct work {
    work_kind kind;
    const adam_job *job;
    adam_stores stores;
    const void *grad;
    strata_dtype grad_dtype;
    padded_stats *partial;
} work;

static void step_range(const adam_job *job, const adam_consts *c, size_t begin, size_t end)
{
    switch (job->moments) {
    case STRATA_MOMENTS_BF16: job->ops->step_bf16(c, &job->arrays, &job->bf16, begin, end); break;
    case STRATA_MOMENTS_8BIT: job->ops->step_q8(c, &job->arrays, &job->q8, begin, end); break;
    default: job->ops->step(c, &job->arrays, begin, end); break;
    }
}

size_t adam_run_at(const adam_group_map *g, size_t pos)
{
    size_t lo = 0, hi = g->nruns;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (g->runs[mid].start <= pos)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* A tile, cut where a parameter group ends: each piece with its group's constants. */
static void step_tile(const adam_job *job, size_t begin, size_t end)
{
    const adam_group_map *g = job->groups;
    if (!g) {
        step_range(job, &job->consts, begin, end);
        return;
    }
    size_t base = job->groups_base;
    for (size_t i = adam_run_at(g, base + begin), at = begin; at < end; i++) {
        size_t stop = i + 1 < g->nruns ? MIN(end, g->runs[i + 1].start - base) : end;
        step_range(job, &g->consts[g->runs[i].group], at, stop);
        at = stop;
    }
}

/* Returns the size of the team that ran the tiles. */
static int run_tiles(const work *w, size_t numel, int threads, size_t tile)
{
    size_t tiles = (numel + tile - 1) / tile;
    int team = 1;
    pthread_once(&topo_once, load_topology);
    /* Read on the thread that starts the team: the setting is that thread's. */
    const adam_cores *set = thread_cores ? thread_cores : &process_cores;
#pragma omp parallel num_threads(threads)
    {
        hwloc_bitmap_t saved;
        int t = omp_get_thread_num();
        if (t == 0)
            team = omp_get_num_threads();
        bind_thread(set, t, &saved);
#pragma omp for schedule(static, 1)
        for (size_t k = 0; k < tiles; k++) {
            size_t begin = k * tile, end = MIN(numel, begin + tile);
            const adam_job *job = w->job;
            switch (w->kind) {
            case WORK_STEP:
                step_tile(job, begin, end);
                if (job->on_tile)
                    job->on_tile(begin, end - begin, job->on_tile_user);
                break;
            case WORK_GRADSTATS:
                job->ops->gradstats(w->grad, w->grad_dtype, begin, end, &w->partial[t].s);
                break;
            case WORK_ROOFLINE:
                job->ops->roofline(&job->arrays, begin, end, w->stores);
                break;
            }
        }
        unbind_thread(saved);
    }
    return team;
}

strata_status adam_run_step(const adam_job *job)
{
    if (job->numel == 0)
        return STRATA_OK;
    work w = {.kind = WORK_STEP, .job = job};
    int team = run_tiles(&w, job->numel, job->threads, adam_job_tile_numel(job));
    if (job->team_out)
        *job->team_out = team;
    return STRATA_OK;
}

strata_status adam_run_roofline(const adam_job *job, adam_stores stores)
{
    if (job->numel == 0)
        return STRATA_OK;
    work w = {.kind = WORK_ROOFLINE, .job = job, .stores = stores};
    run_tiles(&w, job->numel, job->threads, adam_tile_numel(job->numel, job->threads, job->tile_numel));
    return STRATA_OK;
}

strata_status adam_run_gradstats(const adam_ops *ops, const void *grad, strata_dtype dtype, size_t numel,
                                 int threads, adam_gradstats *out)
{
    out->sumsq = 0.0;
    out->nonfinite = false;
    if (numel == 0)
        return STRATA_OK;
    padded_stats *partial = calloc((size_t)threads, sizeof *partial);
    if (!partial)
        return err_set(STRATA_ENOMEM, "adam: no memory for %d per-thread sums", threads);
    adam_job job = {.ops = ops, .numel = numel, .threads = threads};
    work w = {.kind = WORK_GRADSTATS, .job = &job, .grad = grad, .grad_dtype = dtype, .partial = partial};
    run_tiles(&w, numel, threads, adam_tile_numel(numel, threads, 0));
    for (int t = 0; t < threads; t++) {
        out->sumsq += partial[t].s.sumsq;
        out->nonfinite |= partial[t].s.nonfinite;
    }
    free(partial);
    return STRATA_OK;
}
