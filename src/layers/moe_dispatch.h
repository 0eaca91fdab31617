/* Where a Mixture-of-Experts layer's tokens go: from the router's choices
 * (moe_router.h), the rows each expert receives, in expert order and, within
 * an expert, in token order; each choice's place among those rows (the
 * backend's rows_gather and rows_combine move them, ops.h); and, with a
 * capacity factor, which choices are dropped (Megatron-Core's
 * --moe-expert-capacity-factor and --moe-token-drop-policy). Experts are
 * numbered so that an expert-parallel rank's are consecutive: the rows for
 * rank r are those of its experts, together (loom_moe_rank_rows). */
#ifndef LOOM_MOE_DISPATCH_H
#define LOOM_MOE_DISPATCH_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
  int experts, topk;
  /* > 0: each expert takes at most ceil(N k / E x capacity_factor) tokens,
   * as Megatron's get_capacity; 0: dropless. */
  double capacity_factor; /* a double, as Megatron computes it: ceil(2.5 x 0.8) is 2 */
  /* Over capacity, drop the latest tokens (Megatron's "position" policy);
   * else the choices of lowest weight, an equal weight keeping the earlier
   * token ("probs", Megatron's default). */
  bool drop_by_position;
} loom_moe_dispatch_config;

typedef struct {
  int64_t *counts;   /* [experts] rows each expert receives */
  int *rows;         /* [N k] the token of each row, expert by expert (rows_total of them used) */
  int *slots;        /* [N k] the row of token n's j-th choice (n k + j), or -1 where dropped */
  int64_t rows_total, dropped;
} loom_moe_dispatch;

/* Plans the dispatch of N tokens' choices experts[N k] (weights[N k], read
 * for the "probs" policy) into d, whose arrays the caller sizes. A choice
 * of expert -1 is one dropped already (by a plan over a larger set of
 * tokens these are part of): it gets no row, and counts as dropped. */
void loom_moe_dispatch_plan(const loom_moe_dispatch_config *c, const int *experts, const float *weights, int N,
                            loom_moe_dispatch *d);
/* Rows for each of ep ranks, each owning experts / ep consecutive experts
 * (rows_to[r]): what an all-to-all-v sends each peer, in rows. */
void loom_moe_rank_rows(const loom_moe_dispatch *d, int experts, int ep, int64_t *rows_to);
/* An expert's capacity under c for N tokens (INT64_MAX when dropless). */
int64_t loom_moe_capacity(const loom_moe_dispatch_config *c, int N);

#endif
