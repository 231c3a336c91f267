/*
 * comm/comm.h — the collective contract, written once; every implementation meets it.
 *
 * A comm is one rank's handle on a data-parallel world of `size` ranks (public name: strata_comm). The
 * engine partitions model state across the world (ZeRO stages) and moves it with these collectives.
 * Three implementations, each in its own file, chosen when the comm is made:
 *
 *   single   world 1, no dependency (comm_single.c). Every collective is a copy or nothing.
 *   mpi      host buffers over an MPI communicator (comm_mpi.c, the only file that includes mpi.h). Device
 *            buffers are staged through pinned host memory, so several ranks may share one GPU.
 *   nccl     device buffers over an NCCL communicator, bootstrapped over MPI (comm_nccl.c, the only file
 *            that includes nccl.h); host buffers go over its MPI communicator.
 *
 * Threads and ordering. MPI and NCCL both require every rank to issue the same collectives in the same
 * order. Every collective of a comm therefore runs on the comm's own worker thread, in the order the
 * calls were queued (one FIFO per comm): a blocking call queues and waits; comm_start_* queues and returns
 * a request. Only that thread ever calls MPI, so MPI_THREAD_SERIALIZED is enough. Calls on one comm are
 * thread-safe; whichever threads call, the queue order is the issue order, which is what must agree across
 * ranks.
 *
 * Device buffers. comm_dev_* take device pointers of dev and a stream: the collective starts after the work
 * queued on `after` so far and is complete when the call (or the request) completes; NCCL runs it on its
 * own CUDA stream ordered by events, MPI copies to pinned staging, runs the host collective, and copies
 * back. On the host backend device memory is host memory and the host path is used directly.
 *
 * Agreement. Before each collective the ranks compare what they are about to run (kind, sizes, number): a rank
 * in a different call fails every rank with STRATA_ECOMM naming both calls and ranks (comm_ops.check_order). A
 * rank that destroys its comm tells the others; one waiting in a collective that rank never reached fails naming
 * it, and so does one whose peer on the same host was killed (its process is gone).
 *
 * Failures. A failed collective returns a status with err_set detail naming the operation, the rank and
 * the library's message. A rank that fails between collectives calls comm_abort_world, which makes every
 * other rank's pending and later collectives fail within a bounded time (comm_set_timeout) with a message
 * naming the rank that failed, instead of hanging.
 *
 * Counting. Every collective adds its payload to the comm's counter (comm_bytes): the size of the
 * all-gathered output, the reduce-scattered input, twice the all-reduced buffer (a reduce-scatter plus an
 * all-gather), and the broadcast buffer. Barriers and the engine's scalar checks are not counted.
 */
#ifndef STRATA_COMM_COMM_H
#define STRATA_COMM_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/device.h"
#include "strata.h"

typedef struct strata_comm comm;
typedef struct comm_req comm_req;

typedef enum comm_dtype { COMM_BYTE, COMM_F32, COMM_F64, COMM_U64, COMM_I32 } comm_dtype;
typedef enum comm_op { COMM_SUM, COMM_MAX, COMM_MIN } comm_op;

/* Bytes of one element; 0 for a value that is not a comm_dtype. */
size_t comm_dtype_bytes(comm_dtype dt);

/* ---------------------------------------------------------------- making a comm */

/* World 1, no dependency. */
strata_status comm_create_single(comm **out);
/* Over the embedder's MPI communicator (mpi_comm points at an MPI_Comm; NULL = MPI_COMM_WORLD), which is
 * duplicated so strata's traffic never matches the embedder's. MPI must be initialised with at least
 * MPI_THREAD_SERIALIZED (STRATA_EUNSUPPORTED names the level otherwise). STRATA_EUNSUPPORTED when strata
 * was built without MPI. */
strata_status comm_create_mpi(const void *mpi_comm, comm **out);
/* The launcher's world: when the process was started by mpirun (Open MPI, PMIx or PMI environment),
 * initialises MPI (MPI_THREAD_SERIALIZED) and returns a comm over MPI_COMM_WORLD; MPI is finalised by
 * comm_destroy of that comm. Otherwise world 1 (comm_create_single). */
strata_status comm_create_from_env(comm **out);
/* Adds NCCL for device buffers on dev: with nccl_comm (an ncclComm_t the embedder owns) or, when NULL,
 * a communicator made over c's MPI world (rank 0's unique id broadcast over MPI). STRATA_EUNSUPPORTED when
 * strata was built without NCCL, dev is not a CUDA device, or c is not an MPI comm of size > 1 and
 * nccl_comm is NULL (world 1 needs no NCCL); NCCL's own error otherwise (two ranks on one GPU). */
strata_status comm_attach_nccl(comm *c, device *dev, void *nccl_comm);
/* Frees what the comm made on dev (staging stream and pinned buffers, an NCCL communicator it made): call it
 * before dev_destroy(dev) when the comm outlives the device, as it outlives an engine. Waits for the
 * collectives queued before it. NULL comm or dev is a no-op. */
void comm_detach_device(comm *c, device *dev);
/* Drains the queue, frees the comm (and finalises MPI if comm_create_from_env initialised it).
 * NULL is a no-op. */
void comm_destroy(comm *c);

int comm_rank(const comm *c);
int comm_size(const comm *c);
/* Rank and size among the ranks on this host (MPI_COMM_TYPE_SHARED); 0 and 1 for single. */
int comm_local_rank(const comm *c);
int comm_local_size(const comm *c);
/* "single", "mpi", "mpi+nccl" */
const char *comm_kind_name(const comm *c);
/* Payload bytes of every collective so far (see Counting). */
uint64_t comm_bytes(const comm *c);

/* Bounded waits: a collective that has not completed after timeout_ms (default 120000; 0 = forever)
 * fails with STRATA_ECOMM naming the operation. */
void comm_set_timeout(comm *c, uint32_t timeout_ms);
/* The largest timeout in seconds (strata_comm_set_timeout, strata.comm_timeout_s): what fits timeout_ms. */
#define COMM_TIMEOUT_MAX_S 4000000.0
/* This rank failed with message why: tells every other rank (their collectives fail with STRATA_ECOMM,
 * "rank R failed: why"), and makes this rank's later collectives fail the same way. */
void comm_abort_world(comm *c, const char *why);

/* ---------------------------------------------------------------- host buffers (blocking) */

/* In place over count elements; every rank gets the result. */
strata_status comm_allreduce(comm *c, void *buf, size_t count, comm_dtype dt, comm_op op);
/* As comm_allreduce, not counted in comm_bytes: the engine's scalar checks (overflow flag, clipping norm,
 * config agreement), which Counting leaves out. */
strata_status comm_allreduce_uncounted(comm *c, void *buf, size_t count, comm_dtype dt, comm_op op);
/* send holds size * recv_count elements; rank r receives the sum of every rank's block r. */
strata_status comm_reduce_scatter(comm *c, const void *send, void *recv, size_t recv_count, comm_dtype dt);
/* recv receives size blocks of send_count elements, block r from rank r. In place when
 * send == recv + rank * send_count elements. */
strata_status comm_allgather(comm *c, const void *send, void *recv, size_t send_count, comm_dtype dt);
strata_status comm_broadcast(comm *c, void *buf, size_t count, comm_dtype dt, int root);
strata_status comm_barrier(comm *c);

/* ---------------------------------------------------------------- asynchronous */

/* As the blocking calls, but queued: the call returns at once, the collective runs in queue order.
 * Buffers must stay valid until comm_wait. *out is NULL on failure. */
strata_status comm_start_allgather(comm *c, const void *send, void *recv, size_t send_count, comm_dtype dt,
                                   comm_req **out);
strata_status comm_start_reduce_scatter(comm *c, const void *send, void *recv, size_t recv_count,
                                        comm_dtype dt, comm_req **out);
/* Waits for the request, frees it, and returns its status. NULL is STRATA_OK. */
strata_status comm_wait(comm_req *r);
/* Whether it completed; never blocks. */
bool comm_test(comm_req *r);

/* ---------------------------------------------------------------- device buffers */

/* As comm_allgather / comm_reduce_scatter on device memory of dev, after the work queued on `after`. */
strata_status comm_dev_allgather(comm *c, device *dev, dev_stream *after, const void *send, void *recv,
                                 size_t send_count, comm_dtype dt);
strata_status comm_dev_reduce_scatter(comm *c, device *dev, dev_stream *after, const void *send, void *recv,
                                      size_t recv_count, comm_dtype dt);

#endif
