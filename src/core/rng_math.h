/* The keyed RNG's arithmetic, inline and callable from host C and from CUDA
 * kernels alike, so both backends draw bit-identical integers and uniforms
 * (normals go through logf/sinf/cosf, whose last bits may differ on a GPU).
 * core/rng.c builds the public functions on these. */
#ifndef LOOM_RNG_MATH_H
#define LOOM_RNG_MATH_H

#include <stdint.h>

#ifdef __CUDACC__
#define LOOM_HD __host__ __device__ static inline
#else
#define LOOM_HD static inline
#endif

#define LOOM_PHILOX_M0 0xD2511F53u
#define LOOM_PHILOX_M1 0xCD9E8D57u
#define LOOM_PHILOX_W0 0x9E3779B9u
#define LOOM_PHILOX_W1 0xBB67AE85u

/* One Philox-4x32-10 block. */
LOOM_HD void loom_philox_block(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; round++) {
    const uint64_t p0 = (uint64_t)LOOM_PHILOX_M0 * c0;
    const uint64_t p1 = (uint64_t)LOOM_PHILOX_M1 * c2;
    const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1;
    c3 = (uint32_t)p0;
    c0 = n0;
    c2 = n2;
    k0 += LOOM_PHILOX_W0;
    k1 += LOOM_PHILOX_W1;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

/* The block holding element `index` of (seed, stream): element i is lane i%4 of block i/4. */
LOOM_HD void loom_rng_block(uint64_t seed, uint64_t stream, uint64_t block, uint32_t out[4]) {
  const uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream, (uint32_t)(stream >> 32)};
  const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  loom_philox_block(ctr, key, out);
}

/* 24 random bits as a float in [0, 1): exact in fp32 on every device. */
LOOM_HD float loom_u32_to_unit(uint32_t x) { return (float)(x >> 8) * (1.0f / 16777216.0f); }

LOOM_HD float loom_rng_uniform_at(uint64_t seed, uint64_t stream, uint64_t index) {
  uint32_t r[4];
  loom_rng_block(seed, stream, index >> 2, r);
  return loom_u32_to_unit(r[index & 3]);
}

#endif
