/* Compressed data-parallel grad sums with error feedback, for the plan's
 * grad_compression (plan/grad_compression.h says which tensors compress).
 * On every replica i, each compressed grad G_i first takes in its error
 * feedback, A_i = G_i + E_i; the replicas then agree on an approximation S
 * of sum_i A_i, every one of them computing the same bits; G becomes S and
 * E_i = A_i less replica i's share of S (S / dp for PowerSGD, whose S is
 * joint; its own message for the sign method), so the feedback over all
 * replicas is exactly what the sum lost, and goes into the next step. Sums rather than means match loom's
 * data parallelism (the loss is already scaled by the global batch).
 *
 * PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019), as PyTorch's
 * powerSGD_hook runs it, for a matrix A [n, m] and rank r:
 *   P = sum_i A_i Q        all-reduced; then P's columns orthonormalised
 *   Q = sum_i A_i^T P      all-reduced; kept as the next step's warm start
 *   S = P Q^T              the sum's projection onto span(P)
 * The first Q is drawn from the keyed RNG, the same on every replica; all of
 * a chunk's P cross in one all-reduce, then all of its Q in another.
 *
 * Scaled sign (error-feedback signSGD, Karimireddy et al., ICML 2019; the
 * compressor of 1-bit Adam): each replica sends its mean magnitude and one
 * sign bit per element; S = sum_i mean_i sign(A_i), every replica unpacking
 * the gathered messages in rank order. One all-gather per chunk.
 *
 * Tensors that cross whole are all-reduced, neighbours together. */
#ifndef LOOM_GRAD_COMPRESS_H
#define LOOM_GRAD_COMPRESS_H

#include "backend/ops.h"
#include "comm/comm.h"
#include "layers/gpt_params.h"
#include "plan/grad_compression.h"

/* One compressed grad: its index in the grads, its shape, and where its
 * error feedback and its part of a and b lie. */
typedef struct {
  int tensor, rows, cols;
  size_t error_at, a_at, b_at;
} loom_compressed_grad;

typedef struct {
  loom_compression cfg;
  int count;                  /* compressed tensors */
  loom_compressed_grad *item; /* [count], in the grads' order */
  size_t error_floats, a_words, b_words;
  float *error;    /* error feedback */
  float *a, *b;    /* PowerSGD: all P, all Q. Sign: this replica's messages, and every replica's (dp x a_words) */
  const loom_allocator *mem;
  int64_t sent_words, whole_words; /* per step, this replica */
} loom_grad_compress;

/* State for the grads of p under cfg (whose dp is the group's size); Q's
 * first values come from seed and the tensors' indices. */
loom_status loom_grad_compress_init(loom_grad_compress *s, const loom_compression *cfg, const loom_gpt_params *p,
                                    uint64_t seed, const loom_ops *ops);
void loom_grad_compress_free(loom_grad_compress *s);
/* Replaces p's grads by their compressed sum over dp; collective over dp. */
void loom_grad_compress_reduce(loom_grad_compress *s, loom_gpt_params *p, loom_comm *dp, const loom_ops *ops);

#endif
