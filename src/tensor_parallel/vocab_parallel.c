/* Vocab-parallel embedding and cross-entropy. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "tensor_parallel/mappings.h"
#include "tensor_parallel/vocab_parallel.h"

loom_vocab_range loom_vocab_range_of(const loom_tp *tp, int vocab, int padded_vocab) {
  loom_vocab_range v;
  v.rows = padded_vocab / tp->size;
  v.start = tp->rank * v.rows;
  const int real = vocab - v.start;
  v.valid = real < 0 ? 0 : real > v.rows ? v.rows : real;
  return v;
}

void loom_vocab_parallel_embedding_forward(const loom_tp *tp, const loom_ops *ops, float *out, float *full,
                                           const int *tokens, loom_linear_weight wte, loom_vocab_range v, int T, int B,
                                           int h) {
  if (wte.bf16) ops->embedding_forward_bf16(ops, full, tokens, wte.bf16, v.start, v.rows, T, B, h);
  else ops->embedding_forward(ops, full, tokens, wte.f32, v.start, v.rows, T, B, h);
  loom_tp_exit_forward(tp, ops, full, out, (size_t)loom_tp_local_rows(tp, T) * B * h);
}

void loom_vocab_parallel_embedding_backward(const loom_tp *tp, const loom_ops *ops, float *dwte, const float *dout,
                                            float *dfull, const int *tokens, loom_vocab_range v, int T, int B, int h) {
  loom_tp_exit_backward(tp, ops, dout, dfull, (size_t)loom_tp_local_rows(tp, T) * B * h);
  ops->embedding_backward(ops, dwte, dfull, tokens, v.start, v.rows, T, B, h);
}

float loom_vocab_parallel_cross_entropy(const loom_tp *tp, const loom_ops *ops, float *losses, float *lse,
                                        float *picked, float *scratch, const float *logits, const int *targets,
                                        loom_vocab_range v, int N) {
  ops->logsumexp(ops, lse, logits, N, v.valid, v.rows);
  loom_tp_combine_logsumexp(tp, ops, lse, scratch, N);
  ops->pick_targets(ops, picked, logits, targets, v.start, N, v.valid, v.rows);
  loom_tp_combine_picked(tp, picked, N);
  ops->crossentropy_losses(ops, losses, lse, picked, targets, N);
  /* The mean comes to the host: each token's loss and whether it was scored. */
  float *host = loom_xmalloc((size_t)N * (sizeof(float) + sizeof(int)), "token losses");
  int *scored = (int *)(host + N);
  ops->mem->to_host(ops->mem, host, losses, (size_t)N * sizeof(float));
  ops->mem->to_host(ops->mem, scored, targets, (size_t)N * sizeof(int));
  double sum = 0.0;
  int counted = 0;
  for (int i = 0; i < N; i++) {
    if (scored[i] < 0) continue;
    sum += host[i];
    counted++;
  }
  free(host);
  return counted ? (float)(sum / counted) : 0.0f;
}

void loom_vocab_parallel_cross_entropy_backward(const loom_ops *ops, float *dlogits, const float *logits,
                                                const float *lse, const int *targets, loom_vocab_range v,
                                                float dloss, int N) {
  ops->crossentropy_backward(ops, dlogits, logits, lse, targets, v.start, dloss, N, v.valid, v.rows);
}

/* ---- combining each rank's vocabulary range ---- */

void loom_tp_combine_logsumexp(const loom_tp *tp, const loom_ops *ops, float *lse, float *scratch, int n) {
  if (!tp->group) return;
  ops->mem->copy(ops->mem, scratch, lse, (size_t)n * sizeof(float));
  loom_comm_allreduce(tp->group, scratch, (size_t)n, LOOM_REDUCE_MAX); /* global max of the partial lse */
  ops->exp_shifted(ops, lse, scratch, (size_t)n);                           /* 0 for a rank with no vocab (-inf) */
  loom_comm_allreduce(tp->group, lse, (size_t)n, LOOM_REDUCE_SUM);
  ops->log_shifted(ops, lse, scratch, (size_t)n);
}

void loom_tp_combine_picked(const loom_tp *tp, float *picked, int n) {
  loom_comm_allreduce(tp->group, picked, (size_t)n, LOOM_REDUCE_SUM);
}

void loom_tp_combine_argmax(const loom_tp *tp, float *val, int *idx, float *scratch, int n) {
  if (!tp->group) return;
  memcpy(scratch, val, (size_t)n * sizeof(float));
  loom_comm_allreduce(tp->group, val, (size_t)n, LOOM_REDUCE_MAX);
  /* Ranks holding the winning value offer -id (as int32: ids stay exact); the max of those is the lowest id. */
  _Static_assert(sizeof(int) == sizeof(int32_t), "token ids are int32");
  for (int i = 0; i < n; i++) idx[i] = idx[i] >= 0 && scratch[i] == val[i] ? -idx[i] : INT32_MIN;
  loom_comm_allreduce_typed(tp->group, idx, (size_t)n, LOOM_DTYPE_I32, LOOM_REDUCE_MAX);
  for (int i = 0; i < n; i++) idx[i] = -idx[i];
}
