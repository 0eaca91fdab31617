/* A caching allocator over a raw one, as PyTorch keeps over cudaMalloc:
 * freed blocks stay reserved and serve later requests of about their size,
 * so a steady-state step asks the driver for nothing (cudaMalloc and
 * cudaFree synchronise the whole device). It also counts what it hands out
 * and what it holds, and their peaks: the figure a run compares with its
 * plan's memory estimate.
 *
 * Plain C with no other loom dependency, so the CUDA backend links it and
 * the CPU tests check it over malloc. Thread-safe. */
#ifndef LOOM_BLOCK_CACHE_H
#define LOOM_BLOCK_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Requests are rounded up to a multiple of this many bytes (cudaMalloc's own alignment is 256). */
#define LOOM_BLOCK_ALIGN 512

/* The memory underneath: alloc returns NULL when it has none left. */
typedef struct {
  void *(*alloc)(void *ctx, size_t bytes);
  void (*release)(void *ctx, void *p);
  void *ctx;
} loom_raw_memory;

typedef struct {
  size_t in_use, peak_in_use;     /* bytes of the blocks handed out (rounded sizes) */
  size_t reserved, peak_reserved; /* bytes taken from the raw allocator and not yet given back */
  uint64_t raw_allocs;            /* calls to the raw allocator that succeeded */
  uint64_t reuses;                /* requests served from a cached block */
} loom_block_cache_stats;

typedef struct loom_block_cache loom_block_cache;

/* NULL when out of host memory. */
loom_block_cache *loom_block_cache_new(loom_raw_memory raw);
/* A block of at least `bytes` (0 allowed: a distinct block of LOOM_BLOCK_ALIGN).
 * Reuses the smallest cached block that fits and wastes at most a quarter of
 * its size; otherwise asks the raw allocator, and when that fails gives every
 * cached block back and asks once more. NULL when even that fails. */
void *loom_block_cache_alloc(loom_block_cache *c, size_t bytes);
/* Returns a block to the cache; false (and nothing done) when p is not the
 * start of a block this cache handed out and has not had back. */
bool loom_block_cache_free(loom_block_cache *c, void *p);
/* Whether p points into a block handed out and not yet freed. */
bool loom_block_cache_owns(loom_block_cache *c, const void *p);
/* Gives every cached (free) block back to the raw allocator. */
void loom_block_cache_trim(loom_block_cache *c);
loom_block_cache_stats loom_block_cache_stats_of(loom_block_cache *c);
/* Sets both peaks to what is in use and reserved now. */
void loom_block_cache_reset_peaks(loom_block_cache *c);
/* Gives everything back, blocks still handed out included, and frees c. */
void loom_block_cache_delete(loom_block_cache *c);

#endif
