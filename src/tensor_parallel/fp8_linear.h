/* FP8 linears: Megatron-Core's recipes over the op table's FP8 ops.
 *
 * A linear's three GEMMs each take two FP8 operands, K-major (ops.h's
 * loom_fp8_matrix): the forward x[N,C] and W[OC,C]; the input grad dy[N,OC]
 * and W^T; the weight grad dy^T and x^T. Each operand is cast from the
 * values the bf16 linear would read (the bf16 copy's weight, the bf16
 * activations and grads) under its recipe:
 *   - delayed: one scale a tensor, from its amax history (loom_fp8_history_step
 *     after each step); the casts record each tensor's amax for the next;
 *   - tensorwise (current scaling): one scale a tensor, from its amax as it is
 *     cast, the max over every rank holding a part of it (the tp x cp group),
 *     so that tp and cp split it as the serial run casts it;
 *   - blockwise: 1 x 128 tiles of activations and grads, 128 x 128 blocks of
 *     weights, an fp32 scale each (DeepSeek-V3's); the transposed copies are
 *     tiled along their own rows (the weights' blocks are the same blocks);
 *   - MXFP8: 1 x 32 blocks along K, E8M0 scales, each copy its own.
 * Formats: E4M3 everywhere, or hybrid (E4M3 forward, E5M2 grads). The
 * accumulators, the output, the grads and the bias stay fp32. */
#ifndef LOOM_TP_FP8_LINEAR_H
#define LOOM_TP_FP8_LINEAR_H

#include <stdbool.h>
#include <stdint.h>
#include "backend/fp8_math.h"
#include "backend/ops.h"
#include "comm/comm.h"

typedef enum { LOOM_FP8_RECIPE_DELAYED, LOOM_FP8_RECIPE_TENSORWISE, LOOM_FP8_RECIPE_BLOCKWISE, LOOM_FP8_RECIPE_MXFP8 } loom_fp8_recipe;
typedef enum { LOOM_FP8_INPUT, LOOM_FP8_WEIGHT, LOOM_FP8_GRAD, LOOM_FP8_OPERANDS } loom_fp8_operand;
#define LOOM_FP8_TILE 128 /* blockwise's tiles and blocks */
#define LOOM_MX_BLOCK 32  /* MXFP8's blocks */
#define LOOM_FP8_MAX_HISTORY (1 << 20) /* delayed scaling's longest amax history */
#define LOOM_FP8_MAX_MARGIN 64

/* A run's FP8 settings (the plan's fp8 and fp8_scaling). on false: bf16 GEMMs. */
typedef struct {
  bool on;
  bool hybrid; /* grads in E5M2 */
  loom_fp8_recipe recipe;
  int history;      /* delayed: amax_history_len (>= 1) */
  bool most_recent; /* delayed: the latest amax, else the history's max */
  int margin;       /* delayed: scales / 2^margin */
  int bf16_first, bf16_last; /* layers at each end left in bf16 */
} loom_fp8_config;

static inline loom_fp8_format loom_fp8_format_of(const loom_fp8_config *c, loom_fp8_operand role) {
  return c->hybrid && role == LOOM_FP8_GRAD ? LOOM_FP8_E5M2 : LOOM_FP8_E4M3;
}
/* How an operand is cast: its format, and its blocks (whole tensor when scale > 0). */
loom_fp8_quant loom_fp8_quant_of(const loom_fp8_config *c, loom_fp8_operand role, float scale);
/* The operand a cast of [rows, K] under q made: its blocks as the GEMM reads them. */
loom_fp8_matrix loom_fp8_matrix_of(const loom_fp8_quant *q, const uint8_t *codes, const float *scale_inv, int rows, int K);
/* Scales a cast of [rows, K] under q writes. */
size_t loom_fp8_scale_count(const loom_fp8_quant *q, int rows, int K);

/* One line saying what runs in FP8 and how it is scaled ("fp8: ..."), for a model of `layers` layers, into out. */
void loom_fp8_describe(const loom_fp8_config *c, int layers, char *out, size_t cap);

/* The backend memory the casts write: two operands' codes and scales. */
typedef struct {
  uint8_t *codes[2];
  float *scales[2];
  size_t code_room, scale_room;
} loom_fp8_workspace;
/* Floats of room a workspace for operands of at most `elems` codes, none wider or taller than `dim`, takes (the
 * codes four a float). */
size_t loom_fp8_workspace_floats(size_t elems, size_t dim);
/* Carves a workspace out of `floats` (loom_fp8_workspace_floats(elems, dim) of them). */
loom_fp8_workspace loom_fp8_workspace_at(float *floats, size_t elems, size_t dim);

/* One linear's FP8 state. */
typedef struct {
  const loom_fp8_config *cfg;
  const loom_fp8_workspace *ws;
  loom_comm *amax_group; /* tensorwise: the max over it (NULL: this rank alone) */
  /* delayed: the scales each operand casts under this step, and the largest magnitude each had in it (max over
   * the casts, +inf for one that was not finite); [LOOM_FP8_OPERANDS] each, the run's */
  const float *scale;
  float *step_amax;
} loom_fp8_site;

/* out[N,OC] = inp @ w^T (+ b) through FP8 GEMMs; w is the bf16 copy's bits. */
void loom_fp8_linear_forward(const loom_ops *ops, loom_fp8_site *s, float *out, loom_bf16_operand inp, const uint16_t *w,
                             const float *b, int N, int C, int OC);
/* dinp += dout @ w, dw += dout^T inp, db += column sums of dout (any NULL: not computed). */
void loom_fp8_linear_backward(const loom_ops *ops, loom_fp8_site *s, float *dinp, float *dw, float *db,
                              loom_bf16_operand dout, loom_bf16_operand inp, const uint16_t *w, int N, int C, int OC);

/* Delayed scaling after a step: each operand's step amax (already the max over every rank) pushed onto its
 * history[history] (oldest first), its scale recomputed from the history (loom_fp8_scale, keeping the old one for
 * an amax of 0 or not finite), its step amax cleared; `count` operands. */
void loom_fp8_history_step(const loom_fp8_config *c, float *history, float *scale, float *step_amax, size_t count);
/* The format operand k of a run's delayed state casts in (k counts operands, LOOM_FP8_OPERANDS a linear). */
static inline loom_fp8_format loom_fp8_format_at(const loom_fp8_config *c, size_t k) {
  return loom_fp8_format_of(c, (loom_fp8_operand)(k % LOOM_FP8_OPERANDS));
}

#endif
