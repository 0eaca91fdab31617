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

/* The top k of s[E] as top_k orders them, under group-limited selection
 * among the experts of the best groups alone (ties between equal group
 * scores going to the lower group); s is scratch, its other experts set to
 * -inf. gscore[groups] and gidx[group_topk] are scratch. */
static void choose(const loom_moe_router *c, double *s, int *idx, double *gscore, int *gidx) {
  const int E = c->experts, k = c->topk;
  if (c->groups <= 1) {
    top_k(s, E, k, idx);
    return;
  }
  const int per = E / c->groups, best = k / c->group_topk;
  for (int g = 0; g < c->groups; g++) {
    top_k(s + (size_t)g * per, per, best, idx);
    gscore[g] = 0.0;
    for (int j = 0; j < best; j++) gscore[g] += s[(size_t)g * per + idx[j]];
  }
  top_k(gscore, c->groups, c->group_topk, gidx);
  for (int g = 0; g < c->groups; g++) {
    bool kept = false;
    for (int j = 0; j < c->group_topk && !kept; j++) kept = gidx[j] == g;
    if (!kept)
      for (int e = g * per; e < (g + 1) * per; e++) s[e] = -INFINITY;
  }
  top_k(s, E, k, idx);
}

/* What multiplies the chosen weights. */
static double weight_scale(const loom_moe_router *c) { return c->topk_scaling > 0.0f ? c->topk_scaling : 1.0; }

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
  const int G = c->groups > 1 ? c->groups : 1;
  double *s = malloc((size_t)E * sizeof *s), *q = malloc((size_t)E * sizeof *q), *psum = r->score_sum;
  double *gscore = malloc((size_t)G * sizeof *gscore);
  int *idx = malloc((size_t)k * sizeof *idx), *gidx = malloc((size_t)G * sizeof *gidx);
  LOOM_CHECK(s && q && idx && gscore && gidx, "out of memory routing");
  const double scale = weight_scale(c);
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
      for (int e = 0; e < E; e++) s[e] = q[e];
      choose(c, s, chosen, gscore, gidx);
      for (int j = 0; j < k; j++) w[j] = (float)(scale * q[chosen[j]]);
    } else if (c->score == LOOM_MOE_SCORE_SOFTMAX) {
      for (int e = 0; e < E; e++) s[e] = x[e];
      choose(c, s, chosen, gscore, gidx);
      double most = x[chosen[0]], sum = 0.0; /* the first is the largest */
      for (int j = 0; j < k; j++) sum += exp((double)x[chosen[j]] - most);
      for (int j = 0; j < k; j++) w[j] = (float)(scale * exp((double)x[chosen[j]] - most) / sum);
    } else {
      for (int e = 0; e < E; e++) s[e] = sigmoid(x[e]) + (c->expert_bias ? c->expert_bias[e] : 0.0);
      choose(c, s, chosen, gscore, gidx);
      double sum = 0.0;
      for (int j = 0; j < k; j++) sum += sigmoid(x[chosen[j]]);
      for (int j = 0; j < k; j++)
        w[j] = (float)(scale * (k > 1 ? sigmoid(x[chosen[j]]) / (sum + SIGMOID_EPS) : sigmoid(x[chosen[j]])));
    }
    for (int j = 0; j < k; j++) r->load[chosen[j]]++;
    aux_scores(c, x, q);
    for (int e = 0; e < E; e++) psum[e] += q[e];
    top_k(q, E, k, idx);
    for (int j = 0; j < k; j++) r->aux_load[idx[j]]++;
  }
  r->z_sum = z;
  loom_moe_route_losses(c, N, r);
  free(s), free(q), free(idx), free(gscore), free(gidx);
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
  double *u = malloc((size_t)k * sizeof *u), *du = malloc((size_t)k * sizeof *du);
  LOOM_CHECK(p && q && dq && u && du, "out of memory routing");
  const double scale = weight_scale(c);
  const double aux_scale = tokens ? (double)daux * c->aux_loss_coeff * E / ((double)tokens * (double)tokens * k) : 0.0;
  for (int n = 0; n < N; n++) {
    const float *x = logits + (size_t)n * E;
    const int *chosen = r->experts + (size_t)n * k;
    const float *dw = dweights + (size_t)n * k;
    float *dx = dlogits + (size_t)n * E;
    const double lse = softmax(x, E, p);
    for (int e = 0; e < E; e++) dx[e] = (float)(tokens ? dz * c->z_loss_coeff * 2.0 * lse / (double)tokens * p[e] : 0.0);
    /* The weights before their scale, u, rebuilt from the logits; du the grads of u. */
    double udu = 0.0, sum = 0.0;
    for (int j = 0; j < k; j++) du[j] = scale * dw[j];
    if (c->score == LOOM_MOE_SCORE_SOFTMAX && c->pre_softmax) {
      for (int j = 0; j < k; j++) u[j] = p[chosen[j]];
    } else if (c->score == LOOM_MOE_SCORE_SOFTMAX) {
      const double most = x[chosen[0]];
      for (int j = 0; j < k; j++) sum += u[j] = exp((double)x[chosen[j]] - most);
      for (int j = 0; j < k; j++) u[j] /= sum;
    } else {
      for (int j = 0; j < k; j++) sum += sigmoid(x[chosen[j]]);
      for (int j = 0; j < k; j++) u[j] = k > 1 ? sigmoid(x[chosen[j]]) / (sum + SIGMOID_EPS) : sigmoid(x[chosen[j]]);
    }
    for (int j = 0; j < k; j++) udu += u[j] * du[j];
    if (c->score == LOOM_MOE_SCORE_SOFTMAX && c->pre_softmax) { /* u = p at the chosen: through the whole softmax */
      for (int e = 0; e < E; e++) dx[e] -= (float)(p[e] * udu);
      for (int j = 0; j < k; j++) dx[chosen[j]] += (float)(u[j] * du[j]);
    } else if (c->score == LOOM_MOE_SCORE_SOFTMAX) { /* a softmax over the chosen logits */
      for (int j = 0; j < k; j++) dx[chosen[j]] += (float)(u[j] * (du[j] - udu));
    } else { /* normalised sigmoids of the chosen */
      for (int j = 0; j < k; j++) {
        const double sj = sigmoid(x[chosen[j]]), ds = k > 1 ? (du[j] - udu) / (sum + SIGMOID_EPS) : du[j];
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
      double all = 0.0;
      for (int e = 0; e < E; e++) all += sigmoid(x[e]);
      for (int e = 0; e < E; e++) {
        const double se = sigmoid(x[e]);
        dx[e] += (float)((dq[e] - qdq) / (all + SIGMOID_EPS) * se * (1.0 - se));
      }
    }
  }
  free(p), free(q), free(dq), free(u), free(du);
}

void loom_moe_expert_bias_update(float *bias, const int64_t *load, int experts, float rate) {
  int64_t sum = 0;
  for (int e = 0; e < experts; e++) sum += load[e];
  for (int e = 0; e < experts; e++) { /* mean - load[e], times experts: exact in integers */
    const int64_t offset = sum - load[e] * experts;
    bias[e] += offset > 0 ? rate : offset < 0 ? -rate : 0.0f;
  }
}
