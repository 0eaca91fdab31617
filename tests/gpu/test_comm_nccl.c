/* The NCCL communicator backend on device buffers, one rank per GPU (NCCL
 * refuses two ranks on one GPU). Every collective goes through the backend's
 * table directly, so a one-rank group still runs NCCL rather than the size-1
 * shortcut; values are small integers, so results are exact. Every output
 * buffer starts as NaN, so a transfer that did nothing fails. On one rank an
 * in-place sum or max equals its input whatever the collective does: those
 * checks need two ranks (mpirun -np 2, the emu tier's test_comm_nccl_2), and
 * a one-rank run says it skipped them and exits 77 (a skip in ctest), as it
 * does without a GPU. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include "backend/cuda/cuda_backend.h"
#include "comm/mpi/comm_mpi.h"
#include "comm/nccl/comm_nccl.h"

enum { N = 256 };
static int g_failures;
static const loom_ops *g_cuda; /* this rank's CUDA context */

/* Element i of rank r's input. */
static float value(int r, size_t i) { return (float)(r + 1) * (float)(i % 7 + 1); }

static float *upload(int rank) {
  float host[N], *dev = loom_cuda_malloc(N * sizeof(float));
  for (size_t i = 0; i < N; i++) host[i] = value(rank, i);
  loom_cuda_to_device(g_cuda, dev, host, sizeof host);
  return dev;
}

/* n floats of NaN on the device: an output no transfer has written yet. */
static float *nan_buffer(size_t n) {
  float *host = malloc(n * sizeof(float)), *dev = loom_cuda_malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) host[i] = NAN;
  loom_cuda_to_device(g_cuda, dev, host, n * sizeof(float));
  free(host);
  return dev;
}

static void expect(const char *what, const float *dev, const float *want, size_t n) {
  float *got = malloc(n * sizeof(float));
  loom_cuda_sync(g_cuda);
  loom_cuda_to_host(g_cuda, got, dev, n * sizeof(float));
  int wrong = 0;
  for (size_t i = 0; i < n; i++) wrong += got[i] != want[i];
  printf("  %-32s %s (%d wrong of %zu)\n", what, wrong ? "FAIL" : "OK  ", wrong, n);
  g_failures += wrong != 0;
  free(got);
}

int main(int argc, char **argv) {
  loom_comm *world = loom_comm_mpi_world(&argc, &argv);
  const int rank = world->rank, size = world->size;
  if (!loom_cuda_available()) {
    if (rank == 0) printf("SKIP: no CUDA device here\n");
    loom_comm_free(world);
    loom_mpi_finalize();
    return 77;
  }
  loom_cuda_select_device(rank);
  g_cuda = loom_cuda_open(false);
  loom_comm *c = loom_comm_nccl_create(world, loom_cuda_stream(g_cuda));
  if (!c) return 1;
  char name[256];
  loom_cuda_device_name(g_cuda, name, sizeof name);
  if (rank == 0) printf("NCCL backend on %d rank(s), %s\n", size, name);
  float sum[N], max[N], gathered[N * 8];
  for (size_t i = 0; i < N; i++) {
    sum[i] = 0.0f;
    for (int r = 0; r < size; r++) sum[i] += value(r, i);
    max[i] = value(size - 1, i);
  }
  for (int r = 0; r < size && r < 8; r++)
    for (size_t i = 0; i < N; i++) gathered[(size_t)r * N + i] = value(r, i);
  float *a = upload(rank), *b = upload(rank), *d = upload(rank), *e = upload(rank), *f = upload(rank);
  const bool reduces = size > 1; /* in place on one rank, a sum and a max are their input, done or not */
  if (reduces) {
    c->ops->allreduce(c, a, N, LOOM_DTYPE_F32, LOOM_REDUCE_SUM);
    expect("all-reduce sum", a, sum, N);
    c->ops->allreduce(c, b, N, LOOM_DTYPE_F32, LOOM_REDUCE_MAX);
    expect("all-reduce max", b, max, N);
    loom_request *r = c->ops->iallreduce(c, d, N, LOOM_DTYPE_F32); /* on the comm stream, then ordered before compute */
    c->ops->wait(r);
    expect("iallreduce + wait", d, sum, N);
  }
  if (size <= 8) {
    float *all = nan_buffer((size_t)N * size);
    c->ops->allgather(c, e, all, N, LOOM_DTYPE_F32);
    expect("all-gather", all, gathered, (size_t)N * size);
    loom_cuda_free(all);
  }
  if (N % size == 0) {
    const size_t block = N / (size_t)size;
    float *part = nan_buffer(block);
    c->ops->reduce_scatter(c, f, part, block, LOOM_DTYPE_F32);
    expect("reduce-scatter", part, sum + (size_t)rank * block, block);
    loom_cuda_free(part);
  }
  /* Host values (a loss, counts) travel through staged device copies. */
  double loss = rank + 0.5, want_loss = 0.0;
  for (int q = 0; q < size; q++) want_loss += q + 0.5;
  if (reduces) {
    c->ops->allreduce(c, &loss, 1, LOOM_DTYPE_F64, LOOM_REDUCE_SUM);
    printf("  %-32s %s\n", "all-reduce of a host double", loss == want_loss ? "OK  " : "FAIL");
    g_failures += loss != want_loss;
  }
  /* Both neighbours send before they receive, as 1F1B's stages do: queued
   * transfers go to NCCL as one group at the wait, so neither blocks. */
  float *out = upload(rank), *in = nan_buffer(N), from[N];
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  loom_request *s1 = c->ops->isend(c, out, N, next, 1);
  loom_request *r1 = c->ops->irecv(c, in, N, prev, 1);
  c->ops->wait(r1);
  c->ops->wait(s1);
  for (size_t i = 0; i < N; i++) from[i] = value(prev, i);
  expect("send then receive, ring", in, from, N);
  float token = (float)rank, got = NAN; /* a host buffer's transfer, as the idle barrier's */
  loom_request *s2 = c->ops->isend(c, &token, 1, next, 2), *r2 = c->ops->irecv(c, &got, 1, prev, 2);
  while (!c->ops->test(r2)) {
  }
  c->ops->wait(s2);
  printf("  %-32s %s\n", "host-buffer send and receive", got == (float)prev ? "OK  " : "FAIL");
  g_failures += got != (float)prev;
  loom_cuda_free(in);
  c->ops->barrier(c);
  loom_comm_free(c);
  loom_cuda_close(g_cuda);
  printf("rank %d: %s\n", rank, g_failures ? "FAIL" : "ok");
  const int failed = g_failures;
  loom_comm_free(world);
  loom_mpi_finalize();
  if (!failed && !reduces && rank == 0)
    printf("SKIP: all-reduce sum, max, iallreduce and the host double need 2 ranks (one GPU each); the rest passed\n");
  return failed ? 1 : reduces ? 0 : 77;
}
