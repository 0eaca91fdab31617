/* The shard mapping between canonical tensors and per-rank slices. */
#include <string.h>
#include "tensor_parallel/shard.h"

static int parts_of(const loom_shard_layout *l) { return l->parts > 0 ? l->parts : 1; }

void loom_shard_local_shape(const loom_shard_layout *l, int tp_rank, int tp_size, int64_t *rows, int64_t *cols) {
  (void)tp_rank;
  *rows = l->rows;
  *cols = l->cols;
  if (l->partition_dim == 0) *rows = l->rows / tp_size;
  if (l->partition_dim == 1) *cols = l->cols / tp_size;
}

void loom_shard_locate(const loom_shard_layout *l, int tp_rank, int tp_size, int64_t i, int64_t *row, int64_t *col) {
  *row = i;
  *col = 0;
  if (l->partition_dim == 1) *col = l->cols / tp_size * tp_rank;
  if (l->partition_dim != 0) return;
  const int64_t block = l->rows / parts_of(l), chunk = block / tp_size;
  *row = i / chunk * block + (int64_t)tp_rank * chunk + i % chunk;
}

void loom_shard_copy(const loom_shard_layout *l, int tp_rank, int tp_size, float *full, float *local, int to_local) {
  int64_t rows, cols;
  loom_shard_local_shape(l, tp_rank, tp_size, &rows, &cols);
  for (int64_t i = 0; i < rows; i++) {
    int64_t row, col;
    loom_shard_locate(l, tp_rank, tp_size, i, &row, &col);
    float *g = full + row * l->cols + col, *s = local + i * cols;
    if (to_local) memcpy(s, g, (size_t)cols * sizeof(float));
    else memcpy(g, s, (size_t)cols * sizeof(float));
  }
}
