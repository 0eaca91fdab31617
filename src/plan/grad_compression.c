/* Which grads PowerSGD compresses, and what that costs. */
#include "plan/grad_compression.h"

loom_powersgd_shape loom_powersgd_shape_of(const loom_tensor *t, int rank) {
  loom_powersgd_shape s = {false, 0, 0};
  if (t->ndim != 2 || rank < 1) return s;
  const int64_t n = t->shape[0], m = t->shape[1];
  if ((n + m) * rank >= n * m) return s;
  return (loom_powersgd_shape){true, (int)n, (int)m};
}

int64_t loom_powersgd_sent_floats(const loom_tensor *t, int rank) {
  const loom_powersgd_shape s = loom_powersgd_shape_of(t, rank);
  return s.compressed ? ((int64_t)s.rows + s.cols) * rank : (int64_t)loom_tensor_numel(t);
}

int64_t loom_powersgd_state_floats(const loom_tensor *t, int rank) {
  const loom_powersgd_shape s = loom_powersgd_shape_of(t, rank);
  return s.compressed ? (int64_t)s.rows * s.cols + ((int64_t)s.rows + s.cols) * rank : 0;
}
