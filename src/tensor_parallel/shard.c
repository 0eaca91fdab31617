/* The shard mapping between canonical tensors and per-rank slices. */
#include "tensor_parallel/shard.h"

static int parts_of(const loom_shard_layout *l) { return l->parts > 0 ? l->parts : 1; }

int loom_shard_replicas(const loom_shard_layout *l, int tp_size) {
  if (l->partition_dim < 0) return tp_size;
  return l->partition_dim == 0 && l->groups > 0 && tp_size > l->groups ? tp_size / l->groups : 1;
}

/* Ranks a split runs over and this rank's place among them. */
static int pieces(const loom_shard_layout *l, int tp_size) { return tp_size / loom_shard_replicas(l, tp_size); }
static int piece_of(const loom_shard_layout *l, int tp_rank, int tp_size) { return tp_rank / loom_shard_replicas(l, tp_size); }

void loom_shard_local_shape(const loom_shard_layout *l, int tp_rank, int tp_size, int64_t *rows, int64_t *cols) {
  (void)tp_rank;
  *rows = l->rows;
  *cols = l->cols;
  if (l->partition_dim == 0) *rows = l->rows / pieces(l, tp_size);
  if (l->partition_dim == 1) *cols = l->cols / tp_size;
}

void loom_shard_locate(const loom_shard_layout *l, int tp_rank, int tp_size, int64_t i, int64_t *row, int64_t *col) {
  *row = i;
  *col = 0;
  if (l->partition_dim == 1) *col = l->cols / tp_size * tp_rank;
  if (l->partition_dim != 0) return;
  const int64_t block = l->rows / parts_of(l), chunk = block / pieces(l, tp_size);
  *row = i / chunk * block + (int64_t)piece_of(l, tp_rank, tp_size) * chunk + i % chunk;
}
