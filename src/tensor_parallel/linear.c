/* Column- and row-parallel linears over the op table and the region mappings. */
#include "tensor_parallel/linear.h"
#include "tensor_parallel/mappings.h"

void loom_column_parallel_forward(const loom_tp *tp, const loom_ops *ops, float *out, float *inp_full,
                                  const float *inp, const float *w, const float *b, int N, int n, int in,
                                  int out_local) {
  loom_tp_enter_forward(tp, ops, inp, inp_full, (size_t)n * in);
  ops->matmul_forward(ops, out, inp_full, w, b, N, in, out_local);
}

void loom_column_parallel_backward(const loom_tp *tp, const loom_ops *ops, float *dinp, float *dinp_full,
                                   float *dw, float *db, const float *dout, const float *inp_full,
                                   const float *w, int N, int n, int in, int out_local) {
  loom_mem_zero(ops->mem, dinp_full, (size_t)N * in);
  ops->matmul_backward(ops, dinp_full, dw, db, dout, inp_full, w, N, in, out_local);
  loom_tp_enter_backward(tp, ops, dinp_full, dinp, (size_t)n * in);
}

void loom_column_parallel_gather_output(const loom_tp *tp, const loom_ops *ops, const float *out, float *full,
                                        float *scratch, int N, int out_local) {
  loom_tp_gather_columns(tp, ops, out, full, scratch, N, out_local);
}

void loom_column_parallel_gather_output_backward(const loom_tp *tp, const loom_ops *ops, const float *dfull,
                                                 float *dout, int N, int out_local) {
  loom_tp_split_columns(tp, ops, dfull, dout, N, out_local);
}

void loom_row_parallel_forward(const loom_tp *tp, const loom_ops *ops, float *out, float *partial,
                               const float *inp, const float *w, const float *b, int N, int n, int in_local,
                               int out_features) {
  ops->matmul_forward(ops, partial, inp, w, NULL, N, in_local, out_features);
  loom_tp_exit_forward(tp, ops, partial, out, (size_t)n * out_features);
  if (b) ops->bias_forward(ops, out, b, n, out_features); /* once, after the reduction */
}

void loom_row_parallel_backward(const loom_tp *tp, const loom_ops *ops, float *dinp, float *dw, float *db,
                                const float *dout, float *dout_full, const float *inp, const float *w, int N,
                                int n, int in_local, int out_features) {
  if (db) ops->bias_backward(ops, db, dout, n, out_features);
  loom_tp_exit_backward(tp, ops, dout, dout_full, (size_t)n * out_features);
  ops->matmul_backward(ops, dinp, dw, NULL, dout_full, inp, w, N, in_local, out_features);
}

void loom_linear_weight_grad(const loom_ops *ops, float *dw, const float *dout, const float *inp, int N, int in, int out) {
  ops->matmul_backward(ops, NULL, dw, NULL, dout, inp, NULL, N, in, out);
}
