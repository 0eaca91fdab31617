/* FP8 linears: the recipes' casts and the three GEMMs (fp8_linear.h). */
#include "tensor_parallel/fp8_linear.h"
#include <stdio.h>
#include "core/check.h"

loom_fp8_quant loom_fp8_quant_of(const loom_fp8_config *c, loom_fp8_operand role, float scale) {
  loom_fp8_quant q = {.format = (int)loom_fp8_format_of(c, role), .scale = scale};
  if (c->recipe == LOOM_FP8_RECIPE_BLOCKWISE)
    q.block_rows = role == LOOM_FP8_WEIGHT ? LOOM_FP8_TILE : 1, q.block_k = LOOM_FP8_TILE, q.scale = 0.0f;
  else if (c->recipe == LOOM_FP8_RECIPE_MXFP8)
    q.block_rows = 1, q.block_k = LOOM_MX_BLOCK, q.mx = true, q.scale = 0.0f;
  return q;
}

loom_fp8_matrix loom_fp8_matrix_of(const loom_fp8_quant *q, const uint8_t *codes, const float *scale_inv, int rows, int K) {
  const bool whole = q->scale > 0.0f;
  return (loom_fp8_matrix){.codes = codes, .scale_inv = scale_inv, .format = q->format,
                           .block_rows = whole ? (rows > 0 ? rows : 1) : q->block_rows,
                           .block_k = whole ? (K > 0 ? K : 1) : q->block_k};
}

size_t loom_fp8_scale_count(const loom_fp8_quant *q, int rows, int K) {
  if (q->scale > 0.0f) return 1;
  return (size_t)loom_fp8_k_blocks(rows, q->block_rows) * (size_t)loom_fp8_k_blocks(K, q->block_k);
}

/* A cast of at most elems codes, neither side over dim, has at most elems / 32 + dim scales (a partial block per
 * row); the codes take a quarter float each. Each part a multiple of 16 bytes, so that the codes stay as aligned
 * as the workspace (cuBLASLt's FP8 matmuls want 16). */
static size_t round4(size_t floats) { return (floats + 3) / 4 * 4; }
static size_t code_floats(size_t elems) { return round4((elems + 3) / 4); }
static size_t scale_floats(size_t elems, size_t dim) { return round4(elems / LOOM_MX_BLOCK + dim + 1); }

size_t loom_fp8_workspace_floats(size_t elems, size_t dim) { return 2 * (code_floats(elems) + scale_floats(elems, dim)); }

loom_fp8_workspace loom_fp8_workspace_at(float *floats, size_t elems, size_t dim) {
  loom_fp8_workspace w = {.code_room = elems, .scale_room = scale_floats(elems, dim)};
  for (int i = 0; i < 2; i++) {
    w.codes[i] = (uint8_t *)floats, floats += code_floats(elems);
    w.scales[i] = floats, floats += scale_floats(elems, dim);
  }
  return w;
}

/* The scale a whole-tensor recipe casts operand `role` of x[n] under (0: the recipe's blocks scale themselves). */
static float tensor_scale(const loom_ops *ops, loom_fp8_site *s, loom_fp8_operand role, loom_bf16_operand x, size_t n) {
  const loom_fp8_config *c = s->cfg;
  if (c->recipe != LOOM_FP8_RECIPE_DELAYED && c->recipe != LOOM_FP8_RECIPE_TENSORWISE) return 0.0f;
  float amax = ops->fp8_amax(ops, x, n);
  if (!isfinite(amax)) amax = INFINITY; /* one max for every rank, NaN or not */
  if (c->recipe == LOOM_FP8_RECIPE_DELAYED) {
    s->step_amax[role] = amax > s->step_amax[role] ? amax : s->step_amax[role];
    return s->scale[role];
  }
  if (s->amax_group) loom_comm_allreduce_typed(s->amax_group, &amax, 1, LOOM_DTYPE_F32, LOOM_REDUCE_MAX);
  return loom_fp8_scale(amax, loom_fp8_format_of(c, role), 0, 1.0f);
}

/* Casts x[R,C] (transposed: its [C,R]) as operand `role` into workspace slot `slot`. */
static loom_fp8_matrix cast(const loom_ops *ops, loom_fp8_site *s, int slot, loom_fp8_operand role, loom_bf16_operand x,
                            int R, int C, bool transpose, float scale) {
  const loom_fp8_quant q = loom_fp8_quant_of(s->cfg, role, scale);
  const int rows = transpose ? C : R, K = transpose ? R : C;
  LOOM_CHECK((size_t)rows * (size_t)K <= s->ws->code_room && loom_fp8_scale_count(&q, rows, K) <= s->ws->scale_room,
             "an FP8 operand fits the layer scratch's workspace");
  ops->fp8_quantize(ops, s->ws->codes[slot], s->ws->scales[slot], x, R, C, transpose, &q);
  return loom_fp8_matrix_of(&q, s->ws->codes[slot], s->ws->scales[slot], rows, K);
}

void loom_fp8_linear_forward(const loom_ops *ops, loom_fp8_site *s, float *out, loom_bf16_operand inp, const uint16_t *w,
                             const float *b, int N, int C, int OC) {
  const loom_bf16_operand wv = loom_bf16_bits(w);
  const float sx = tensor_scale(ops, s, LOOM_FP8_INPUT, inp, (size_t)N * C);
  const float sw = tensor_scale(ops, s, LOOM_FP8_WEIGHT, wv, (size_t)OC * C);
  const loom_fp8_matrix x = cast(ops, s, 0, LOOM_FP8_INPUT, inp, N, C, false, sx);
  const loom_fp8_matrix wm = cast(ops, s, 1, LOOM_FP8_WEIGHT, wv, OC, C, false, sw);
  ops->fp8_gemm(ops, out, false, &x, &wm, N, OC, C);
  if (b) ops->bias_forward(ops, out, b, N, OC);
}

void loom_fp8_linear_backward(const loom_ops *ops, loom_fp8_site *s, float *dinp, float *dw, float *db,
                              loom_bf16_operand dout, loom_bf16_operand inp, const uint16_t *w, int N, int C, int OC) {
  if (db) ops->matmul_backward_bf16(ops, NULL, NULL, db, dout, inp, NULL, N, C, OC); /* the bias grad in fp32, as bf16's */
  const float sg = tensor_scale(ops, s, LOOM_FP8_GRAD, dout, (size_t)N * OC);
  if (dinp) {
    const loom_bf16_operand wv = loom_bf16_bits(w);
    const float sw = tensor_scale(ops, s, LOOM_FP8_WEIGHT, wv, (size_t)OC * C);
    const loom_fp8_matrix g = cast(ops, s, 0, LOOM_FP8_GRAD, dout, N, OC, false, sg);
    const loom_fp8_matrix wt = cast(ops, s, 1, LOOM_FP8_WEIGHT, wv, OC, C, true, sw);
    ops->fp8_gemm(ops, dinp, true, &g, &wt, N, C, OC);
  }
  if (dw) {
    const float sx = tensor_scale(ops, s, LOOM_FP8_INPUT, inp, (size_t)N * C);
    const loom_fp8_matrix gt = cast(ops, s, 0, LOOM_FP8_GRAD, dout, N, OC, true, sg);
    const loom_fp8_matrix xt = cast(ops, s, 1, LOOM_FP8_INPUT, inp, N, C, true, sx);
    ops->fp8_gemm(ops, dw, true, &gt, &xt, OC, C, N);
  }
}

void loom_fp8_history_step(const loom_fp8_config *c, float *history, float *scale, float *step_amax, size_t count) {
  const int L = c->history;
  for (size_t k = 0; k < count; k++) {
    float *h = history + k * (size_t)L;
    for (int i = 0; i + 1 < L; i++) h[i] = h[i + 1];
    h[L - 1] = step_amax[k];
    float amax = h[L - 1];
    for (int i = 0; !c->most_recent && i < L; i++) amax = h[i] > amax ? h[i] : amax;
    scale[k] = loom_fp8_scale(amax, loom_fp8_format_at(c, k), c->margin, scale[k]);
    step_amax[k] = 0.0f;
  }
}

void loom_fp8_describe(const loom_fp8_config *c, int layers, char *out, size_t cap) {
  static const char *const RECIPES[] = {"delayed", "tensorwise", "blockwise (1 x 128 tiles, 128 x 128 weight blocks)",
                                        "mxfp8 (1 x 32 blocks, E8M0 scales)"};
  char scaling[160] = "", kept[96] = "";
  if (c->recipe == LOOM_FP8_RECIPE_DELAYED)
    snprintf(scaling, sizeof scaling, " (amax history %d, %s, margin %d)", c->history, c->most_recent ? "most_recent" : "max",
             c->margin);
  if (c->bf16_first || c->bf16_last)
    snprintf(kept, sizeof kept, "; the first %d and last %d of %d layers' too", c->bf16_first, c->bf16_last, layers);
  snprintf(out, cap, "fp8: the layers' linears in %s, %s scaling%s; the embedding, head, attention, norms, routers and "
           "experts in bf16/fp32%s", c->hybrid ? "hybrid FP8 (E4M3 forward, E5M2 grads)" : "E4M3", RECIPES[c->recipe],
           scaling, kept);
}
