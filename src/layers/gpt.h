/* The GPT model on one rank: token + position embedding, pre-LN blocks, final
 * LayerNorm, LM head tied to wte, and the mean cross-entropy loss.
 * Activations live in one buffer sized for a (T, B) micro-batch. */
#ifndef LOOM_GPT_H
#define LOOM_GPT_H

#include <stdbool.h>
#include <stdint.h>
#include "backend/ops.h"
#include "layers/block.h"
#include "layers/gpt_params.h"

typedef struct {
  int T, B;
  loom_buffer mem;          /* every activation and scratch view below */
  float *encoded;           /* [N, h] embedding output */
  loom_block_acts *blocks;  /* [layers] */
  float *ln_f, *ln_f_mean, *ln_f_rstd; /* [N, h], [N], [N] */
  float *logits;            /* [N, Vp]; backward overwrites it with dlogits */
  float *losses;            /* [N] per-token loss */
  float *lse, *picked;      /* [N] log-sum-exp of each row's logits, and its target's logit */
  float *dres;              /* [N, h] running residual grad */
  float *d_ln_f;            /* [N, h] */
  loom_block_scratch scratch;
  int *tokens, *targets;    /* [N] copies of the last forward's batch, [s, b] order */
} loom_gpt_acts;

typedef struct {
  loom_gpt_params p;
  loom_gpt_acts a;
  const loom_ops *ops;
  uint64_t seed;
} loom_gpt;

/* What one forward pass sees. tokens/targets are [T, B] sequence-major. */
typedef struct {
  const int *tokens;
  const int *targets;     /* may be NULL for inference; < 0 masks a position */
  int64_t sample_offset;  /* global index of this micro-batch's sample 0 */
  int64_t step;           /* dropout key */
  bool train;             /* enables dropout */
} loom_gpt_batch;

loom_status loom_gpt_init(loom_gpt *m, const loom_gpt_config *cfg, const loom_ops *ops, uint64_t seed);
void loom_gpt_free(loom_gpt *m);
/* (Re)sizes activations for micro-batch (T, B); T must not exceed cfg.seq. */
loom_status loom_gpt_set_batch_shape(loom_gpt *m, int T, int B);

/* Bytes of activations and scratch that a (T, B) micro-batch allocates. */
size_t loom_gpt_activation_bytes(const loom_gpt_config *cfg, int T, int B);

/* Runs forward; returns the mean loss over unmasked targets (0 if none). */
float loom_gpt_forward(loom_gpt *m, const loom_gpt_batch *batch);
/* Backward of the last forward; adds into m->p.grads with each token's loss
 * weighted by dloss (use 1 / tokens in the global batch to average). */
void loom_gpt_backward(loom_gpt *m, const loom_gpt_batch *batch, float dloss);
void loom_gpt_zero_grad(loom_gpt *m);

#endif
