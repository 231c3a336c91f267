/* Finding the processes of the ranks on this host (see comm_peers.h). */
#include "comm/comm_peers.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/crc32c.h"

/* The host as the ranks compare it: the crc32c of its name (as engine/plan/node_share.c groups ranks by host). */
static uint64_t host_hash(void)
{
    char name[256] = "";
    gethostname(name, sizeof name - 1);
    return crc32c(0, name, strlen(name));
}

/* The state letter and start time of process pid from /proc/PID/stat; false when there is no such process. */
static bool read_stat(int pid, char *state, uint64_t *start_ticks)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* "pid (comm) state ppid ..." where comm may hold spaces and parentheses: fields count from the last ')'. */
    const char *p = strrchr(buf, ')');
    if (!p)
        return false;
    unsigned long long start = 0;
    /* After ") ": state is field 3, starttime field 22, so 18 fields are skipped between them. */
    if (sscanf(p + 1, " %c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu", state,
               &start) != 2)
        return false;
    *start_ticks = start;
    return true;
}

void comm_peer_self(comm_peer *out)
{
    memset(out, 0, sizeof *out);
    out->pid = (int32_t)getpid();
    out->host = host_hash();
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    static _Atomic uint64_t made;
    out->nonce = ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^ ((uint64_t)out->pid << 40) ^
                 (atomic_fetch_add(&made, 1) * 0x9e3779b97f4a7c15ull);
    char state;
    uint64_t start = 0;
    if (read_stat(out->pid, &state, &start))
        out->start_ticks = start;
}

int comm_peers_gone(const comm_peer *all, int size, int self, char *msg, size_t len)
{
    for (int r = 0; r < size; r++) {
        const comm_peer *p = &all[r];
        if (r == self || p->host != all[self].host || p->pid <= 0 || !p->start_ticks)
            continue;
        char state = '?';
        uint64_t start = 0;
        bool there = read_stat(p->pid, &state, &start);
        if (there && start == p->start_ticks && state != 'Z' && state != 'X')
            continue;
        snprintf(msg, len,
                 "rank %d (pid %d on this host) is gone: it %s without leaving the world (killed by a signal, or an "
                 "exit that skipped strata_comm_destroy); its launcher's output says why",
                 r, p->pid, there && start == p->start_ticks ? "exited" : "was killed or exited");
        return r;
    }
    return -1;
}
