/* Bootstrapping a device communicator over the host one: NCCL (and the like)
 * need every member of a communicator to hold the same unique id, made by one
 * of them. Rank 0 of the group creates it and broadcasts it over the group's
 * MPI communicator. The creator is a parameter, so the CPU tests exercise the
 * exchange with their own ids and the CUDA build passes ncclGetUniqueId
 * (nccl/nccl_id.h). */
#ifndef LOOM_BOOTSTRAP_H
#define LOOM_BOOTSTRAP_H

#include <stddef.h>
#include "comm/comm.h"

/* Fills id[bytes] with a fresh unique id; returns 0 on success. */
typedef int (*loom_id_create_fn)(void *id, size_t bytes, void *ctx);

/* Collective over group: group rank 0 creates the id, every member gets it.
 * Returns 0, or the creator's failure code on every rank (so all fail together). */
int loom_comm_bootstrap_id(loom_comm *group, void *id, size_t bytes, loom_id_create_fn create, void *ctx);

#endif
