/* This rank's share of its machine: host budget, Adam cores, device sharers (see node_share.h). */
#include "engine/plan/node_share.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "base/log.h"
#include "base/size.h"
#include "engine/engine.h"
#include "engine/plan/plan.h"

struct node_share {
    adam_cores cores;   /* this rank's share */
    adam_cores allowed; /* what it was taken from: the cores the process may run on (of the GPU's NUMA node) */
    int device_sharers;
};

/* What each rank tells the others; a sum over the world gathers them (every other rank's slot is zero). */
typedef struct peer {
    uint64_t host;  /* crc32c of the host name */
    uint64_t cpus;  /* crc32c of the cores the process may run on */
    uint64_t numa;  /* the GPU's NUMA node + 1; 0: none known */
    uint64_t ok;    /* 1: this rank's create went well so far, and it takes a share */
} peer;
#define PEER_WORDS (sizeof(peer) / sizeof(uint64_t))

int node_device_sharers(int device_id, int local_rank, int local_size, int gpus)
{
    if (gpus <= 0)
        return 1;
    int mine = (device_id + local_rank) % gpus, n = 0;
    for (int r = 0; r < local_size; r++)
        n += (device_id + r) % gpus == mine;
    return n > 0 ? n : 1;
}

static peer describe(const strata_engine *e, const adam_cores *allowed, bool ok)
{
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    int numa = e->dev ? dev_numa_node(e->dev) : -1;
    return (peer){.host = crc32c(0, host, strlen(host)),
                  .cpus = crc32c(0, allowed->index, (size_t)allowed->count * sizeof allowed->index[0]),
                  .numa = numa >= 0 ? (uint64_t)numa + 1 : 0, .ok = ok};
}

/* Which share of which cores is this rank's: *index of *of ranks dividing adam_cores_allowed(*numa). The ranks of
 * this host bound to the same cores divide them; by NUMA node when each of them has a GPU hwloc can place. */
static void find_group(const peer *all, int world, int rank, int local_size, int *index, int *of, int *numa)
{
    const peer *me = &all[rank];
    int on_host = 0, same = 0;
    bool every_numa = true;
    for (int r = 0; r < world; r++) {
        on_host += all[r].host == me->host;
        if (all[r].ok && all[r].host == me->host && all[r].cpus == me->cpus) {
            same++;
            every_numa &= all[r].numa != 0;
        }
    }
    *numa = -1;
    if (on_host != local_size) {
        /* Host names do not tell the ranks of this host apart (containers may share one): divide by local rank. */
        LOG_INFO(LOG_CORE, "rank %d: %d ranks report this host's name, but %d share its memory; the Adam cores are "
                 "divided by local rank", rank, on_host, local_size);
        *index = -1; /* the caller's local rank */
        *of = local_size;
        return;
    }
    bool by_numa = same > 1 && every_numa;
    int n = 0, before = 0;
    for (int r = 0; r < world; r++)
        if (all[r].ok && all[r].host == me->host && all[r].cpus == me->cpus && (!by_numa || all[r].numa == me->numa)) {
            n++;
            before += r < rank;
        }
    *index = before;
    *of = n > 0 ? n : 1;
    if (by_numa)
        *numa = (int)me->numa - 1;
}

/* Share index of n of cores: a contiguous block, or one core (shared with other ranks) when there are too few. */
static void take_share(const adam_cores *all, int index, int n, adam_cores *out)
{
    out->count = 0;
    if (all->count == 0)
        return;
    if (all->count < n) {
        /* Oversubscribed on purpose (mpirun --oversubscribe, a test): said once, not warned. */
        LOG_ONCE(STRATA_LOG_INFO, LOG_ADAM, "%d ranks of this host share %d core(s): the Adam threads of several "
                 "ranks run on one core", n, all->count);
        out->index[out->count++] = all->index[index % all->count];
        return;
    }
    int first = (int)((long long)index * all->count / n), end = (int)((long long)(index + 1) * all->count / n);
    for (int c = first; c < end; c++)
        out->index[out->count++] = all->index[c];
}

static strata_status exchange(strata_engine *e, peer mine, peer **out)
{
    peer *all = calloc((size_t)e->world, sizeof *all);
    if (!all)
        return err_set(STRATA_ENOMEM, "strata_engine_create: out of memory dividing the node among its ranks");
    all[e->rank] = mine;
    strata_status st = e->world > 1 ? comm_allreduce_uncounted(e->comm, all, (size_t)e->world * PEER_WORDS, COMM_U64,
                                                               COMM_SUM)
                                    : STRATA_OK;
    if (st != STRATA_OK) {
        free(all);
        return st;
    }
    *out = all;
    return STRATA_OK;
}

static void log_share(const strata_engine *e, const node_share *s, int local_size)
{
    if (!log_enabled(STRATA_LOG_INFO, LOG_CORE))
        return;
    char cores[128], host[32];
    adam_cores_format(&s->cores, cores, sizeof cores);
    LOG_INFO(LOG_CORE, "rank %d (%d of %d on this host): host budget %s%s, Adam %d thread(s) on cores %s, device shared "
             "by %d rank(s)", e->rank, comm_local_rank(e->comm), local_size,
             size_format(e->cfg.host_budget_bytes, host, sizeof host), local_size > 1 ? " (its share)" : "",
             e->cfg.cpu_threads, cores[0] ? cores : "(unbound)", s->device_sharers);
}

strata_status node_share_create(strata_engine *e, strata_status local, node_share **out)
{
    *out = NULL;
    char msg[ERR_MSG_BYTES];
    snprintf(msg, sizeof msg, "%s", local != STRATA_OK ? err_last() : "");
    static const adam_cores none;
    node_share *s = calloc(1, sizeof *s);
    if (s)
        adam_cores_allowed(-1, &s->allowed);
    peer *all = NULL;
    strata_status st = exchange(e, describe(e, s ? &s->allowed : &none, local == STRATA_OK && s), &all);
    if (st == STRATA_OK && !s)
        st = err_set(STRATA_ENOMEM, "strata_engine_create: out of memory dividing the node among its ranks");
    if (local != STRATA_OK || st != STRATA_OK) {
        free(all);
        free(s);
        return local != STRATA_OK ? err_set(local, "%s", msg) : st;
    }
    int local_size = comm_local_size(e->comm), index, of, numa;
    find_group(all, e->world, e->rank, local_size, &index, &of, &numa);
    if (index < 0)
        index = comm_local_rank(e->comm);
    if (numa >= 0)
        adam_cores_allowed(numa, &s->allowed);
    take_share(&s->allowed, index, of, &s->cores);
    free(all);

    if (!e->cfg.host_budget_bytes)
        e->cfg.host_budget_bytes = plan_host_budget(&e->cfg) / (size_t)(local_size > 0 ? local_size : 1);
    if (!e->cfg.cpu_threads)
        e->cfg.cpu_threads = s->cores.count > 0 ? s->cores.count : adam_default_threads();
    s->device_sharers = e->cfg.device_budget_bytes ? 1
                                                   : node_device_sharers(e->cfg.device_id, comm_local_rank(e->comm),
                                                                         local_size, dev_count(e->backend));
    log_share(e, s, local_size);
    *out = s;
    return STRATA_OK;
}

void node_share_destroy(node_share *s)
{
    free(s);
}

const adam_cores *node_adam_cores(const node_share *s)
{
    return &s->cores;
}

int node_device_share(const node_share *s)
{
    return s->device_sharers;
}

STRATA_API strata_status strata_engine_adam_cores(const strata_engine *e, int *cores, int max, int *count, int *threads)
{
    if (!e || !count || max < 0 || (max > 0 && !cores))
        return err_set(STRATA_EINVAL, "strata_engine_adam_cores: engine and count must not be NULL, max (%d) not "
                       "negative, and cores not NULL when max > 0", max);
    const adam_cores *c = node_adam_cores(e->node);
    *count = c->count;
    for (int i = 0; i < c->count && i < max; i++)
        cores[i] = c->index[i];
    if (threads)
        *threads = e->cfg.cpu_threads;
    return STRATA_OK;
}
