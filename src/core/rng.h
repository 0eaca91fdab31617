/* Counter-based RNG (Philox-4x32-10, Salmon et al. 2011).
 *
 * Every random value in loom is a pure function of (seed, stream, index):
 * a parameter's stream is the hash of its canonical name and the index its
 * global element index, so any rank can draw exactly its own shard and the
 * full model is the same under every partition plan. Element i uses Philox
 * block i/4 and lane i%4, so a slice [off, off+n) equals that slice of the
 * full generation. */
#ifndef LOOM_RNG_H
#define LOOM_RNG_H

#include <stddef.h>
#include <stdint.h>

/* One Philox-4x32-10 block: out = philox(counter, key). */
void loom_philox4x32(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]);

/* 64-bit FNV-1a hash, used to turn canonical names into streams. */
uint64_t loom_hash_str(const char *s);
/* Mix several integers into one stream id (splitmix64 finaliser chain). */
uint64_t loom_hash_u64(uint64_t h, uint64_t v);

/* Raw 32-bit value for (seed, stream, index). */
uint32_t loom_rng_u32(uint64_t seed, uint64_t stream, uint64_t index);
/* Uniform in [0, 1) with 24 random bits. */
float loom_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);
/* Standard normal (Box-Muller on the block's lane pair). */
float loom_rng_normal(uint64_t seed, uint64_t stream, uint64_t index);

/* out[i] = mean + std * normal(seed, stream, offset + i) for i < n. */
void loom_rng_fill_normal(float *out, size_t n, uint64_t seed, uint64_t stream,
                          uint64_t offset, float mean, float std);
/* out[i] = uniform(seed, stream, offset + i) for i < n. */
void loom_rng_fill_uniform(float *out, size_t n, uint64_t seed, uint64_t stream, uint64_t offset);

#endif
