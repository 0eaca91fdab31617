/* How a canonical [rows, cols] parameter is split across a tensor-parallel
 * group, and where each local element sits in the full tensor.
 *
 * partition_dim 0 splits rows: the rows are `parts` equal blocks (3 for
 * c_attn's q|k|v, else 1) and rank r owns chunk r of every block, so its
 * local rows are its heads' q rows, then k rows, then v rows. partition_dim 1
 * splits columns (row-parallel weights). -1 replicates. `groups` caps a
 * row split: a tensor of that many row groups (grouped-query attention's
 * key/value heads) splits into at most `groups` pieces, and when tp exceeds
 * them each piece is replicated over tp / groups consecutive ranks, as
 * Megatron and vLLM replicate key/value heads. Checkpoints, init and gathers
 * all go through this one mapping. */
#ifndef LOOM_SHARD_H
#define LOOM_SHARD_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
  int partition_dim; /* -1, 0 or 1 */
  int parts;         /* row blocks for partition_dim 0 (1 if 0 given) */
  int groups;        /* partition_dim 0: row groups that must stay whole (0: no limit) */
  int64_t rows, cols; /* global shape; cols is 1 for vectors */
} loom_shard_layout;

/* This rank's local shape. */
void loom_shard_local_shape(const loom_shard_layout *l, int tp_rank, int tp_size, int64_t *rows, int64_t *cols);
/* Global row of local row i, and the global column of local column 0. */
/* Ranks holding each piece: tp_size for a replicated tensor, tp / groups for
 * a capped split past its groups, else 1. */
int loom_shard_replicas(const loom_shard_layout *l, int tp_size);
/* Whether this rank is the one of its piece's replicas that counts it (in
 * the grad norm) and writes it (to checkpoints): the first. */
static inline bool loom_shard_primary(const loom_shard_layout *l, int tp_rank, int tp_size) {
  return tp_rank % loom_shard_replicas(l, tp_size) == 0;
}
void loom_shard_locate(const loom_shard_layout *l, int tp_rank, int tp_size, int64_t i, int64_t *row, int64_t *col);

#endif
