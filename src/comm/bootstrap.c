/* Unique-id bootstrap over a host communicator. */
#include <string.h>
#include "comm/bootstrap.h"

int loom_comm_bootstrap_id(loom_comm *group, void *id, size_t bytes, loom_id_create_fn create, void *ctx) {
  /* The creator's status travels with the id, so a failure on rank 0 fails every rank. */
  unsigned char msg[4 + 1024];
  if (bytes > sizeof msg - 4) return -1;
  int code = 0;
  if (loom_comm_rank(group) == 0) code = create(id, bytes, ctx);
  memcpy(msg, &code, 4);
  if (loom_comm_rank(group) == 0) memcpy(msg + 4, id, bytes);
  loom_comm_broadcast_bytes(group, msg, 4 + bytes, 0);
  memcpy(&code, msg, 4);
  if (code == 0) memcpy(id, msg + 4, bytes);
  return code;
}
