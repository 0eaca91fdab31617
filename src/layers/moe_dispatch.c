/* MoE dispatch planning (see moe_dispatch.h). */
#include <math.h>
#include <stdlib.h>
#include "core/check.h"
#include "layers/moe_dispatch.h"

int64_t loom_moe_capacity(const loom_moe_dispatch_config *c, int N) {
  if (!(c->capacity_factor > 0.0)) return INT64_MAX;
  return (int64_t)ceil((double)N * c->topk / c->experts * c->capacity_factor); /* Megatron's order of operations */
}

/* A choice as the drop policies order an expert's: by weight (the higher
 * first, an equal one keeping the earlier token), or by token. */
typedef struct {
  float w;
  int i;
} choice;

static int by_weight(const void *a, const void *b) {
  const choice *x = a, *y = b;
  if (x->w != y->w) return x->w > y->w ? -1 : 1;
  return x->i - y->i;
}

static int by_position(const void *a, const void *b) { return ((const choice *)a)->i - ((const choice *)b)->i; }

void loom_moe_dispatch_plan(const loom_moe_dispatch_config *c, const int *experts, const float *weights, int N,
                            loom_moe_dispatch *d) {
  const int E = c->experts, k = c->topk, M = N * k;
  const int64_t cap = loom_moe_capacity(c, N);
  LOOM_CHECK(E >= 1 && k >= 1 && k <= E && N >= 0, "dispatch shape out of range");
  int64_t *next = calloc((size_t)E + 1, sizeof *next);
  choice *bucket = malloc(((size_t)M + 1) * sizeof *bucket);
  LOOM_CHECK(next && bucket, "out of memory planning a dispatch");
  d->dropped = 0;
  for (int i = 0; i < M; i++) {
    LOOM_CHECK(experts[i] < E, "a routed expert out of range");
    d->slots[i] = experts[i] < 0 ? -1 : 0;
    d->dropped += experts[i] < 0;
    if (experts[i] >= 0) next[experts[i] + 1]++;
  }
  for (int e = 0; e < E; e++) next[e + 1] += next[e];
  for (int i = 0; i < M; i++) /* each expert's in token order */
    if (experts[i] >= 0) bucket[next[experts[i]]++] = (choice){weights[i], i};
  /* Over capacity, each expert keeps the first cap of its choices as the policy orders them. */
  for (int e = 0, begin = 0; e < E; begin = (int)next[e], e++) {
    const int64_t n = next[e] - begin;
    d->counts[e] = n < cap ? n : cap;
    if (n <= cap) continue;
    qsort(bucket + begin, (size_t)n, sizeof *bucket, c->drop_by_position ? by_position : by_weight);
    for (int64_t j = cap; j < n; j++) d->slots[bucket[begin + j].i] = -1, d->dropped++;
  }
  free(bucket);
  /* Rows: expert by expert, each expert's kept choices in token order. */
  next[0] = 0;
  for (int e = 0; e < E; e++) next[e + 1] = next[e] + d->counts[e];
  d->rows_total = next[E];
  for (int i = 0; i < M; i++) {
    if (d->slots[i] < 0) continue;
    const int64_t row = next[experts[i]]++;
    d->rows[row] = i / k;
    d->slots[i] = (int)row;
  }
  free(next);
}

void loom_moe_rank_rows(const loom_moe_dispatch *d, int experts, int ep, int64_t *rows_to) {
  LOOM_CHECK(ep >= 1 && experts % ep == 0, "each expert-parallel rank owns an equal number of experts");
  const int per = experts / ep;
  for (int r = 0; r < ep; r++) {
    rows_to[r] = 0;
    for (int e = r * per; e < (r + 1) * per; e++) rows_to[r] += d->counts[e];
  }
}
