/* Buffers a schedule's events hand out (schedule/schedule.h): each is
 * taken by one (group, key), a micro-batch on a chunk or one send, and given
 * back where the events say. A pool holds exactly the peak the verified
 * events reach, so taking one more is the executor leaving its schedule: a
 * check, not a wait. */
#ifndef LOOM_BUFFER_POOL_H
#define LOOM_BUFFER_POOL_H

typedef struct {
  int groups; /* chunks (slots, weight-grad states), or 1 (a rank's send buffers) */
  int keys;   /* keys each group's map has room for */
  int most;   /* the largest group's buffers */
  int *of;    /* [groups * keys] buffer held by (group, key), or -1 */
  int *cap;   /* [groups] buffers of each group */
  int *top;   /* [groups] free buffers left */
  int *free;  /* [groups * most] each group's stack of free buffers */
} loom_buffer_pool;

/* cap[groups] buffers per group, for keys 0 .. keys-1. */
void loom_pool_init(loom_buffer_pool *pool, int groups, const int *cap, int keys);
void loom_pool_free(loom_buffer_pool *pool);
/* Room for more keys (an evaluation may run more micro-batches than a step). */
void loom_pool_widen(loom_buffer_pool *pool, int keys);
/* Every buffer free, no key holding one. */
void loom_pool_reset(loom_buffer_pool *pool);
int loom_pool_take(loom_buffer_pool *pool, int group, int key);
/* The buffer (group, key) holds; a check that it holds one. */
int loom_pool_held(const loom_buffer_pool *pool, int group, int key);
void loom_pool_return(loom_buffer_pool *pool, int group, int key);

#endif
