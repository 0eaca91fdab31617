/* Buffers handed out by a schedule's events. */
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "pipeline/buffer_pool.h"

void loom_pool_init(loom_buffer_pool *pool, int groups, const int *cap, int keys) {
  *pool = (loom_buffer_pool){.groups = groups, .keys = keys};
  for (int g = 0; g < groups; g++) pool->most = cap[g] > pool->most ? cap[g] : pool->most;
  pool->of = loom_xmalloc((size_t)groups * (keys > 0 ? keys : 1) * sizeof(int), "buffer map");
  pool->cap = loom_xmalloc((size_t)groups * sizeof(int), "buffer pool");
  memcpy(pool->cap, cap, (size_t)groups * sizeof(int));
  pool->top = loom_xcalloc((size_t)groups, sizeof(int), "buffer pool");
  pool->free = loom_xcalloc((size_t)groups * (pool->most > 0 ? pool->most : 1), sizeof(int), "buffer pool");
  loom_pool_reset(pool);
}

void loom_pool_free(loom_buffer_pool *pool) {
  free(pool->of);
  free(pool->cap);
  free(pool->top);
  free(pool->free);
  memset(pool, 0, sizeof *pool);
}

void loom_pool_widen(loom_buffer_pool *pool, int keys) {
  if (keys <= pool->keys) return;
  free(pool->of);
  pool->keys = keys;
  pool->of = loom_xmalloc((size_t)pool->groups * keys * sizeof(int), "buffer map");
  loom_pool_reset(pool);
}

void loom_pool_reset(loom_buffer_pool *pool) {
  for (int i = 0; i < pool->groups * pool->keys; i++) pool->of[i] = -1;
  for (int g = 0; g < pool->groups; g++) {
    pool->top[g] = pool->cap[g];
    for (int k = 0; k < pool->cap[g]; k++) pool->free[g * pool->most + k] = pool->cap[g] - 1 - k;
  }
}

static int *entry(const loom_buffer_pool *pool, int group, int key) {
  LOOM_CHECK(group >= 0 && group < pool->groups && key >= 0 && key < pool->keys, "a buffer event out of the pool's range");
  return &pool->of[group * pool->keys + key];
}

int loom_pool_take(loom_buffer_pool *pool, int group, int key) {
  int *at = entry(pool, group, key);
  LOOM_CHECK(*at < 0, "a buffer taken twice by its events");
  LOOM_CHECK(pool->top[group] > 0, "the executor holds more buffers than its schedule's verified peak");
  *at = pool->free[group * pool->most + --pool->top[group]];
  return *at;
}

int loom_pool_held(const loom_buffer_pool *pool, int group, int key) {
  const int at = *entry(pool, group, key);
  LOOM_CHECK(at >= 0, "an action uses a buffer its events do not hold");
  return at;
}

void loom_pool_return(loom_buffer_pool *pool, int group, int key) {
  int *at = entry(pool, group, key);
  LOOM_CHECK(*at >= 0, "a buffer given back that its events do not hold");
  pool->free[group * pool->most + pool->top[group]++] = *at;
  *at = -1;
}
