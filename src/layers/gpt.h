/* The GPT model on one rank: token + position embedding, pre-LN blocks, final
 * LayerNorm, LM head tied to wte, and the mean cross-entropy loss.
 * Activations live in one buffer sized for a (T, B) micro-batch.
 *
 * Under tensor parallelism (loom_tp with size > 1) this rank holds its
 * shards: the vocab-parallel wte serves as embedding and LM head, and the
 * loss is computed without full logits ever existing on one rank. Every rank
 * of the group sees the same tokens and returns the same loss. */
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
  float *embed_full;        /* [N, h] this rank's vocab rows of the embedding, before reduction */
  float *encoded;           /* [n, h] embedding output (n = N/tp rows under SP, else N) */
  loom_block_acts *blocks;  /* [layers] */
  float *ln_f_mean, *ln_f_rstd; /* [n] */
  float *ln_f;              /* [N, h] (gathered under SP) */
  float *logits;            /* [N, Vp/tp]; backward overwrites it with dlogits */
  float *losses;            /* [N] per-token loss */
  float *lse, *picked;      /* [N] log-sum-exp of each row's logits, and its target's logit */
  float *lse_scratch;       /* [N] */
  float *dres;              /* [n, h] running residual grad */
  float *d_ln_f;            /* [N, h] */
  loom_block_scratch scratch;
  int *tokens, *targets;    /* [N] copies of the last forward's batch, [s, b] order */
} loom_gpt_acts;

typedef struct {
  loom_gpt_params p;
  loom_gpt_acts a;
  const loom_ops *ops;
  uint64_t seed;
  loom_tp tp;
} loom_gpt;

/* What one forward pass sees. tokens/targets are [T, B] sequence-major. */
typedef struct {
  const int *tokens;
  const int *targets;     /* may be NULL for inference; < 0 masks a position */
  int64_t sample_offset;  /* global index of this micro-batch's sample 0 */
  int64_t step;           /* dropout key */
  bool train;             /* enables dropout */
} loom_gpt_batch;

/* Builds and initialises this rank's part of the model. tp NULL: serial.
 * Under TP the vocab is padded to a multiple of 128 * tp. */
loom_status loom_gpt_init(loom_gpt *m, const loom_gpt_config *cfg, const loom_ops *ops, uint64_t seed,
                          const loom_tp *tp);
void loom_gpt_free(loom_gpt *m);
/* (Re)sizes activations for micro-batch (T, B); T must not exceed cfg.seq. */
loom_status loom_gpt_set_batch_shape(loom_gpt *m, int T, int B);

/* Bytes of activations and scratch that a (T, B) micro-batch allocates on
 * one rank of a tp-way split (sequence parallel or not). */
size_t loom_gpt_activation_bytes(const loom_gpt_config *cfg, int T, int B, int tp, bool sequence_parallel);

/* Runs forward; returns the mean loss over unmasked targets (0 if none). */
float loom_gpt_forward(loom_gpt *m, const loom_gpt_batch *batch);
/* Backward of the last forward; adds into m->p.grads with each token's loss
 * weighted by dloss (use 1 / tokens in the global batch to average). */
void loom_gpt_backward(loom_gpt *m, const loom_gpt_batch *batch, float dloss);
/* Under sequence parallelism each rank's grads of TP-replicated parameters
 * (norms, wpe, row-parallel biases) cover only its positions: sums them over
 * the TP group. Call once per step after the last backward. */
void loom_gpt_sync_replicated_grads(loom_gpt *m);
void loom_gpt_zero_grad(loom_gpt *m);
/* Greedy next-token prediction for every row of the last forward, over the
 * whole vocab even when it is split across the TP group (collective there).
 * out[N]; clobbers the forward's picked logits. */
void loom_gpt_predict(loom_gpt *m, int *out);

#endif
