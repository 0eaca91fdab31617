/* Philox-4x32-10 and the keyed uniform/normal draws built on it. */
#include <math.h>
#include "core/rng.h"
#include "core/rng_math.h"

void loom_philox4x32(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
  loom_philox_block(counter, key, out);
}

uint64_t loom_hash_str(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++) {
    h ^= (unsigned char)*s;
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t loom_hash_u64(uint64_t h, uint64_t v) {
  uint64_t z = h ^ (v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Box-Muller on lanes (0,1) and (2,3): lane i%4 picks cos or sin of its pair. */
static inline float block_normal(const uint32_t r[4], unsigned lane) {
  const unsigned pair = lane & 2u;
  const float u1 = ((float)(r[pair] >> 8) + 1.0f) * (1.0f / 16777216.0f); /* (0, 1] */
  const float u2 = loom_u32_to_unit(r[pair + 1]);
  const float radius = sqrtf(-2.0f * logf(u1));
  const float theta = 6.28318530717958647692f * u2;
  return (lane & 1u) ? radius * sinf(theta) : radius * cosf(theta);
}

uint32_t loom_rng_u32(uint64_t seed, uint64_t stream, uint64_t index) {
  uint32_t r[4];
  loom_rng_block(seed, stream, index >> 2, r);
  return r[index & 3];
}

float loom_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return loom_rng_uniform_at(seed, stream, index);
}

float loom_rng_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  uint32_t r[4];
  loom_rng_block(seed, stream, index >> 2, r);
  return block_normal(r, (unsigned)(index & 3));
}

void loom_rng_fill_normal(float *out, size_t n, uint64_t seed, uint64_t stream,
                          uint64_t offset, float mean, float std) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; i++) {
    out[i] = mean + std * loom_rng_normal(seed, stream, offset + i);
  }
}

void loom_rng_fill_uniform(float *out, size_t n, uint64_t seed, uint64_t stream, uint64_t offset) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; i++) {
    out[i] = loom_rng_uniform(seed, stream, offset + i);
  }
}
