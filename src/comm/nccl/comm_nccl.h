/* The communicator interface over NCCL, for device buffers (CUDA builds with
 * NCCL). Each NCCL communicator is made from an MPI group: its rank 0
 * creates the unique id and broadcasts it over MPI (comm/bootstrap.h).
 *
 * Ordering: blocking collectives (the tensor-parallel ones) are queued on
 * the compute stream, so they run in order with the kernels around them and
 * the host does not wait. Non-blocking ones (iallreduce: the data-parallel
 * buckets; isend/irecv: pipeline transfers) run on a separate comm stream
 * after an event from the compute stream, so they overlap with compute;
 * wait() makes the compute stream wait for them. Each isend/irecv is one
 * grouped ncclSend/ncclRecv. */
#ifndef LOOM_COMM_NCCL_H
#define LOOM_COMM_NCCL_H

#include "comm/comm.h"

/* Collective over mpi_group; NULL (and a message on stderr) if NCCL fails.
 * The new group keeps mpi_group for splitting and bootstrapping; the
 * caller keeps ownership of mpi_group. */
loom_comm *loom_comm_nccl_create(loom_comm *mpi_group, void *compute_stream);

#endif
