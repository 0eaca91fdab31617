/* The conjugate mappings at the edges of tensor-parallel regions.
 *
 * A region starts before a column-parallel linear and ends after a
 * row-parallel one. Without sequence parallelism activations outside are
 * replicated: entering is the identity (its backward all-reduces the grad)
 * and leaving all-reduces the partial sums (its backward is the identity).
 * With sequence parallelism activations outside are split along the
 * sequence: entering all-gathers (backward reduce-scatters) and leaving
 * reduce-scatters (backward all-gathers). `local` rows are this rank's
 * n_local floats; `full` holds tp * n_local (they may alias without SP).
 * Buffers are the backend's memory; ops moves what the collectives do not. */
#ifndef LOOM_MAPPINGS_H
#define LOOM_MAPPINGS_H

#include <stddef.h>
#include "backend/ops.h"
#include "tensor_parallel/parallel_state.h"

void loom_tp_enter_forward(const loom_tp *tp, const loom_ops *ops, const float *local, float *full, size_t n_local);
void loom_tp_enter_backward(const loom_tp *tp, const loom_ops *ops, float *dfull, float *dlocal, size_t n_local);
void loom_tp_exit_forward(const loom_tp *tp, const loom_ops *ops, float *partial_full, float *local, size_t n_local);
void loom_tp_exit_backward(const loom_tp *tp, const loom_ops *ops, const float *dlocal, float *dfull, size_t n_local);
/* Entering forward and leaving backward (the gathering pair) straight into
 * bf16 bits, for a tensor only GEMMs read: local is packed (rounded to
 * bf16), and under SP gathered as bits (bf16 runs; tp->staging holds the
 * send). */
void loom_tp_gather_packed(const loom_tp *tp, const loom_ops *ops, const float *local, uint16_t *full_bits,
                           size_t n_local);

/* The other conjugate pair, along the last dimension: gathering every
 * rank's columns local[N, c] into full[N, c * tp] (scratch: N * c * tp
 * floats), whose backward keeps this rank's columns (split), and the reverse. */
void loom_tp_gather_columns(const loom_tp *tp, const loom_ops *ops, const float *local, float *full, float *scratch, int N, int c);
void loom_tp_split_columns(const loom_tp *tp, const loom_ops *ops, const float *full, float *local, int N, int c);

/* Rows a rank holds outside the regions: N/tp under SP, else N. */
int loom_tp_local_rows(const loom_tp *tp, int rows);

#endif
