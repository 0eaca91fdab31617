/* PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019): grads summed over
 * data parallelism through rank-r factors, with error feedback and warm
 * start, as PyTorch's powerSGD_hook does it.
 *
 * For each grad matrix G [n, m] that plan/grad_compression.h compresses,
 * on every replica i, once per step:
 *   A_i = G_i + E_i              the grad plus what earlier steps left out
 *   P = sum_i A_i Q              all-reduced; then orthonormalised columns
 *   Q = sum_i A_i^T P            all-reduced; kept as the next step's start
 *   G = P Q^T                    the sum's projection onto span(P)
 *   E_i = A_i - P Q^T / dp       so sum_i E_i is exactly what the sum lost
 * All of a chunk's P cross in one all-reduce, then all of its Q in another;
 * every other tensor crosses whole, in runs of neighbours. Summing rather
 * than averaging matches loom's data parallelism (the loss is already
 * scaled by the global batch); orthonormalising makes P's scale irrelevant.
 * The first Q is drawn from the keyed RNG, the same on every replica, and
 * every replica computes the same P, Q and G from the same sums (the
 * orthonormalisation is serial, so thread counts do not matter). */
#ifndef LOOM_POWERSGD_H
#define LOOM_POWERSGD_H

#include "backend/ops.h"
#include "comm/comm.h"
#include "layers/gpt_params.h"

typedef struct {
  int rank;       /* r */
  int count;      /* compressed tensors */
  int *tensor;    /* [count] their indices in the grads */
  int *rows, *cols;
  size_t *error_at, *p_at, *q_at; /* [count] offsets into error, p, q */
  size_t error_floats, p_floats, q_floats;
  float *error, *p, *q; /* backend memory */
  const loom_allocator *mem;
  int64_t sent_floats, whole_floats; /* per step, this replica */
} loom_powersgd;

/* State for the grads of p (their shapes decide what is compressed); Q's
 * first values come from seed and the tensors' indices. */
loom_status loom_powersgd_init(loom_powersgd *s, const loom_gpt_params *p, int rank, uint64_t seed,
                               const loom_ops *ops);
void loom_powersgd_free(loom_powersgd *s);
/* Replaces p's grads by their (compressed) sum over dp; collective over dp. */
void loom_powersgd_reduce(loom_powersgd *s, loom_gpt_params *p, loom_comm *dp, const loom_ops *ops);

#endif
