/* Megatron's two parallel linears, weights [out, in] split across the TP group.
 *
 * ColumnParallelLinear splits the output features: rank r holds rows
 * [r*out/tp, (r+1)*out/tp) of the weight and bias and computes those output
 * columns from the whole input. It opens a parallel region (entering it is
 * the identity, or an all-gather along the sequence under SP) and can gather
 * its output columns from every rank when a caller needs them whole.
 *
 * RowParallelLinear splits the input features: its input is already split
 * (the output of a column-parallel linear), each rank's product is a partial
 * sum, and the region closes by all-reducing them (reduce-scattering along
 * the sequence under SP); the bias is added once, after the reduction.
 *
 * N = T*B rows inside the region; n rows outside it (N/tp under SP, else N).
 * Backward functions add into weight and bias grads. A NULL bias (and bias
 * grad) means the linear has none. A NULL weight grad leaves it for
 * loom_linear_weight_grad, to run later (a split backward). */
#ifndef LOOM_TP_LINEAR_H
#define LOOM_TP_LINEAR_H

#include "backend/ops.h"
#include "tensor_parallel/fp8_linear.h"
#include "tensor_parallel/parallel_state.h"

/* A linear's weight [out, in] as it computes: fp32, or in bf16 runs the bf16
 * copy's bits, which the op table's bf16 linears read in place (inputs and
 * output grads then hold bf16 values). Exactly one of the two is set. */
typedef struct {
  const float *f32;
  const uint16_t *bf16;
  loom_fp8_site *fp8; /* beside bf16: the GEMMs in FP8 under this linear's state (fp8_linear.h); NULL: bf16 */
} loom_linear_weight;
static inline loom_linear_weight loom_linear_fp32(const float *w) { return (loom_linear_weight){.f32 = w}; }

/* One local linear, no region: out[N, OC] = inp @ w^T + b through the op
 * table's fp32 or bf16 matmuls, as w is (fp32 linears read the operands'
 * values); its backward adds dinp += dout @ w, dw += dout^T inp, db += sum
 * dout (any of them NULL). */
void loom_linear_forward(const loom_ops *ops, float *out, loom_bf16_operand inp, loom_linear_weight w, const float *b,
                         int N, int C, int OC);
void loom_linear_backward(const loom_ops *ops, float *dinp, float *dw, float *db, loom_bf16_operand dout,
                          loom_bf16_operand inp, loom_linear_weight w, int N, int C, int OC);

/* bf16 runs keep a linear's inputs and output grads as bf16 bits where the
 * GEMMs read them in place (the `bits` arguments below; NULL: none, the
 * GEMMs then read the fp32 values). A linear that brings such a tensor into
 * its region brings it in packed (mappings.h), once. */

/* out[N, out_local] = inp_full @ w^T + b, where inp_full[N, in] is inp[n, in]
 * brought into the region (saved for backward; may alias inp without SP),
 * or inp_bits[N, in] where it is brought in packed (saved instead; inp_full
 * is then unused and may be NULL). */
void loom_column_parallel_forward(const loom_tp *tp, const loom_ops *ops, float *out, float *inp_full,
                                  const float *inp, uint16_t *inp_bits, loom_linear_weight w, const float *b, int N,
                                  int n, int in, int out_local);
/* dinp[n, in] = the input grad leaving the region (written, not added);
 * dinp_full[N, in] is scratch (may alias dinp without SP). dout_bits, when
 * set, holds dout's values and is what the GEMM and the bias grad read;
 * the weight grad, when asked, reads inp_full (its values, or its bits). */
void loom_column_parallel_backward(const loom_tp *tp, const loom_ops *ops, float *dinp, float *dinp_full,
                                   float *dw, float *db, const float *dout, const uint16_t *dout_bits,
                                   loom_bf16_operand inp_full, loom_linear_weight w, int N, int n, int in,
                                   int out_local);
/* The optional gather of the output: full[N, out_local * tp] in global column
 * order; scratch holds N * out_local * tp floats. */
void loom_column_parallel_gather_output(const loom_tp *tp, const loom_ops *ops, const float *out, float *full,
                                        float *scratch, int N, int out_local);
/* Its backward: this rank's columns of dfull[N, out_local * tp] into dout. */
void loom_column_parallel_gather_output_backward(const loom_tp *tp, const loom_ops *ops, const float *dfull,
                                                 float *dout, int N, int out_local);

/* out[n, out] = reduce over ranks of (inp[N, in_local] @ w^T) + b; partial[N, out]
 * is scratch (may alias out without SP). inp: its values, or its bits. */
void loom_row_parallel_forward(const loom_tp *tp, const loom_ops *ops, float *out, float *partial,
                               loom_bf16_operand inp, loom_linear_weight w, const float *b, int N, int n, int in_local,
                               int out_features);
/* dinp[N, in_local] += ...; dout[n, out] is the output grad; dout_full[N, out]
 * is where it is brought into the region (may alias dout without SP), or
 * dout_bits[N, out] where it is brought in packed (dout_full is then unused
 * and may be NULL). The bias
 * grad covers this rank's rows only under SP (summed over the group with the
 * other replicated grads). The weight grad, when asked, reads inp. */
void loom_row_parallel_backward(const loom_tp *tp, const loom_ops *ops, float *dinp, float *dw, float *db,
                                const float *dout, float *dout_full, uint16_t *dout_bits, loom_bf16_operand inp,
                                loom_linear_weight w, int N, int n, int in_local, int out_features);

/* The weight grad a backward left out: dw[out, in] += dout[N, out]^T @ inp[N, in],
 * with the region's row-complete tensors (column-parallel: its output grad and
 * gathered input; row-parallel: its gathered output grad and split input);
 * bf16: they hold bf16 values or are bits, for the bf16 linear's GEMM (fp32
 * runs pass values); fp8 (not NULL): the FP8 GEMM under that state. */
void loom_linear_weight_grad(const loom_ops *ops, float *dw, loom_bf16_operand dout, loom_bf16_operand inp, int N, int in,
                             int out, bool bf16, loom_fp8_site *fp8);

#endif
