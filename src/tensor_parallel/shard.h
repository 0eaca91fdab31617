/* How a canonical [rows, cols] parameter is split across a tensor-parallel
 * group, and where each local element sits in the full tensor.
 *
 * partition_dim 0 splits rows: the rows are `parts` equal blocks (3 for
 * c_attn's q|k|v, else 1) and rank r owns chunk r of every block, so its
 * local rows are its heads' q rows, then k rows, then v rows. partition_dim 1
 * splits columns (row-parallel weights). -1 replicates. Checkpoints, init
 * and gathers all go through this one mapping. */
#ifndef LOOM_SHARD_H
#define LOOM_SHARD_H

#include <stdint.h>

typedef struct {
  int partition_dim; /* -1, 0 or 1 */
  int parts;         /* row blocks for partition_dim 0 (1 if 0 given) */
  int64_t rows, cols; /* global shape; cols is 1 for vectors */
} loom_shard_layout;

/* This rank's local shape. */
void loom_shard_local_shape(const loom_shard_layout *l, int tp_rank, int tp_size, int64_t *rows, int64_t *cols);
/* Global row of local row i, and the global column of local column 0. */
void loom_shard_locate(const loom_shard_layout *l, int tp_rank, int tp_size, int64_t i, int64_t *row, int64_t *col);

#endif
