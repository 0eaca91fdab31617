/* Dispatch through a group's table, with the size-1 shortcuts every backend
 * would otherwise repeat. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "comm/comm.h"
#include "comm/flight_recorder.h"
#include "core/check.h"

static int single(const loom_comm *c) { return !c || c->size == 1; }

void loom_comm_use_memory(loom_comm *c, const loom_allocator *mem) {
  if (c) c->mem = mem;
}

/* A group of one moves data itself, in whichever memory it lives. */
static void local_copy(const loom_comm *c, void *dst, const void *src, size_t bytes) {
  if (dst == src) return;
  if (c && c->mem && c->mem->owns(c->mem, dst)) c->mem->copy(c->mem, dst, src, bytes);
  else memmove(dst, src, bytes);
}

/* The ring bytes of a collective: an all-reduce of n values (`reduce`), or an all-gather or reduce-scatter of n per rank. */
static void count(loom_comm *c, size_t n, loom_dtype type, bool reduce) {
  const double d = c->size, bytes = (double)n * (double)loom_dtype_size(type);
  c->ring_bytes += reduce ? 2.0 * (d - 1.0) / d * bytes : (d - 1.0) * bytes;
}

/* A non-blocking operation's request, noted with its flight recorder slot until it completes. */
static loom_request *pending(loom_request *r, int64_t slot) {
  loom_flight_pending(r, slot);
  return r;
}

int loom_comm_rank(const loom_comm *c) { return c ? c->rank : 0; }
int loom_comm_size(const loom_comm *c) { return c ? c->size : 1; }

void loom_comm_allreduce_typed(loom_comm *c, void *buf, size_t n, loom_dtype type, loom_reduce_op op) {
  LOOM_CHECK(type != LOOM_DTYPE_BYTE && (type != LOOM_DTYPE_BF16 || op == LOOM_REDUCE_SUM),
             "all-reduce of bytes, or a bf16 max, is not defined");
  if (single(c)) return;
  const int64_t slot = loom_flight_begin(c, LOOM_FLIGHT_ALLREDUCE, n * loom_dtype_size(type), -1);
  if (slot == LOOM_FLIGHT_SKIP) return;
  count(c, n, type, true);
  c->ops->allreduce(c, buf, n, type, op);
  loom_flight_end(slot);
}

void loom_comm_allreduce(loom_comm *c, float *buf, size_t n, loom_reduce_op op) {
  loom_comm_allreduce_typed(c, buf, n, LOOM_DTYPE_F32, op);
}

loom_request *loom_comm_iallreduce_typed(loom_comm *c, void *buf, size_t n, loom_dtype type) {
  LOOM_CHECK(type == LOOM_DTYPE_F32 || type == LOOM_DTYPE_BF16, "non-blocking all-reduce sums f32 or bf16");
  if (single(c)) return NULL;
  const int64_t slot = loom_flight_begin(c, LOOM_FLIGHT_ALLREDUCE, n * loom_dtype_size(type), -1);
  if (slot == LOOM_FLIGHT_SKIP) return NULL;
  count(c, n, type, true);
  return pending(c->ops->iallreduce(c, buf, n, type), slot);
}

loom_request *loom_comm_iallreduce(loom_comm *c, float *buf, size_t n) {
  return loom_comm_iallreduce_typed(c, buf, n, LOOM_DTYPE_F32);
}

void loom_comm_allgather_typed(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype type) {
  if (single(c)) {
    local_copy(c, recv, send, n * loom_dtype_size(type));
    return;
  }
  const int64_t slot = loom_flight_begin(c, LOOM_FLIGHT_ALLGATHER, n * loom_dtype_size(type), -1);
  if (slot == LOOM_FLIGHT_SKIP) return;
  count(c, n, type, false);
  c->ops->allgather(c, send, recv, n, type);
  loom_flight_end(slot);
}

void loom_comm_allgather(loom_comm *c, const float *send, float *recv, size_t n) {
  loom_comm_allgather_typed(c, send, recv, n, LOOM_DTYPE_F32);
}

void loom_comm_reduce_scatter_typed(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype type) {
  LOOM_CHECK(type == LOOM_DTYPE_F32 || type == LOOM_DTYPE_BF16, "reduce-scatter sums f32 or bf16");
  if (single(c)) {
    local_copy(c, recv, send, n * loom_dtype_size(type));
    return;
  }
  const int64_t slot = loom_flight_begin(c, LOOM_FLIGHT_REDUCE_SCATTER, n * loom_dtype_size(type), -1);
  if (slot == LOOM_FLIGHT_SKIP) return;
  count(c, n, type, false);
  c->ops->reduce_scatter(c, send, recv, n, type);
  loom_flight_end(slot);
}

void loom_comm_reduce_scatter(loom_comm *c, const float *send, float *recv, size_t n) {
  loom_comm_reduce_scatter_typed(c, send, recv, n, LOOM_DTYPE_F32);
}

loom_request *loom_comm_iallgather_typed(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype type) {
  if (!single(c)) {
    const int64_t slot = loom_flight_begin(c, LOOM_FLIGHT_ALLGATHER, n * loom_dtype_size(type), -1);
    if (slot == LOOM_FLIGHT_SKIP) return NULL;
    count(c, n, type, false);
    return pending(c->ops->iallgather(c, send, recv, n, type), slot);
  }
  local_copy(c, recv, send, n * loom_dtype_size(type));
  return NULL;
}

loom_request *loom_comm_ireduce_scatter_typed(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype type) {
  LOOM_CHECK(type == LOOM_DTYPE_F32 || type == LOOM_DTYPE_BF16, "reduce-scatter sums f32 or bf16");
  if (!single(c)) {
    const int64_t slot = loom_flight_begin(c, LOOM_FLIGHT_REDUCE_SCATTER, n * loom_dtype_size(type), -1);
    if (slot == LOOM_FLIGHT_SKIP) return NULL;
    count(c, n, type, false);
    return pending(c->ops->ireduce_scatter(c, send, recv, n, type), slot);
  }
  local_copy(c, recv, send, n * loom_dtype_size(type));
  return NULL;
}

loom_request *loom_comm_ireduce_scatter(loom_comm *c, const float *send, float *recv, size_t n) {
  return loom_comm_ireduce_scatter_typed(c, send, recv, n, LOOM_DTYPE_F32);
}

void loom_comm_broadcast_typed(loom_comm *c, void *buf, size_t n, loom_dtype type, int root) {
  if (single(c)) return;
  const int64_t slot = loom_flight_begin(c, LOOM_FLIGHT_BROADCAST, n * loom_dtype_size(type), -1);
  if (slot == LOOM_FLIGHT_SKIP) return;
  c->ops->broadcast(c, buf, n, type, root);
  loom_flight_end(slot);
}

void loom_comm_alltoall_counts(loom_comm *c, const size_t *send_counts, size_t *recv_counts) {
  const int n = loom_comm_size(c), me = loom_comm_rank(c);
  int64_t *mine = loom_xmalloc((size_t)n * sizeof *mine, "all-to-all counts");
  int64_t *all = loom_xmalloc((size_t)n * (size_t)n * sizeof *all, "all-to-all counts");
  for (int r = 0; r < n; r++) mine[r] = (int64_t)send_counts[r];
  loom_comm_allgather_typed(c, mine, all, (size_t)n, LOOM_DTYPE_I64); /* row r: rank r's counts for every peer */
  for (int r = 0; r < n; r++) recv_counts[r] = (size_t)all[(size_t)r * (size_t)n + (size_t)me];
  free(mine);
  free(all);
}

void loom_comm_alltoallv_typed(loom_comm *c, const void *send, const size_t *send_counts, void *recv,
                               const size_t *recv_counts, loom_dtype type) {
  if (single(c)) {
    local_copy(c, recv, send, send_counts[0] * loom_dtype_size(type));
    return;
  }
  for (int r = 0; r < c->size; r++)
    if (r != c->rank) c->ring_bytes += (double)send_counts[r] * (double)loom_dtype_size(type);
  size_t total = 0;
  for (int r = 0; r < c->size; r++) total += send_counts[r];
  const int64_t slot = loom_flight_begin(c, LOOM_FLIGHT_ALLTOALLV, total * loom_dtype_size(type), -1);
  if (slot == LOOM_FLIGHT_SKIP) return;
  c->ops->alltoallv(c, send, send_counts, recv, recv_counts, type);
  loom_flight_end(slot);
}

void loom_comm_broadcast(loom_comm *c, float *buf, size_t n, int root) {
  loom_comm_broadcast_typed(c, buf, n, LOOM_DTYPE_F32, root);
}

void loom_comm_broadcast_bytes(loom_comm *c, void *buf, size_t bytes, int root) {
  loom_comm_broadcast_typed(c, buf, bytes, LOOM_DTYPE_BYTE, root);
}

void loom_comm_send(loom_comm *c, const float *buf, size_t n, int peer, int tag) {
  loom_comm_wait(c, loom_comm_isend(c, buf, n, peer, tag));
}

void loom_comm_recv(loom_comm *c, float *buf, size_t n, int peer, int tag) {
  loom_comm_wait(c, loom_comm_irecv(c, buf, n, peer, tag));
}

loom_request *loom_comm_isend(loom_comm *c, const float *buf, size_t n, int peer, int tag) {
  LOOM_CHECK(!single(c), "send needs a group of two or more ranks");
  c->sent_bytes += (double)n * sizeof(float);
  const int64_t slot = loom_flight_begin(c, LOOM_FLIGHT_SEND, n * sizeof(float), peer);
  return pending(c->ops->isend(c, buf, n, peer, tag), slot);
}

loom_request *loom_comm_irecv(loom_comm *c, float *buf, size_t n, int peer, int tag) {
  LOOM_CHECK(!single(c), "recv needs a group of two or more ranks");
  const int64_t slot = loom_flight_begin(c, LOOM_FLIGHT_RECV, n * sizeof(float), peer);
  return pending(c->ops->irecv(c, buf, n, peer, tag), slot);
}

void loom_comm_wait(loom_comm *c, loom_request *r) {
  if (!r) return;
  c->ops->wait(r);
  loom_flight_completed(r); /* (the request is freed: its address only finds its slot) */
}

int loom_comm_test(loom_comm *c, loom_request *r) {
  if (!r) return 1; /* nothing was started (a group of one, or a skipped collective) */
  const int done = c->ops->test(r);
  if (done) loom_flight_completed(r);
  return done;
}

void loom_comm_idle_barrier(loom_comm *c, int root) {
  if (single(c)) return;
  float token = 0.0f;
  if (c->rank == root) {
    for (int r = 0; r < c->size; r++)
      if (r != root) loom_comm_send(c, &token, 1, r, 0x1d1e);
    return;
  }
  loom_request *req = loom_comm_irecv(c, &token, 1, root, 0x1d1e);
  const struct timespec nap = {0, 1000000}; /* 1 ms */
  while (!loom_comm_test(c, req)) nanosleep(&nap, NULL);
}

void loom_comm_barrier(loom_comm *c) {
  if (single(c)) return;
  const int64_t slot = loom_flight_begin(c, LOOM_FLIGHT_BARRIER, 0, -1);
  if (slot == LOOM_FLIGHT_SKIP) return;
  c->ops->barrier(c);
  loom_flight_end(slot);
}

loom_comm *loom_comm_split(loom_comm *c, int color, int key, const char *name) {
  loom_comm *sub = c ? c->ops->split(c, color, key) : NULL;
  if (sub) {
    snprintf(sub->name, sizeof sub->name, "%s", name);
    sub->mem = c->mem;
    sub->world_rank = c->world_rank;
    int32_t lead = -c->world_rank; /* the lowest world rank, as a max (outside the flight recorder's count) */
    if (sub->size > 1) sub->ops->allreduce(sub, &lead, 1, LOOM_DTYPE_I32, LOOM_REDUCE_MAX);
    sub->leader = -lead;
  }
  return sub;
}

void loom_comm_flush(loom_comm *c) {
  if (c && c->ops->flush) c->ops->flush(c);
}

void loom_comm_free(loom_comm *c) {
  if (c) c->ops->free(c);
}
