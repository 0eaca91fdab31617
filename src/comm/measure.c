/* Measurement primitives. */
#include <math.h>
#include <stdlib.h>
#include "core/check.h"
#include "core/timer.h"
#include "comm/measure.h"

double loom_measure_best_time(void (*run)(void *), void *ctx, double seconds) {
  double best = INFINITY;
  const double start = loom_now_s();
  for (int rep = 0; rep < 3 || loom_now_s() - start < seconds; rep++) {
    const double t0 = loom_now_s();
    run(ctx);
    const double dt = loom_now_s() - t0;
    if (dt < best) best = dt;
  }
  return best;
}

typedef struct {
  float *a, *b, *c;
  size_t n;
} triad_ctx;

static void triad_once(void *p) {
  triad_ctx *t = p;
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < t->n; i++) t->a[i] = t->b[i] + 3.0f * t->c[i];
}

double loom_measure_memory_gbs(size_t bytes, double seconds) {
  triad_ctx t = {NULL, NULL, NULL, bytes / 3 / sizeof(float)};
  t.a = calloc(t.n, sizeof(float)), t.b = calloc(t.n, sizeof(float)), t.c = calloc(t.n, sizeof(float));
  double gbs = 0.0;
  if (t.a && t.b && t.c) {
    triad_once(&t); /* pages touched before timing */
    gbs = 3.0 * (double)t.n * sizeof(float) / loom_measure_best_time(triad_once, &t, seconds) / 1e9;
  }
  free(t.a), free(t.b), free(t.c);
  return gbs;
}

typedef struct {
  loom_comm *group;
  loom_collective kind;
  float *send, *recv;
  size_t count; /* floats of the whole buffer */
  void (*wait)(void *arg, const float *result);
  void *wait_arg;
} collective_ctx;

static void collective_once(collective_ctx *x) {
  loom_comm *c = x->group;
  const int n = loom_comm_size(c), me = loom_comm_rank(c);
  switch (x->kind) {
  case LOOM_COLL_ALLREDUCE: loom_comm_allreduce(c, x->recv, x->count, LOOM_REDUCE_SUM); break;
  case LOOM_COLL_ALLGATHER: loom_comm_allgather(c, x->send, x->recv, x->count / n); break;
  case LOOM_COLL_REDUCE_SCATTER: loom_comm_reduce_scatter(c, x->send, x->recv, x->count / n); break;
  default: {
    loom_request *r = loom_comm_irecv(c, x->recv, x->count, (me + n - 1) % n, 9200);
    loom_comm_wait(c, loom_comm_isend(c, x->send, x->count, (me + 1) % n, 9200));
    loom_comm_wait(c, r);
    break;
  }
  }
  if (x->wait) x->wait(x->wait_arg, x->recv);
}

double loom_measure_collective_seconds(loom_comm *group, const loom_allocator *mem, loom_collective kind, size_t bytes,
                                       double seconds, void (*wait)(void *arg, const float *result), void *wait_arg) {
  const int n = group ? loom_comm_size(group) : 1;
  if (n < 2) return -1.0;
  const size_t count = (bytes / sizeof(float) + n - 1) / n * n; /* whole shares for the gathers and scatters */
  collective_ctx x = {group, kind, loom_xzalloc(mem, count * sizeof(float), "measured collective"),
                      loom_xzalloc(mem, count * sizeof(float), "measured collective"), count, wait, wait_arg};
  loom_comm_barrier(group);
  /* Every member must run the same collectives: the count comes from the first one's time, agreed on. */
  const double t0 = loom_now_s();
  collective_once(&x);
  double reps = fmin(1000.0, fmax(3.0, ceil(seconds / fmax(loom_now_s() - t0, 1e-6))));
  loom_comm_allreduce_typed(group, &reps, 1, LOOM_DTYPE_F64, LOOM_REDUCE_MAX);
  double t = INFINITY;
  for (int k = 0; k < (int)reps; k++) {
    const double start = loom_now_s();
    collective_once(&x);
    t = fmin(t, loom_now_s() - start);
  }
  loom_comm_allreduce_typed(group, &t, 1, LOOM_DTYPE_F64, LOOM_REDUCE_MAX);
  mem->release(mem, x.send);
  mem->release(mem, x.recv);
  return t;
}
