/* Multi-token prediction's combination of the tokens ahead with the previous depth (mtp.h). */
#include "layers/mtp.h"
#include "layers/block.h"

void loom_mtp_shift(const int *tokens, const int *targets, int T, int B, int k, int *mtp_tokens, int *mtp_targets) {
  const int ahead = k + 1;
  for (int t = 0; t < T; t++)
    for (int b = 0; b < B; b++) {
      const size_t at = (size_t)t * B + b, from = (size_t)(t + ahead) * B + b;
      const bool inside = t + ahead < T;
      mtp_tokens[at] = inside ? tokens[from] : 0;
      mtp_targets[at] = inside && targets ? targets[from] : -1;
    }
}

void loom_mtp_orders(int n, int *interleave, int *split) {
  for (int i = 0; i < n; i++)
    for (int j = 0; j < 2; j++) {
      interleave[2 * i + j] = j * n + i;
      split[j * n + i] = 2 * i + j;
    }
}

static void round_bf16(const loom_ops *ops, const loom_mtp_shape *shape, float *x, size_t n) {
  if (shape->bf16) ops->round_bf16(ops, x, n);
}

/* Depth statistics: enorm's mean and rstd, then hnorm's. */
static float *stat(const loom_mtp_acts *a, const loom_mtp_shape *shape, int i) { return a->stats + (size_t)i * shape->n; }

void loom_mtp_combine_forward(const loom_ops *ops, loom_mtp_acts *a, const loom_mtp_scratch *s,
                              const loom_mtp_compute_weights *w, const loom_mtp_shape *shape) {
  const int n = shape->n, h = shape->h;
  const size_t nh = (size_t)n * h;
  float *top = s->pair, *bottom = s->pair + nh;
  loom_norm_forward(ops, shape->norm, shape->eps, top, stat(a, shape, 0), stat(a, shape, 1), a->emb, w->v->enorm_w,
                    w->v->enorm_b, n, h);
  loom_norm_forward(ops, shape->norm, shape->eps, bottom, stat(a, shape, 2), stat(a, shape, 3), a->hin, w->v->hnorm_w,
                    w->v->hnorm_b, n, h);
  round_bf16(ops, shape, s->pair, 2 * nh);
  ops->rows_gather(ops, a->cat, s->pair, s->interleave, 2 * n, h); /* row i: enorm(e_i) | hnorm(h_i) */
  loom_linear_forward(ops, a->x, loom_bf16_values(a->cat), w->eh_proj, NULL, n, 2 * h, h);
  round_bf16(ops, shape, a->x, nh);
}

void loom_mtp_combine_backward(const loom_ops *ops, const loom_mtp_acts *a, const loom_mtp_scratch *s,
                               const loom_mtp_compute_weights *w, loom_mtp_weights *g, const loom_mtp_shape *shape,
                               const float *dx, float *dcat, float *demb, float *dhin) {
  const int n = shape->n, h = shape->h;
  const size_t nh = (size_t)n * h;
  loom_mem_zero(ops->mem, dcat, 2 * nh);
  loom_linear_backward(ops, dcat, g->eh_proj_w, NULL, loom_bf16_values(dx), loom_bf16_values(a->cat), w->eh_proj, n,
                       2 * h, h);
  round_bf16(ops, shape, dcat, 2 * nh);
  ops->rows_gather(ops, s->pair, dcat, s->split, 2 * n, h); /* the halves' grads, one above the other */
  loom_mem_zero(ops->mem, demb, nh);
  loom_mem_zero(ops->mem, dhin, nh);
  loom_norm_backward(ops, shape->norm, demb, g->enorm_w, g->enorm_b, s->pair, a->emb, w->v->enorm_w, stat(a, shape, 0),
                     stat(a, shape, 1), n, h);
  loom_norm_backward(ops, shape->norm, dhin, g->hnorm_w, g->hnorm_b, s->pair + nh, a->hin, w->v->hnorm_w,
                     stat(a, shape, 2), stat(a, shape, 3), n, h);
  round_bf16(ops, shape, demb, nh);
  round_bf16(ops, shape, dhin, nh);
}
