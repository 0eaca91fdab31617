/* NCCL's unique id (built when LOOM_CUDA finds NCCL). */
#include <nccl.h>
#include <string.h>
#include "comm/nccl/nccl_id.h"

int loom_nccl_create_id(void *id, size_t bytes, void *ctx) {
  (void)ctx;
  if (bytes != sizeof(ncclUniqueId)) return (int)ncclInvalidArgument;
  ncclUniqueId made;
  const ncclResult_t r = ncclGetUniqueId(&made);
  if (r == ncclSuccess) memcpy(id, &made, sizeof made);
  return (int)r;
}
