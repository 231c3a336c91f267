/*
 * Ranks of one host divide its per-node defaults (engine/plan/node_share.h). Each rank first makes a world-1 engine of
 * its own — the oracle: what one process alone gets — then one rank of the world:
 *   - the default host budget is the oracle's (3/4 of RAM) divided by the ranks of this host;
 *   - the Adam cores of the ranks are pairwise disjoint, all within the oracle's cores, and each rank has its
 *     even share of them (on a 2-core machine, 2 ranks get 1 core each); the default thread count is the share's;
 *   - a host budget and a cpu_threads the user gives are kept as given (per w.rank), the threads still bound to the
 *     rank's own cores.
 * Registered for 2 ranks (and the plain world-1 run, where the world engine gets what the oracle gets).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "engine/plan/node_share.h"
#include "synth.h"
#include "testlib.h"
#include "world.h"

/* Cores as a bitmap, for the world to compare: up to this many (hwloc logical indices). */
#define MAP_WORDS 64
#define MAP_CORES (MAP_WORDS * 64)

static t_world w; /* this process's world: its comm, rank, size and seed */

typedef struct share {
    size_t host_budget_bytes;
    int threads, count;
    int cores[MAP_CORES];
    char cores_text[sizeof(((strata_stats *)0)->adam_cores)];
} share;

/* A finalized engine of the synthetic model (world 1 when comm is NULL) with cfg's budgets; what it got. */
static bool engine_share(strata_comm *ranks, const strata_config *cfg, share *out)
{
    synth_opts o;
    synth_defaults(&o, w.seed);
    o.comm = ranks;
    strata_engine *e = NULL;
    strata_status st = synth_engine(&o, cfg, &e);
    T_CHECK(st == STRATA_OK, "engine (%s): %s: %s", ranks ? "ranked" : "world 1", strata_status_name(st),
            strata_last_error(NULL));
    if (st != STRATA_OK)
        return false;
    strata_stats s;
    T_OK(strata_stats_get(e, &s));
    T_OK(strata_engine_adam_cores(e, out->cores, MAP_CORES, &out->count, &out->threads));
    T_CHECK(out->count <= MAP_CORES, "%d cores: the test compares at most %d", out->count, MAP_CORES);
    T_EQ_INT(s.adam_threads, out->threads);
    out->host_budget_bytes = s.host_budget_bytes;
    snprintf(out->cores_text, sizeof out->cores_text, "%s", s.adam_cores);
    strata_engine_destroy(e);
    return true;
}

static void to_map(const share *s, uint64_t map[MAP_WORDS])
{
    memset(map, 0, MAP_WORDS * sizeof *map);
    for (int i = 0; i < s->count && i < MAP_CORES; i++)
        map[s->cores[i] / 64] |= 1ull << (s->cores[i] % 64);
}

/* Every rank's cores are disjoint from every other's and within the oracle's; the ranks together use them all. */
static void check_disjoint(const char *what, const share *mine, const share *oracle)
{
    uint64_t my_map[MAP_WORDS], all_map[MAP_WORDS], *maps = calloc((size_t)w.size * MAP_WORDS, sizeof *maps);
    T_CHECK(maps != NULL, "out of memory");
    if (!maps)
        return;
    to_map(mine, my_map);
    to_map(oracle, all_map);
    T_OK(comm_allgather(w.comm, my_map, maps, MAP_WORDS, COMM_U64));
    for (int k = 0; k < MAP_WORDS; k++) {
        uint64_t seen = 0;
        for (int r = 0; r < w.size; r++) {
            uint64_t m = maps[(size_t)r * MAP_WORDS + k];
            T_CHECK((m & seen) == 0, "%s: rank %d's Adam cores overlap a lower rank's (word %d: %016llx and %016llx)",
                    what, r, k, (unsigned long long)m, (unsigned long long)seen);
            T_CHECK((m & ~all_map[k]) == 0, "%s: rank %d's Adam cores (word %d: %016llx) are not all among this "
                    "machine's %016llx", what, r, k, (unsigned long long)m, (unsigned long long)all_map[k]);
            seen |= m;
        }
        if (oracle->count >= w.size)
            T_CHECK(seen == all_map[k], "%s: the ranks leave cores idle (word %d: used %016llx of %016llx)", what, k,
                    (unsigned long long)seen, (unsigned long long)all_map[k]);
    }
    free(maps);
}

/* This rank's even share of the oracle's cores: a contiguous block of them, or one core when there are too few. */
static int share_count(const share *oracle, int local)
{
    if (oracle->count < local)
        return oracle->count > 0;
    return oracle->count * (w.rank + 1) / local - oracle->count * w.rank / local;
}

static void run_defaults(const share *oracle, int local)
{
    strata_config cfg = synth_config(STRATA_DTYPE_FP32);
    cfg.host_budget_bytes = 0;
    cfg.cpu_threads = 0;
    share mine;
    if (!engine_share(w.comm, &cfg, &mine))
        return;
    T_CHECK(mine.host_budget_bytes == oracle->host_budget_bytes / (size_t)local,
            "default host budget: rank %d of %d ranks on this host got %zu bytes; one process alone gets %zu, so its "
            "share is %zu", w.rank, local, mine.host_budget_bytes, oracle->host_budget_bytes,
            oracle->host_budget_bytes / (size_t)local);
    int want = share_count(oracle, local);
    T_CHECK(mine.count == want, "default Adam cores: rank %d of %d got %d core(s) (%s) of this machine's %d (%s); "
            "its share is %d", w.rank, local, mine.count, mine.cores_text, oracle->count, oracle->cores_text, want);
    T_CHECK(mine.threads == (mine.count > 0 ? mine.count : mine.threads),
            "default Adam threads: rank %d runs %d thread(s) on %d core(s)", w.rank, mine.threads, mine.count);
    if (oracle->count >= local)
        check_disjoint("default", &mine, oracle);
    if (w.rank == 0)
        printf("  %d rank(s) on this host: rank 0 got host budget %zu of %zu, Adam %d thread(s) on cores %s of %s\n",
               local, mine.host_budget_bytes, oracle->host_budget_bytes, mine.threads, mine.cores_text,
               oracle->cores_text);
}

/* A budget and a thread count the user gives are per rank: kept as given, the threads on the rank's own cores. */
static void run_explicit(const share *oracle, int local)
{
    strata_config cfg = synth_config(STRATA_DTYPE_FP32);
    cfg.host_budget_bytes = (size_t)3 << 30;
    cfg.cpu_threads = 3;
    share mine;
    if (!engine_share(w.comm, &cfg, &mine))
        return;
    T_CHECK(mine.host_budget_bytes == cfg.host_budget_bytes, "explicit host budget %zu: rank %d got %zu",
            cfg.host_budget_bytes, w.rank, mine.host_budget_bytes);
    T_EQ_INT(mine.threads, 3);
    int want = share_count(oracle, local);
    T_CHECK(mine.count == want, "explicit cpu_threads 3: rank %d's threads are bound to %d core(s) (%s); its share "
            "is %d", w.rank, mine.count, mine.cores_text, want);
    if (oracle->count >= local)
        check_disjoint("explicit cpu_threads", &mine, oracle);
}

/* Rank r of a host takes GPU (device_id + r) mod gpus: how many of the host's ranks use the GPU rank r uses. */
static void check_device_sharers(void)
{
    static const struct {
        int device_id, local_rank, local_size, gpus, want;
    } cases[] = {
        {0, 0, 1, 1, 1}, {0, 1, 2, 1, 2}, {0, 0, 2, 2, 1}, {0, 3, 4, 2, 2}, {0, 0, 3, 2, 2},
        {0, 1, 3, 2, 1}, {1, 0, 3, 2, 2}, {1, 1, 3, 2, 1}, {0, 2, 8, 8, 1}, {0, 0, 2, 0, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        T_CHECK(node_device_sharers(cases[i].device_id, cases[i].local_rank, cases[i].local_size, cases[i].gpus) ==
                    cases[i].want,
                "device_id %d, local rank %d of %d, %d GPU(s): %d rank(s) share its GPU, expected %d",
                cases[i].device_id, cases[i].local_rank, cases[i].local_size, cases[i].gpus,
                node_device_sharers(cases[i].device_id, cases[i].local_rank, cases[i].local_size, cases[i].gpus),
                cases[i].want);
}

int main(void)
{
    w = t_world_open();
    check_device_sharers();
    /* The oracle: an engine of this process alone, with every default. */
    strata_config cfg = synth_config(STRATA_DTYPE_FP32);
    cfg.host_budget_bytes = 0;
    cfg.cpu_threads = 0;
    share oracle;
    if (engine_share(NULL, &cfg, &oracle)) {
        int local = comm_local_size(w.comm);
        T_CHECK(oracle.threads == (oracle.count > 0 ? oracle.count : oracle.threads),
                "world 1: %d Adam thread(s) on %d core(s)", oracle.threads, oracle.count);
        T_CHECK(oracle.host_budget_bytes > 0, "world 1: the default host budget is 0");
        run_defaults(&oracle, local);
        run_explicit(&oracle, local);
    }
    strata_comm_destroy(w.comm);
    return t_done();
}
