/* The router of a Mixture-of-Experts layer, as Megatron-Core computes it
 * (megatron/core/transformer/moe/moe_utils.py, v0.15): from each token's
 * router logits over the experts, its top-k experts and their weights, the
 * Switch/GShard load-balancing loss and the ST-MoE z-loss, and the grads of
 * all three back to the logits. It runs in fp32 on host values: the
 * reference every backend's router is held to, and the rule routing
 * follows everywhere (ties between equal scores go to the lower expert
 * index, so routing is a function of the logits alone, the same under every
 * plan). */
#ifndef LOOM_MOE_ROUTER_H
#define LOOM_MOE_ROUTER_H

#include <stdbool.h>
#include <stdint.h>
#include "layers/gpt_config.h"

typedef struct {
  int experts, topk;
  loom_moe_score score;
  /* softmax: over every expert before the top-k (Megatron's
   * --moe-router-pre-softmax; the weights are those probabilities), else
   * over the chosen k logits after it. */
  bool pre_softmax;
  /* sigmoid: [experts] added to the scores for choosing only (DeepSeek-V3's
   * aux-loss-free balancing); NULL: none. */
  const float *expert_bias;
  float aux_loss_coeff, z_loss_coeff;
  /* Group-limited selection (DeepSeek-V3's; 0: none): the experts in
   * `groups` equal groups, each scored by the sum of its best topk /
   * group_topk scores, the top k chosen among the best group_topk groups
   * (Megatron-Core's group_limited_topk, on the scores the top-k reads). */
  int groups, group_topk;
  float topk_scaling; /* the chosen weights' factor (--moe-router-topk-scaling-factor; 0: 1) */
} loom_moe_router;

/* The routing of N tokens: a micro-batch's, or (sequence parallelism) one
 * rank's share of it, whose losses then count the whole micro-batch's
 * tokens (Megatron sums the counts over the tensor-parallel group). */
typedef struct {
  int *experts;          /* [N, topk] chosen experts, highest score first */
  float *weights;        /* [N, topk] their weights in the combine */
  int64_t *load;         /* [experts] tokens routed to each */
  int64_t *aux_load;     /* [experts] each one's count in the aux loss's own top-k of the unbiased scores */
  double *score_sum;     /* [experts] the sum over these tokens of each one's score in the aux loss */
  double z_sum;          /* the sum over these tokens of logsumexp(logits)^2 */
  /* For a micro-batch of `tokens` tokens whose aux_load is summed over its
   * ranks (loom_moe_route_losses), these tokens' shares of: */
  double aux_loss;       /* coeff * E / (tokens^2 k) * sum over e of score_sum[e] * aux_load[e] */
  double z_loss;         /* coeff * z_sum / tokens */
} loom_moe_routing;

/* Routes logits[N, experts] into r, whose arrays the caller sizes; the
 * losses are those of a micro-batch of these N tokens alone. */
void loom_moe_route(const loom_moe_router *c, const float *logits, int N, loom_moe_routing *r);
/* Sets r's losses for a micro-batch of `tokens` tokens, r->aux_load being
 * the whole micro-batch's counts. */
void loom_moe_route_losses(const loom_moe_router *c, int64_t tokens, loom_moe_routing *r);
/* dlogits[N, experts] = the grad of dweights . weights + daux * aux_loss +
 * dz * z_loss with respect to the logits, from r, the routing of these
 * logits in a micro-batch of `tokens` tokens (the chosen experts and the
 * counts are constants, as in Megatron). */
void loom_moe_route_backward(const loom_moe_router *c, const float *logits, int N, int64_t tokens,
                             const loom_moe_routing *r, const float *dweights, float daux, float dz, float *dlogits);

/* DeepSeek-V3's aux-loss-free balancing, as Megatron-Core steps it
 * (moe_utils.get_updated_expert_bias): bias[e] += rate * sign(mean - load[e])
 * over one layer's experts, load being a step's tokens per expert summed
 * over every rank that routed them (a common factor, such as tensor-parallel
 * ranks each counting the same tokens, changes no sign). */
void loom_moe_expert_bias_update(float *bias, const int64_t *load, int experts, float rate);

#endif
