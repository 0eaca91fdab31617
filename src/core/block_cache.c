/* The caching allocator (see block_cache.h). Blocks sit in one array; a
 * training run holds a few hundred, so linear scans cost nothing next to the
 * work each block feeds. */
#include <pthread.h>
#include <stdlib.h>
#include "core/block_cache.h"

typedef struct {
  char *base;
  size_t size;
  bool used;
} block;

struct loom_block_cache {
  loom_raw_memory raw;
  pthread_mutex_t lock;
  block *blocks;
  size_t count, cap;
  loom_block_cache_stats stats;
};

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

loom_block_cache *loom_block_cache_new(loom_raw_memory raw) {
  loom_block_cache *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->raw = raw;
  pthread_mutex_init(&c->lock, NULL);
  return c;
}

static void hand_out(loom_block_cache *c, block *b) {
  b->used = true;
  c->stats.in_use += b->size;
  c->stats.peak_in_use = max_size(c->stats.peak_in_use, c->stats.in_use);
}

/* The smallest free block of at least `size` bytes that wastes at most a quarter of itself. */
static block *best_fit(loom_block_cache *c, size_t size) {
  block *best = NULL;
  for (size_t i = 0; i < c->count; i++) {
    block *b = &c->blocks[i];
    if (!b->used && b->size >= size && b->size - size <= b->size / 4 && (!best || b->size < best->size)) best = b;
  }
  return best;
}

static void give_back_free(loom_block_cache *c) {
  size_t kept = 0;
  for (size_t i = 0; i < c->count; i++) {
    if (c->blocks[i].used) {
      c->blocks[kept++] = c->blocks[i];
      continue;
    }
    c->raw.release(c->raw.ctx, c->blocks[i].base);
    c->stats.reserved -= c->blocks[i].size;
  }
  c->count = kept;
}

static block *new_block(loom_block_cache *c, size_t size) {
  if (c->count == c->cap) {
    const size_t cap = c->cap ? 2 * c->cap : 64;
    block *grown = realloc(c->blocks, cap * sizeof *grown);
    if (!grown) return NULL;
    c->blocks = grown;
    c->cap = cap;
  }
  void *p = c->raw.alloc(c->raw.ctx, size);
  if (!p) {
    give_back_free(c);
    p = c->raw.alloc(c->raw.ctx, size);
  }
  if (!p) return NULL;
  c->stats.raw_allocs++;
  c->stats.reserved += size;
  c->stats.peak_reserved = max_size(c->stats.peak_reserved, c->stats.reserved);
  c->blocks[c->count] = (block){.base = p, .size = size};
  return &c->blocks[c->count++];
}

void *loom_block_cache_alloc(loom_block_cache *c, size_t bytes) {
  if (bytes > SIZE_MAX - LOOM_BLOCK_ALIGN) return NULL;
  const size_t size = max_size((bytes + LOOM_BLOCK_ALIGN - 1) / LOOM_BLOCK_ALIGN * LOOM_BLOCK_ALIGN, LOOM_BLOCK_ALIGN);
  pthread_mutex_lock(&c->lock);
  block *b = best_fit(c, size);
  if (b) c->stats.reuses++;
  else b = new_block(c, size);
  if (b) hand_out(c, b);
  void *p = b ? b->base : NULL;
  pthread_mutex_unlock(&c->lock);
  return p;
}

bool loom_block_cache_free(loom_block_cache *c, void *p) {
  bool found = false;
  pthread_mutex_lock(&c->lock);
  for (size_t i = 0; i < c->count && !found; i++) {
    block *b = &c->blocks[i];
    if (b->base != p || !b->used) continue;
    b->used = false;
    c->stats.in_use -= b->size;
    found = true;
  }
  pthread_mutex_unlock(&c->lock);
  return found;
}

bool loom_block_cache_owns(loom_block_cache *c, const void *p) {
  bool found = false;
  pthread_mutex_lock(&c->lock);
  for (size_t i = 0; i < c->count && !found; i++) {
    const block *b = &c->blocks[i];
    found = b->used && (const char *)p >= b->base && (const char *)p < b->base + b->size;
  }
  pthread_mutex_unlock(&c->lock);
  return found;
}

void loom_block_cache_trim(loom_block_cache *c) {
  pthread_mutex_lock(&c->lock);
  give_back_free(c);
  pthread_mutex_unlock(&c->lock);
}

loom_block_cache_stats loom_block_cache_stats_of(loom_block_cache *c) {
  pthread_mutex_lock(&c->lock);
  const loom_block_cache_stats s = c->stats;
  pthread_mutex_unlock(&c->lock);
  return s;
}

void loom_block_cache_reset_peaks(loom_block_cache *c) {
  pthread_mutex_lock(&c->lock);
  c->stats.peak_in_use = c->stats.in_use;
  c->stats.peak_reserved = c->stats.reserved;
  pthread_mutex_unlock(&c->lock);
}

void loom_block_cache_delete(loom_block_cache *c) {
  if (!c) return;
  for (size_t i = 0; i < c->count; i++) c->raw.release(c->raw.ctx, c->blocks[i].base);
  pthread_mutex_destroy(&c->lock);
  free(c->blocks);
  free(c);
}
