/* Entering and leaving tensor-parallel regions, and vocab-parallel loss glue. */
#include <math.h>
#include <string.h>
#include "core/check.h"
#include "tensor_parallel/mappings.h"

static void copy_if_apart(const loom_ops *ops, float *dst, const float *src, size_t n) {
  if (dst != src) ops->mem->copy(ops->mem, dst, src, n * sizeof(float));
}

/* The conjugate pairs share their two collectives: entering forward and
 * leaving backward gather the sequence shards (or copy when there are none);
 * entering backward and leaving forward sum the partial results over the group
 * (scattered back to sequence shards under sequence parallelism).
 * In bf16 runs (tp->staging) both move bf16, half the bytes, as Megatron's
 * bf16 activations do: the values are packed into the staging, exchanged
 * and widened back. A gather moves bf16 values exactly; a sum rounds its
 * partial results to bf16 first and each partial sum as it is formed
 * (comm.h), as a bf16 all-reduce on GPUs does. */
static void gather_to_full(const loom_tp *tp, const loom_ops *ops, const float *local, float *full, size_t n_local) {
  if (!tp->sequence_parallel) {
    copy_if_apart(ops, full, local, n_local);
  } else if (tp->staging) {
    uint16_t *gathered = tp->staging + n_local; /* past the send loom_tp_gather_packed stages */
    loom_tp_gather_packed(tp, ops, local, gathered, n_local);
    ops->from_bf16(ops, full, gathered, n_local * (size_t)tp->size);
  } else {
    loom_comm_allgather(tp->group, local, full, n_local);
  }
}

static void reduce_to_local(const loom_tp *tp, const loom_ops *ops, float *partial_full, float *local, size_t n_local) {
  if (tp->staging) {
    const size_t n_full = tp->sequence_parallel ? n_local * (size_t)tp->size : n_local;
    uint16_t *bits = tp->staging, *mine = tp->sequence_parallel ? tp->staging + n_full : bits;
    ops->to_bf16(ops, bits, partial_full, n_full);
    if (tp->sequence_parallel) loom_comm_reduce_scatter_typed(tp->group, bits, mine, n_local, LOOM_DTYPE_BF16);
    else loom_comm_allreduce_typed(tp->group, bits, n_local, LOOM_DTYPE_BF16, LOOM_REDUCE_SUM);
    ops->from_bf16(ops, local, mine, n_local);
    return;
  }
  if (tp->sequence_parallel) {
    loom_comm_reduce_scatter(tp->group, partial_full, local, n_local);
    return;
  }
  loom_comm_allreduce(tp->group, partial_full, n_local, LOOM_REDUCE_SUM);
  copy_if_apart(ops, local, partial_full, n_local);
}

void loom_tp_enter_forward(const loom_tp *tp, const loom_ops *ops, const float *local, float *full, size_t n_local) {
  gather_to_full(tp, ops, local, full, n_local);
}

void loom_tp_enter_backward(const loom_tp *tp, const loom_ops *ops, float *dfull, float *dlocal, size_t n_local) {
  reduce_to_local(tp, ops, dfull, dlocal, n_local);
}

void loom_tp_exit_forward(const loom_tp *tp, const loom_ops *ops, float *partial_full, float *local, size_t n_local) {
  reduce_to_local(tp, ops, partial_full, local, n_local);
}

void loom_tp_exit_backward(const loom_tp *tp, const loom_ops *ops, const float *dlocal, float *dfull, size_t n_local) {
  gather_to_full(tp, ops, dlocal, dfull, n_local);
}

void loom_tp_gather_packed(const loom_tp *tp, const loom_ops *ops, const float *local, uint16_t *full_bits,
                           size_t n_local) {
  if (!tp->sequence_parallel) {
    ops->to_bf16(ops, full_bits, local, n_local);
    return;
  }
  LOOM_CHECK(tp->staging, "a bf16 gather along the sequence stages its send");
  ops->to_bf16(ops, tp->staging, local, n_local);
  loom_comm_allgather_typed(tp->group, tp->staging, full_bits, n_local, LOOM_DTYPE_BF16);
}

void loom_tp_gather_columns(const loom_tp *tp, const loom_ops *ops, const float *local, float *full, float *scratch,
                            int N, int c) {
  if (!tp->group) {
    copy_if_apart(ops, full, local, (size_t)N * c);
    return;
  }
  /* all-gather yields [rank][N][c]; interleave to [N][rank][c]. */
  const size_t row = (size_t)c * sizeof(float);
  loom_comm_allgather(tp->group, local, scratch, (size_t)N * c);
  for (int r = 0; r < tp->size; r++)
    ops->mem->copy_2d(ops->mem, full + (size_t)r * c, row * tp->size, scratch + (size_t)r * N * c, row, row, (size_t)N);
}

void loom_tp_split_columns(const loom_tp *tp, const loom_ops *ops, const float *full, float *local, int N, int c) {
  if (!tp->group) {
    copy_if_apart(ops, local, full, (size_t)N * c);
    return;
  }
  const size_t row = (size_t)c * sizeof(float);
  ops->mem->copy_2d(ops->mem, local, row, full + (size_t)tp->rank * c, row * tp->size, row, (size_t)N);
}

int loom_tp_local_rows(const loom_tp *tp, int rows) { return tp->sequence_parallel ? rows / tp->size : rows; }
