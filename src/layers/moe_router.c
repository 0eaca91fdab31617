/* The MoE router's reference (see moe_router.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "layers/moe_router.h"

#define SIGMOID_EPS 1e-20 /* Megatron's, in the normalisation of sigmoid scores */

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* p[E] = softmax(x[E]); returns logsumexp(x). */
static double softmax(const float *x, int E, double *p) {
  double most = x[0], sum = 0.0;
  for (int e = 1; e < E; e++) most = x[e] > most ? x[e] : most;
  for (int e = 0; e < E; e++) sum += p[e] = exp((double)x[e] - most);
  for (int e = 0; e < E; e++) p[e] /= sum;
  return most + log(sum);
}

/* The k largest of s[E], highest first, an equal score going to the lower index. */
static void top_k(const double *s, int E, int k, int *idx) {
  for (int j = 0; j < k; j++) {
    int best = -1;
    for (int e = 0; e < E; e++) {
      bool taken = false;
      for (int i = 0; i < j && !taken; i++) taken = idx[i] == e;
      if (!taken && (best < 0 || s[e] > s[best])) best = e;
    }
    idx[j] = best;
  }
}

/* The scores the load-balancing loss reads: softmax over every expert, or
 * sigmoids normalised to sum to one. */
static void aux_scores(const loom_moe_router *c, const float *x, double *q) {
  const int E = c->experts;
  if (c->score == LOOM_MOE_SCORE_SOFTMAX) {
    softmax(x, E, q);
    return;
  }
  double sum = 0.0;
  for (int e = 0; e < E; e++) sum += q[e] = sigmoid(x[e]);
  for (int e = 0; e < E; e++) q[e] /= sum + SIGMOID_EPS;
}

void loom_moe_route(const loom_moe_router *c, const float *logits, int N, loom_moe_routing *r) {
  const int E = c->experts, k = c->topk;
  LOOM_CHECK(E >= 1 && k >= 1 && k <= E && N >= 0, "router shape out of range");
  double *s = malloc((size_t)E * sizeof *s), *q = malloc((size_t)E * sizeof *q), *psum = r->score_sum;
  int *idx = malloc((size_t)k * sizeof *idx);
  LOOM_CHECK(s && q && idx, "out of memory routing");
  memset(psum, 0, (size_t)E * sizeof *psum);
  memset(r->load, 0, (size_t)E * sizeof *r->load);
  memset(r->aux_load, 0, (size_t)E * sizeof *r->aux_load);
  double z = 0.0;
  for (int n = 0; n < N; n++) {
    const float *x = logits + (size_t)n * E;
    int *chosen = r->experts + (size_t)n * k;
    float *w = r->weights + (size_t)n * k;
    const double lse = softmax(x, E, q);
    z += lse * lse;
    if (c->score == LOOM_MOE_SCORE_SOFTMAX && c->pre_softmax) {
      top_k(q, E, k, chosen);
      for (int j = 0; j < k; j++) w[j] = (float)q[chosen[j]];
    } else if (c->score == LOOM_MOE_SCORE_SOFTMAX) {
      for (int e = 0; e < E; e++) s[e] = x[e];
      top_k(s, E, k, chosen);
      double most = x[chosen[0]], sum = 0.0; /* the first is the largest */
      for (int j = 0; j < k; j++) sum += exp((double)x[chosen[j]] - most);
      for (int j = 0; j < k; j++) w[j] = (float)(exp((double)x[chosen[j]] - most) / sum);
    } else {
      for (int e = 0; e < E; e++) s[e] = sigmoid(x[e]) + (c->expert_bias ? c->expert_bias[e] : 0.0);
      top_k(s, E, k, chosen);
      double sum = 0.0;
      for (int j = 0; j < k; j++) sum += sigmoid(x[chosen[j]]);
      for (int j = 0; j < k; j++) w[j] = (float)(k > 1 ? sigmoid(x[chosen[j]]) / (sum + SIGMOID_EPS) : sigmoid(x[chosen[j]]));
    }
    for (int j = 0; j < k; j++) r->load[chosen[j]]++;
    aux_scores(c, x, q);
    for (int e = 0; e < E; e++) psum[e] += q[e];
    top_k(q, E, k, idx);
    for (int j = 0; j < k; j++) r->aux_load[idx[j]]++;
  }
  r->z_sum = z;
  loom_moe_route_losses(c, N, r);
  free(s), free(q), free(idx);
}

void loom_moe_route_losses(const loom_moe_router *c, int64_t tokens, loom_moe_routing *r) {
  double aux = 0.0;
  for (int e = 0; e < c->experts; e++) aux += r->score_sum[e] * (double)r->aux_load[e];
  r->aux_loss = tokens ? aux * c->aux_loss_coeff * c->experts / ((double)tokens * (double)tokens * c->topk) : 0.0;
  r->z_loss = tokens ? c->z_loss_coeff * r->z_sum / (double)tokens : 0.0;
}

void loom_moe_route_backward(const loom_moe_router *c, const float *logits, int N, int64_t tokens,
                             const loom_moe_routing *r, const float *dweights, float daux, float dz, float *dlogits) {
  const int E = c->experts, k = c->topk;
  double *p = malloc((size_t)E * sizeof *p), *q = malloc((size_t)E * sizeof *q), *dq = malloc((size_t)E * sizeof *dq);
  LOOM_CHECK(p && q && dq, "out of memory routing");
  const double aux_scale = tokens ? (double)daux * c->aux_loss_coeff * E / ((double)tokens * (double)tokens * k) : 0.0;
  for (int n = 0; n < N; n++) {
    const float *x = logits + (size_t)n * E;
    const int *chosen = r->experts + (size_t)n * k;
    const float *w = r->weights + (size_t)n * k, *dw = dweights + (size_t)n * k;
    float *dx = dlogits + (size_t)n * E;
    const double lse = softmax(x, E, p);
    for (int e = 0; e < E; e++) dx[e] = (float)(tokens ? dz * c->z_loss_coeff * 2.0 * lse / (double)tokens * p[e] : 0.0);
    double wdw = 0.0;
    for (int j = 0; j < k; j++) wdw += (double)w[j] * dw[j];
    if (c->score == LOOM_MOE_SCORE_SOFTMAX && c->pre_softmax) { /* w = p at the chosen: through the whole softmax */
      double pd = 0.0;
      for (int j = 0; j < k; j++) pd += p[chosen[j]] * dw[j];
      for (int e = 0; e < E; e++) dx[e] -= (float)(p[e] * pd);
      for (int j = 0; j < k; j++) dx[chosen[j]] += (float)(p[chosen[j]] * dw[j]);
    } else if (c->score == LOOM_MOE_SCORE_SOFTMAX) { /* a softmax over the chosen logits */
      for (int j = 0; j < k; j++) dx[chosen[j]] += (float)(w[j] * (dw[j] - wdw));
    } else { /* normalised sigmoids of the chosen */
      double sum = 0.0;
      for (int j = 0; j < k; j++) sum += sigmoid(x[chosen[j]]);
      for (int j = 0; j < k; j++) {
        const double sj = sigmoid(x[chosen[j]]), ds = k > 1 ? (dw[j] - wdw) / (sum + SIGMOID_EPS) : dw[j];
        dx[chosen[j]] += (float)(ds * sj * (1.0 - sj));
      }
    }
    if (aux_scale == 0.0) continue;
    aux_scores(c, x, q);
    for (int e = 0; e < E; e++) dq[e] = aux_scale * (double)r->aux_load[e];
    double qdq = 0.0;
    for (int e = 0; e < E; e++) qdq += q[e] * dq[e];
    if (c->score == LOOM_MOE_SCORE_SOFTMAX) {
      for (int e = 0; e < E; e++) dx[e] += (float)(q[e] * (dq[e] - qdq));
    } else {
      double sum = 0.0;
      for (int e = 0; e < E; e++) sum += sigmoid(x[e]);
      for (int e = 0; e < E; e++) {
        const double se = sigmoid(x[e]);
        dx[e] += (float)((dq[e] - qdq) / (sum + SIGMOID_EPS) * se * (1.0 - se));
      }
    }
  }
  free(p), free(q), free(dq);
}

void loom_moe_expert_bias_update(float *bias, const int64_t *load, int experts, float rate) {
  int64_t sum = 0;
  for (int e = 0; e < experts; e++) sum += load[e];
  for (int e = 0; e < experts; e++) { /* mean - load[e], times experts: exact in integers */
    const int64_t offset = sum - load[e] * experts;
    bias[e] += offset > 0 ? rate : offset < 0 ? -rate : 0.0f;
  }
}
