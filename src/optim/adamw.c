/* AdamW step and global grad norm over the flat parameter buffers. */
#include <math.h>
#include <stdlib.h>
#include "core/check.h"
#include "core/tensor.h"
#include "comm/comm.h"
#include "optim/adamw.h"
#include "layers/run_buffers.h"

loom_adamw_config loom_adamw_defaults(void) {
  return (loom_adamw_config){.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                             .grad_clip = 1.0f};
}

loom_status loom_adamw_init(loom_adamw *opt, const loom_gpt_params *p, const loom_adamw_config *cfg) {
  opt->cfg = *cfg;
  opt->step = 0;
  loom_status st = loom_buffer_init(&opt->m, p->params.views, p->params.count, p->params.alloc, loom_run_buffer_name(LOOM_BUF_ADAM_M));
  if (st != LOOM_OK) return st;
  st = loom_buffer_init(&opt->v, p->params.views, p->params.count, p->params.alloc, loom_run_buffer_name(LOOM_BUF_ADAM_V));
  if (st != LOOM_OK) loom_buffer_free(&opt->m);
  return st;
}

void loom_adamw_free(loom_adamw *opt) {
  loom_buffer_free(&opt->m);
  loom_buffer_free(&opt->v);
}

double loom_grad_norm(const loom_gpt_params *p, const loom_ops *ops, const loom_tp *tp) {
  return sqrt(loom_grad_sumsq(p, ops, tp, false, NULL));
}

void loom_norm_sum_add(loom_norm_sum *s, const loom_gpt_params *p, int k, const float *g, size_t n, const loom_ops *ops) {
  const bool uncounted = s->skip_shared && p->meta[k].shared;
  const int part = uncounted ? 2 : loom_param_norm_part(&p->meta[k], p->tp_rank, p->tp_size);
  if (part < 0) return;
  LOOM_CHECK(!s->ops || s->ops == ops, "a grad norm's pieces on one backend");
  s->ops = ops;
  if (s->count == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 64;
    s->piece = loom_xrealloc(s->piece, (size_t)s->cap * sizeof *s->piece, "grad norm");
    s->len = loom_xrealloc(s->len, (size_t)s->cap * sizeof *s->len, "grad norm");
    s->into = loom_xrealloc(s->into, (size_t)s->cap * sizeof *s->into, "grad norm");
  }
  s->piece[s->count] = g, s->len[s->count] = n, s->into[s->count] = (signed char)part;
  s->count++;
}

double loom_norm_sum_total(loom_norm_sum *s, const loom_tp *tp) {
  if (s->count > 0) {
    double *sq = loom_xmalloc((size_t)s->count * sizeof *sq, "grad norm");
    s->ops->sumsq_batch(s->ops, s->piece, s->len, s->count, sq);
    for (int i = 0; i < s->count; i++) /* in the order added, as one sumsq at a time summed them */
      if (s->into[i] == 2) s->uncounted += sq[i];
      else s->sums[s->into[i] >= 3 ? s->into[i] - 1 : s->into[i]] += sq[i];
    free(sq);
  }
  free(s->piece), free(s->len), free(s->into);
  s->piece = NULL, s->len = NULL, s->into = NULL;
  s->count = s->cap = 0;
  if (tp) loom_comm_allreduce_typed(tp->group, &s->sums[0], 1, LOOM_DTYPE_F64, LOOM_REDUCE_SUM);
  if (tp) loom_comm_allreduce_typed(tp->ep_group, &s->sums[2], 2, LOOM_DTYPE_F64, LOOM_REDUCE_SUM);
  if (tp && tp->etp_group) /* the experts' slices: over the tp group's ranks (the scalar with tp's traffic) */
    loom_comm_allreduce_typed(tp->group, &s->sums[2], 1, LOOM_DTYPE_F64, LOOM_REDUCE_SUM);
  return s->sums[0] + s->sums[1] + s->sums[2] + s->sums[3];
}

double loom_grad_sumsq(const loom_gpt_params *p, const loom_ops *ops, const loom_tp *tp, bool skip_shared, double *uncounted) {
  loom_norm_sum s = {.skip_shared = skip_shared};
  for (int k = 0; k < p->grads.count; k++)
    loom_norm_sum_add(&s, p, k, p->grads.views[k].data, loom_tensor_numel(&p->grads.views[k]), ops);
  const double total = loom_norm_sum_total(&s, tp);
  if (uncounted) *uncounted = s.uncounted;
  return total;
}

float loom_adamw_clip_scale(const loom_adamw_config *cfg, double grad_norm) {
  return cfg->grad_clip > 0.0f && grad_norm > cfg->grad_clip ? (float)(cfg->grad_clip / grad_norm) : 1.0f;
}

void loom_adamw_step(loom_adamw *opt, loom_gpt_params *p, float lr, double grad_norm, const loom_ops *ops) {
  const float clip = loom_adamw_clip_scale(&opt->cfg, grad_norm); /* applied inside the update: no pass of its own */
  opt->step++;
  /* A bf16 run's compute copy is written in the same pass, so no later pass rereads the params to round them. */
  const bool publish = p->cfg.bf16 && loom_gpt_params_have_master(p);
  for (int i = 0; i < p->params.count; i++) {
    const loom_adamw_args args = {.lr = lr, .beta1 = opt->cfg.beta1, .beta2 = opt->cfg.beta2,
                                  .eps = opt->cfg.eps,
                                  .weight_decay = p->meta[i].weight_decay ? opt->cfg.weight_decay : 0.0f,
                                  .grad_scale = clip, .step = opt->step};
    ops->adamw(ops, p->params.views[i].data, p->grads.views[i].data, opt->m.views[i].data, opt->v.views[i].data,
               publish ? p->compute.views[i].data : NULL, loom_tensor_numel(&p->params.views[i]), &args);
  }
  p->compute_fresh = publish;
}
