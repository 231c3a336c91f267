/*
 * This rank's share of its machine. The per-machine defaults — the host budget (3/4 of RAM), the Adam team
 * (every core) and the device budget (all free memory of a GPU) — are divided among the ranks that share what
 * they measure, so that N ranks on one node plan for the node once, not N times:
 *
 *   host budget    strata.host_budget_bytes 0: 3/4 of RAM / the ranks of this host (comm_local_size). A budget
 *                  the user gave is per rank and kept as given.
 *   Adam cores     the cores this process may run on (its mpirun binding, else the machine's), divided among
 *                  the ranks of this host bound to the same cores, in contiguous blocks in world-rank order; when
 *                  several such ranks have GPUs whose NUMA node hwloc can tell, each NUMA node's cores are divided
 *                  among the ranks whose GPU sits there. A rank alone keeps every core. strata.cpu_threads 0
 *                  means one thread per core of the share; a count the user gave is kept, its threads bound to the
 *                  share's cores too (thread t to core t mod share), never to another rank's.
 *   device budget  strata.device_budget_bytes 0 on a GPU that several ranks of this host use (they pick
 *                  device_id + local rank, round-robin): node_device_sharers of them divide it (dev_options).
 *
 * The engine's copy of the config then holds the resolved cpu_threads and host_budget_bytes (as it holds the
 * resolved tiers), so every reader of it — the step, the planner, a checkpoint's manifest — sees this rank's share.
 */
#ifndef STRATA_ENGINE_NODE_SHARE_H
#define STRATA_ENGINE_NODE_SHARE_H

#include "cpu_adam/driver.h"
#include "strata.h"

typedef struct node_share node_share;
struct strata_engine;

/* How many of a host's local_size ranks use the GPU that local rank local_rank uses, when rank r of the host
 * takes GPU (device_id + r) mod gpus. 1 when gpus <= 0. */
int node_device_sharers(int device_id, int local_rank, int local_size, int gpus);

/* Divides the node among its ranks (see above) and writes the resolved cpu_threads and host_budget_bytes into
 * e->cfg. A collective over e's world when it has more than one rank: every rank that joined the world calls it,
 * with local = how its own create went so far; a failed rank takes part (and gets local back), and the others
 * leave it out of the division. STRATA_ENOMEM; *out is NULL on failure. */
strata_status node_share_create(struct strata_engine *e, strata_status local, node_share **out);
/* NULL is a no-op. */
void node_share_destroy(node_share *s);

/* The cores this rank's Adam threads are bound to (count 0: unbound); valid until node_share_destroy. */
const adam_cores *node_adam_cores(const node_share *s);
/* How many ranks use this rank's GPU (1 without one, or with a budget the user gave). */
int node_device_share(const node_share *s);

#endif
