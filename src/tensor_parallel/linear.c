/* Column- and row-parallel linears over the op table and the region mappings. */
#include "tensor_parallel/linear.h"
#include "tensor_parallel/mappings.h"

void loom_linear_forward(const loom_ops *ops, float *out, loom_bf16_operand inp, loom_linear_weight w, const float *b,
                         int N, int C, int OC) {
  if (w.fp8) loom_fp8_linear_forward(ops, w.fp8, out, inp, w.bf16, b, N, C, OC);
  else if (w.bf16) ops->matmul_forward_bf16(ops, out, inp, w.bf16, b, N, C, OC);
  else ops->matmul_forward(ops, out, inp.f32, w.f32, b, N, C, OC);
}

void loom_linear_backward(const loom_ops *ops, float *dinp, float *dw, float *db, loom_bf16_operand dout,
                          loom_bf16_operand inp, loom_linear_weight w, int N, int C, int OC) {
  if (w.fp8) loom_fp8_linear_backward(ops, w.fp8, dinp, dw, db, dout, inp, w.bf16, N, C, OC);
  else if (w.bf16) ops->matmul_backward_bf16(ops, dinp, dw, db, dout, inp, w.bf16, N, C, OC);
  else ops->matmul_backward(ops, dinp, dw, db, dout.f32, inp.f32, w.f32, N, C, OC);
}

void loom_column_parallel_forward(const loom_tp *tp, const loom_ops *ops, float *out, float *inp_full,
                                  const float *inp, uint16_t *inp_bits, loom_linear_weight w, const float *b, int N,
                                  int n, int in, int out_local) {
  if (inp_bits) {
    loom_tp_gather_packed(tp, ops, inp, inp_bits, (size_t)n * in);
    loom_linear_forward(ops, out, loom_bf16_bits(inp_bits), w, b, N, in, out_local);
    return;
  }
  loom_tp_enter_forward(tp, ops, inp, inp_full, (size_t)n * in);
  loom_linear_forward(ops, out, loom_bf16_values(inp_full), w, b, N, in, out_local);
}

void loom_column_parallel_backward(const loom_tp *tp, const loom_ops *ops, float *dinp, float *dinp_full,
                                   float *dw, float *db, const float *dout, const uint16_t *dout_bits,
                                   loom_bf16_operand inp_full, loom_linear_weight w, int N, int n, int in,
                                   int out_local) {
  loom_mem_zero(ops->mem, dinp_full, (size_t)N * in);
  loom_linear_backward(ops, dinp_full, dw, db, loom_bf16_kept(dout, dout_bits), inp_full, w, N, in, out_local);
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
                               loom_bf16_operand inp, loom_linear_weight w, const float *b, int N, int n, int in_local,
                               int out_features) {
  loom_linear_forward(ops, partial, inp, w, NULL, N, in_local, out_features);
  loom_tp_exit_forward(tp, ops, partial, out, (size_t)n * out_features);
  if (b) ops->bias_forward(ops, out, b, n, out_features); /* once, after the reduction */
}

void loom_row_parallel_backward(const loom_tp *tp, const loom_ops *ops, float *dinp, float *dw, float *db,
                                const float *dout, float *dout_full, uint16_t *dout_bits, loom_bf16_operand inp,
                                loom_linear_weight w, int N, int n, int in_local, int out_features) {
  if (db) ops->bias_backward(ops, db, dout, n, out_features);
  if (dout_bits) loom_tp_gather_packed(tp, ops, dout, dout_bits, (size_t)n * out_features);
  else loom_tp_exit_backward(tp, ops, dout, dout_full, (size_t)n * out_features);
  loom_linear_backward(ops, dinp, dw, NULL, loom_bf16_kept(dout_full, dout_bits), inp, w, N, in_local, out_features);
}

void loom_linear_weight_grad(const loom_ops *ops, float *dw, loom_bf16_operand dout, loom_bf16_operand inp, int N, int in,
                             int out, bool bf16, loom_fp8_site *fp8) {
  if (fp8) loom_fp8_linear_backward(ops, fp8, NULL, dw, NULL, dout, inp, NULL, N, in, out);
  else if (bf16) ops->matmul_backward_bf16(ops, NULL, dw, NULL, dout, inp, NULL, N, in, out);
  else ops->matmul_backward(ops, NULL, dw, NULL, dout.f32, inp.f32, NULL, N, in, out);
}
