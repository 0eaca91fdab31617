/* The vocab-parallel embedding and cross-entropy (Megatron's
 * VocabParallelEmbedding and vocab_parallel_cross_entropy). Rank r of the TP
 * group owns rows [r*Vp/tp, (r+1)*Vp/tp) of wte, which serves as the token
 * embedding and, tied, as the LM head; Vp is padded to a multiple of 128*tp
 * and padded rows never enter the loss. Full logits never exist on one rank:
 * only per-row statistics (a max, a sum of exps, a target logit) cross it. */
#ifndef LOOM_VOCAB_PARALLEL_H
#define LOOM_VOCAB_PARALLEL_H

#include "backend/ops.h"
#include "tensor_parallel/linear.h"
#include "tensor_parallel/parallel_state.h"

/* This rank's vocab range: rows [start, start + rows) of the padded table,
 * `valid` of them real tokens (< vocab). */
typedef struct {
  int start, rows, valid;
} loom_vocab_range;

loom_vocab_range loom_vocab_range_of(const loom_tp *tp, int vocab, int padded_vocab);

/* out[n, h]: tokens[T, B] looked up in this rank's rows (others' masked to
 * 0), reduced over the group onto this rank's rows (n = T*B, or T*B/tp under
 * SP). full[T*B, h] is scratch (may alias out without SP). */
void loom_vocab_parallel_embedding_forward(const loom_tp *tp, const loom_ops *ops, float *out, float *full,
                                           const int *tokens, loom_linear_weight wte, loom_vocab_range v, int T, int B,
                                           int h);
/* dwte += grads of this rank's rows; dout[n, h]; dfull[T*B, h] scratch (may alias dout without SP). */
void loom_vocab_parallel_embedding_backward(const loom_tp *tp, const loom_ops *ops, float *dwte, const float *dout,
                                            float *dfull, const int *tokens, loom_vocab_range v, int T, int B, int h);

/* losses[N] from this rank's logits[N, v.rows]; lse[N] and picked[N] are
 * saved for backward, scratch[N] is scratch. Masked targets (< 0) get loss 0.
 * Returns the mean over unmasked targets (0 if none); the same on every rank. */
float loom_vocab_parallel_cross_entropy(const loom_tp *tp, const loom_ops *ops, float *losses, float *lse,
                                        float *picked, float *scratch, const float *logits, const int *targets,
                                        loom_vocab_range v, int N);
/* dlogits[N, v.rows] = dloss * (softmax - onehot) on this rank's columns (may alias logits). */
void loom_vocab_parallel_cross_entropy_backward(const loom_ops *ops, float *dlogits, const float *logits,
                                                const float *lse, const int *targets, loom_vocab_range v,
                                                float dloss, int N);

/* Vocab-parallel cross-entropy glue: turns each rank's log-sum-exp over its
 * vocab range into the global one (a max and a sum of n floats cross the
 * group), and sums the picked target logits (each target lives on one rank). */
void loom_tp_combine_logsumexp(const loom_tp *tp, const loom_ops *ops, float *lse, float *scratch, int n);
void loom_tp_combine_picked(const loom_tp *tp, float *picked, int n);
/* Global greedy prediction from each rank's best (val, idx) over its vocab
 * range (idx already global): the largest value wins, ties to the lowest id.
 * val, idx and scratch are host memory. */
void loom_tp_combine_argmax(const loom_tp *tp, float *val, int *idx, float *scratch, int n);

#endif
