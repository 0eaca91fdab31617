/* NCCL's unique id for loom_comm_bootstrap_id (CUDA builds with NCCL only):
 *   ncclUniqueId id;
 *   loom_comm_bootstrap_id(group, &id, sizeof id, loom_nccl_create_id, NULL);
 *   ncclCommInitRank(&comm, loom_comm_size(group), id, loom_comm_rank(group)); */
#ifndef LOOM_NCCL_ID_H
#define LOOM_NCCL_ID_H

#include <stddef.h>

/* ncclGetUniqueId into id (bytes must be sizeof(ncclUniqueId)); returns its ncclResult_t. */
int loom_nccl_create_id(void *id, size_t bytes, void *ctx);

#endif
