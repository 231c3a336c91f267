/*
 * Which ranks on this host are still running: a rank that was killed, or exited without leaving the world, sends
 * no message, so the survivors look for its process instead (each rank's pid, host and start time are exchanged
 * when the comm is made). Ranks on other hosts cannot be seen from here; the deadline covers them. Private to comm/.
 */
#ifndef STRATA_COMM_COMM_PEERS_H
#define STRATA_COMM_COMM_PEERS_H

#include <stddef.h>
#include <stdint.h>

/* One rank's process, as the others can find it. */
typedef struct comm_peer {
    uint64_t host;       /* the crc32c of the host name */
    uint64_t start_ticks; /* the process's start time (/proc/PID/stat), so that a reused pid is not taken for it */
    uint64_t nonce;      /* random: rank 0's names the world in its control messages */
    int32_t pid;
    int32_t pad;
} comm_peer;

/* This process. */
void comm_peer_self(comm_peer *out);
/* The first rank of all[0..size) on this host (self's) other than self whose process is gone (no such process,
 * another process with its pid, or a zombie): its rank, with msg saying so; -1 when every local peer runs. */
int comm_peers_gone(const comm_peer *all, int size, int self, char *msg, size_t len);

#endif
