/* Seeded permutations. */
#include "core/rng.h"
#include "data/shuffle.h"

void loom_shuffle_identity(int64_t *a, int64_t n, uint64_t seed, uint64_t stream) {
  for (int64_t i = 0; i < n; i++) a[i] = i;
  for (int64_t i = n - 1; i > 0; i--) {
    const uint64_t r = ((uint64_t)loom_rng_u32(seed, stream, 2 * (uint64_t)i) << 32) | loom_rng_u32(seed, stream, 2 * (uint64_t)i + 1);
    const int64_t j = (int64_t)(r % (uint64_t)(i + 1));
    const int64_t tmp = a[i];
    a[i] = a[j];
    a[j] = tmp;
  }
}

int64_t loom_permute_index(int64_t x, int64_t n, uint64_t seed, uint64_t stream) {
  if (n <= 1) return 0;
  int bits = 2;
  while (bits < 63 && ((uint64_t)1 << bits) < (uint64_t)n) bits += 2;
  const int half = bits / 2;
  const uint64_t mask = ((uint64_t)1 << half) - 1;
  uint64_t v = (uint64_t)x;
  do { /* at most 4n values to walk through, so about 4 rounds of walking at worst on average */
    uint64_t left = v >> half, right = v & mask;
    for (uint64_t round = 0; round < 4; round++) {
      const uint64_t f = ((uint64_t)loom_rng_u32(seed, stream, round << 56 | right << 1) << 32 |
                          loom_rng_u32(seed, stream, round << 56 | right << 1 | 1)) & mask;
      const uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    v = left << half | right;
  } while (v >= (uint64_t)n);
  return (int64_t)v;
}
