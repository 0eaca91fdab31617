/* Seeded permutations for data order, pure functions of (seed, stream). */
#ifndef LOOM_SHUFFLE_H
#define LOOM_SHUFFLE_H

#include <stdint.h>

/* a[i] = the i-th element of a Fisher-Yates shuffle of 0..n-1. */
void loom_shuffle_identity(int64_t *a, int64_t n, uint64_t seed, uint64_t stream);
/* Where x lands in a permutation of [0, n), computed alone in O(1) memory
 * (a 4-round Feistel network over the next even power of two, walking
 * cycles back into range): for sample orders too long to hold. */
int64_t loom_permute_index(int64_t x, int64_t n, uint64_t seed, uint64_t stream);

#endif
