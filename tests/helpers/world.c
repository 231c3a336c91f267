#include "world.h"

#include <stdio.h>
#include <stdlib.h>

#include "comm/comm.h"
#include "testlib.h"

t_world t_world_open(void)
{
    t_world w = {0};
    T_CHECK(strata_comm_create(&w.comm) == STRATA_OK, "strata_comm_create: %s", strata_last_error(NULL));
    if (!w.comm)
        exit(t_done());
    w.rank = strata_comm_rank(w.comm);
    w.size = strata_comm_size(w.comm);
    w.seed = t_rng_seed();
    T_OK(comm_broadcast(w.comm, &w.seed, 1, COMM_U64, 0));
    return w;
}

const char *t_world_scratch(strata_comm *comm, const char *test, char *shared, size_t shared_bytes)
{
    char name[128];
    snprintf(name, sizeof name, "%s_%d_r%d", test, strata_comm_size(comm), strata_comm_rank(comm));
    const char *mine = t_scratch_dir(name);
    snprintf(shared, shared_bytes, "%s", mine);
    T_OK(comm_broadcast(comm, shared, shared_bytes, COMM_BYTE, 0));
    return mine;
}

void t_world_agree(strata_comm *comm, const char *what, const float *weights, size_t n)
{
    int size = strata_comm_size(comm);
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the bytes */
    const unsigned char *p = (const unsigned char *)weights;
    for (size_t i = 0; i < n * sizeof *weights; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    uint64_t *all = calloc((size_t)size, sizeof *all);
    T_CHECK(all && comm_allgather(comm, &h, all, 1, COMM_U64) == STRATA_OK, "allgather: %s",
            strata_last_error(NULL));
    for (int r = 1; all && r < size; r++)
        T_CHECK(all[r] == all[0], "%s: rank %d's weights differ from rank 0's (checksums %016llx vs %016llx)", what,
                r, (unsigned long long)all[r], (unsigned long long)all[0]);
    free(all);
}
