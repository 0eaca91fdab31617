/* Which grads a compression method compresses, and what that costs. */
#include <stdio.h>
#include <stdlib.h>
#include "backend/ops.h"
#include "core/check.h"
#include "layers/gpt.h"
#include "plan/grad_compression.h"
#include "plan/plan.h"

void loom_compression_describe(const loom_compression *c, char *out, size_t len) {
  if (c->kind == LOOM__COMPRESSION_KIND__COMPRESSION_POWERSGD) snprintf(out, len, "PowerSGD rank %d", c->rank);
  else if (c->kind == LOOM__COMPRESSION_KIND__COMPRESSION_SIGN) snprintf(out, len, "scaled sign");
  else snprintf(out, len, "none");
}

bool loom_compression_compresses(const loom_compression *c, const loom_tensor *t, int *rows, int *cols) {
  if (t->ndim != 2) return false;
  const int64_t n = t->shape[0], m = t->shape[1];
  if (c->kind == LOOM__COMPRESSION_KIND__COMPRESSION_POWERSGD && (c->rank < 1 || (n + m) * c->rank >= n * m)) return false;
  if (c->kind != LOOM__COMPRESSION_KIND__COMPRESSION_POWERSGD && c->kind != LOOM__COMPRESSION_KIND__COMPRESSION_SIGN)
    return false;
  if (rows) *rows = (int)n;
  if (cols) *cols = (int)m;
  return true;
}

int64_t loom_compression_sent_words(const loom_compression *c, const loom_tensor *t) {
  int n, m;
  if (!loom_compression_compresses(c, t, &n, &m)) return (int64_t)loom_tensor_numel(t);
  if (c->kind == LOOM__COMPRESSION_KIND__COMPRESSION_POWERSGD) return ((int64_t)n + m) * c->rank;
  return (int64_t)loom_sign_message_words(loom_tensor_numel(t));
}

loom_compression_state loom_compression_state_of(const loom_compression *c, const loom_tensor *t) {
  int n, m;
  if (!loom_compression_compresses(c, t, &n, &m)) return (loom_compression_state){0, 0, 0};
  const int64_t error = (int64_t)n * m;
  if (c->kind == LOOM__COMPRESSION_KIND__COMPRESSION_POWERSGD)
    return (loom_compression_state){error, (int64_t)n * c->rank, (int64_t)m * c->rank};
  const int64_t message = (int64_t)loom_sign_message_words(loom_tensor_numel(t));
  return (loom_compression_state){error, message, (int64_t)c->dp * message};
}

/* ---- the plan's compression and its cost, from the layers' table ---- */

/* The compression cost of one range's tensors, walked one by one. */
static loom_compression_cost table_compression_cost(const loom_gpt_config *cfg, const loom_compression *gc,
                                                    const loom_stage_range *range, int tp) {
  loom_compression_cost c = {0};
  const int n = loom_gpt_param_table(cfg, range, 0, tp, NULL, NULL);
  loom_tensor *specs = loom_xmalloc((size_t)n * sizeof *specs, "parameter table");
  loom_param_meta *meta = loom_xmalloc((size_t)n * sizeof *meta, "parameter table");
  loom_gpt_param_table(cfg, range, 0, tp, specs, meta);
  for (int k = 0; k < n; k++) {
    const loom_compression_state st = loom_compression_state_of(gc, &specs[k]);
    c.error_words += (double)st.error, c.a_words += (double)st.a, c.b_words += (double)st.b;
    c.sent_words += (double)loom_compression_sent_words(gc, &specs[k]);
    if (loom_compression_compresses(gc, &specs[k], NULL, NULL))
      c.message_words += (double)loom_compression_sent_words(gc, &specs[k]);
    c.whole_words += (double)loom_tensor_numel(&specs[k]);
  }
  free(specs);
  free(meta);
  return c;
}

loom_compression_cost loom_plan_compression_cost(const loom_plan *p, const loom_stage_range *range) {
  const loom_compression gc = loom_plan_compression(p);
  loom_gpt_config cfg;
  loom_plan_model_config(p, &cfg);
  return loom_range_compression_cost(&cfg, p->parallel->tp, p->parallel->etp, p->parallel->ep, &gc, range);
}

loom_compression_cost loom_range_compression_cost(const loom_gpt_config *model, int tp, int etp, int ep,
                                                  const loom_compression *compression, const loom_stage_range *range) {
  const loom_compression gc = *compression;
  const loom_gpt_config cfg = loom_gpt_config_for_tp(model, tp);
  if (gc.kind == LOOM__COMPRESSION_KIND__COMPRESSION_NONE) { /* everything crosses whole, with no state */
    /* but the experts of an expert-parallel run, which cross their expert-data-parallel group instead */
    const loom_gpt_config placed = loom_gpt_config_for_ep(&cfg, etp, ep, 0);
    const double whole = (double)loom_gpt_param_count(&placed, range, tp) -
                         (ep > 1 ? (double)loom_gpt_expert_param_count(&placed, range) : 0.0);
    return (loom_compression_cost){.sent_words = whole, .whole_words = whole};
  }
  loom_stage_range edges, one[LOOM_LAYER_KINDS];
  int layers[LOOM_LAYER_KINDS];
  loom_stage_range_kinds(&cfg, range, &edges, one, layers);
  if (layers[0] + layers[1] <= 1) return table_compression_cost(&cfg, &gc, range, tp);
  loom_compression_cost c = table_compression_cost(&cfg, &gc, &edges, tp);
  for (int k = 0; k < LOOM_LAYER_KINDS; k++) {
    if (!layers[k]) continue;
    const loom_compression_cost l = table_compression_cost(&cfg, &gc, &one[k], tp);
    c.error_words += layers[k] * l.error_words, c.a_words += layers[k] * l.a_words, c.b_words += layers[k] * l.b_words;
    c.sent_words += layers[k] * l.sent_words;
    c.message_words += layers[k] * l.message_words, c.whole_words += layers[k] * l.whole_words;
  }
  return c;
}
