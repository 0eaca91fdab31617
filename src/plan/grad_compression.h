/* How each grad tensor crosses data parallelism under the plan's
 * grad_compression: the one source for the runtime (optim/grad_compress.c)
 * and the plan's estimates. Sizes are in 32-bit words.
 *
 * PowerSGD of rank r: a tensor of two dimensions is a matrix M [n, m]; it
 * crosses as its factors P [n, r] and Q [m, r] when they are smaller than
 * it, (n + m) r < n m, and keeps its error feedback [n, m] and P and Q (Q is
 * the next step's warm start).
 *
 * Scaled sign (error-feedback signSGD): every matrix crosses as its mean
 * magnitude and one bit per element (loom_sign_message_words), gathered
 * from all dp replicas; it keeps its error feedback, its own message and
 * the dp gathered ones.
 *
 * Every other tensor (biases, norms, a matrix too small to gain) crosses
 * whole, as does everything without compression. */
#ifndef LOOM_GRAD_COMPRESSION_H
#define LOOM_GRAD_COMPRESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "core/tensor.h"
#include "plan/plan_io.h"

typedef struct {
  Loom__CompressionKind kind;
  int rank; /* PowerSGD's r */
  int dp;   /* replicas the grads cross */
} loom_compression;

/* "PowerSGD rank 4", "scaled sign" or "none", into out[len]. */
void loom_compression_describe(const loom_compression *c, char *out, size_t len);
/* Whether t crosses compressed; for PowerSGD, rows and cols get n and m. */
bool loom_compression_compresses(const loom_compression *c, const loom_tensor *t, int *rows, int *cols);
/* Words t sends per step from one replica (its compressed form, or all of it). */
int64_t loom_compression_sent_words(const loom_compression *c, const loom_tensor *t);
/* Words of state one replica keeps for t (all 0 when it crosses whole): its
 * error feedback, and PowerSGD's P and Q or the sign message and every
 * replica's gathered ones (optim/grad_compress.c's three buffers). */
typedef struct {
  int64_t error, a, b;
} loom_compression_state;
loom_compression_state loom_compression_state_of(const loom_compression *c, const loom_tensor *t);

#endif
