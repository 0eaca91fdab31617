/* PowerSGD's rule for one grad tensor: the one source for the runtime
 * (optim/powersgd) and the plan's estimates. A tensor of two dimensions is
 * a matrix M [n, m]; it crosses data parallelism as its rank-r factors,
 * P [n, r] and Q [m, r], when they are smaller than it, (n + m) r < n m.
 * Every other tensor (biases, norms, a matrix too small to gain) crosses
 * whole. Each compressed matrix keeps its error feedback [n, m] and its P
 * and Q (Q is the next step's warm start) on every replica. */
#ifndef LOOM_GRAD_COMPRESSION_H
#define LOOM_GRAD_COMPRESSION_H

#include <stdbool.h>
#include <stdint.h>
#include "core/tensor.h"

typedef struct {
  bool compressed;
  int rows, cols; /* n and m when compressed */
} loom_powersgd_shape;

loom_powersgd_shape loom_powersgd_shape_of(const loom_tensor *t, int rank);
/* Floats the tensor sends per step (its factors, or all of it). */
int64_t loom_powersgd_sent_floats(const loom_tensor *t, int rank);
/* Floats of state it keeps: error feedback, P and Q (0 when not compressed). */
int64_t loom_powersgd_state_floats(const loom_tensor *t, int rank);

#endif
