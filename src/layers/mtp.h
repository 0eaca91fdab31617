/* Multi-token prediction (DeepSeek-V3's MTP; Megatron-Core's
 * MultiTokenPredictionLayer): the pieces of one module around its block.
 *
 * Depth k (0-based) sees, at each position t, the normed hidden state of
 * depth k - 1 (the main model's final norm output for k = 0) and the
 * embedding of token t + k + 1, and predicts token t + k + 2:
 *
 *   x_k = [enorm(embed(token[t + k + 1])) | hnorm(h_{k-1}[t])] W_eh^T
 *   h_k = norm_k(block_k(x_k)),   logits_k = head(h_k)
 *
 * The block is a layer of the model's table; the embedding and the head are
 * the model's own. The training loss is the main loss plus scale times the
 * depths' mean loss, each depth's summed over its scored targets and divided
 * by the main loss's count, as DeepSeek-V3's paper writes it (1/T over each
 * sequence); the last k + 1 positions of a sequence have no target at depth k.
 *
 * Under tensor parallelism W_eh is replicated (its grad this rank's rows'
 * share under sequence parallelism, summed over tp with the norms'); the
 * combination runs on this rank's n rows outside the parallel regions. */
#ifndef LOOM_MTP_H
#define LOOM_MTP_H

#include "backend/ops.h"
#include "layers/gpt_params.h"
#include "tensor_parallel/linear.h"

/* Depth k's inputs and targets from a micro-batch's tokens and targets
 * [T, B] (sequence-major): token t + k + 1 at position t and its target,
 * none (token 0, target -1) past the sequence's end. */
void loom_mtp_shift(const int *tokens, const int *targets, int T, int B, int k, int *mtp_tokens, int *mtp_targets);

/* The training loss of a main loss and the depths' mean loss. */
static inline double loom_mtp_total_loss(const loom_gpt_config *c, double main_loss, double mtp_mean) {
  return c->mtp_layers > 0 ? main_loss + (double)c->mtp_loss_scale * mtp_mean : main_loss;
}
/* The weight of one depth's loss in the training loss: scale / depths. */
static inline float loom_mtp_depth_weight(const loom_gpt_config *c) {
  return c->mtp_layers > 0 ? c->mtp_loss_scale / (float)c->mtp_layers : 0.0f;
}

/* One depth's saved activations, n rows of h. */
typedef struct {
  float *emb;   /* [n, h] the embedding of the tokens ahead (enorm's input) */
  float *hin;   /* [n, h] the previous depth's normed hidden state (hnorm's input) */
  float *stats; /* [4, n] enorm's mean and rstd, hnorm's mean and rstd */
  float *cat;   /* [n, 2h] eh_proj's input: each row enorm(e) | hnorm(h) */
  float *x;     /* [n, h] eh_proj's output: the block's input */
} loom_mtp_acts;

/* Scratch: the two normed halves one above the other, and the row orders
 * that interleave them into cat's rows and back (device ints, set by
 * loom_mtp_orders). */
typedef struct {
  float *pair;      /* [2n, h] */
  int *interleave;  /* [2n] cat's row 2i + j is pair's row j n + i */
  int *split;       /* [2n] pair's row j n + i is cat's row 2i + j */
} loom_mtp_scratch;

/* The row orders of n rows (host memory, 2n each), to copy into the scratch's. */
void loom_mtp_orders(int n, int *interleave, int *split);

typedef struct {
  const loom_mtp_weights *v; /* the norms' weights (fp32 values) */
  loom_linear_weight eh_proj;
} loom_mtp_compute_weights;

typedef struct {
  loom_norm_kind norm;
  float eps;
  int n, h;
  bool bf16; /* round the outputs and the grads to bf16 values, as a bf16 run holds them */
} loom_mtp_shape;

/* x = eh_proj([enorm(emb) | hnorm(hin)]) from a->emb and a->hin. */
void loom_mtp_combine_forward(const loom_ops *ops, loom_mtp_acts *a, const loom_mtp_scratch *s,
                              const loom_mtp_compute_weights *w, const loom_mtp_shape *shape);
/* From dx (x's grad, consumed as scratch): the weight grads (added into g),
 * demb (emb's grad, written) and dhin (hin's grad, written). dcat is
 * scratch of [n, 2h]. */
void loom_mtp_combine_backward(const loom_ops *ops, const loom_mtp_acts *a, const loom_mtp_scratch *s,
                               const loom_mtp_compute_weights *w, loom_mtp_weights *g, const loom_mtp_shape *shape,
                               const float *dx, float *dcat, float *demb, float *dhin);

#endif
