/* Philox-4x32-10 and the keyed uniform/normal draws built on it. */
#include <math.h>
#include "core/rng.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void loom_philox4x32(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; round++) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
    uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
    uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1;
    c3 = (uint32_t)p0;
    c0 = n0;
    c2 = n2;
    k0 += PHILOX_W0;
    k1 += PHILOX_W1;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
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

/* The Philox block holding element `index` of (seed, stream). */
static void rng_block(uint64_t seed, uint64_t stream, uint64_t block, uint32_t out[4]) {
  const uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream,
                           (uint32_t)(stream >> 32)};
  const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  loom_philox4x32(ctr, key, out);
}

static inline float u32_to_unit(uint32_t x) { return (float)(x >> 8) * (1.0f / 16777216.0f); }

/* Box-Muller on lanes (0,1) and (2,3): lane i%4 picks cos or sin of its pair. */
static inline float block_normal(const uint32_t r[4], unsigned lane) {
  const unsigned pair = lane & 2u;
  const float u1 = ((float)(r[pair] >> 8) + 1.0f) * (1.0f / 16777216.0f); /* (0, 1] */
  const float u2 = u32_to_unit(r[pair + 1]);
  const float radius = sqrtf(-2.0f * logf(u1));
  const float theta = 6.28318530717958647692f * u2;
  return (lane & 1u) ? radius * sinf(theta) : radius * cosf(theta);
}

uint32_t loom_rng_u32(uint64_t seed, uint64_t stream, uint64_t index) {
  uint32_t r[4];
  rng_block(seed, stream, index >> 2, r);
  return r[index & 3];
}

float loom_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return u32_to_unit(loom_rng_u32(seed, stream, index));
}

float loom_rng_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  uint32_t r[4];
  rng_block(seed, stream, index >> 2, r);
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
