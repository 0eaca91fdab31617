/* Communication benchmark in the nccl-tests convention, over loom's
 * communicator interface (MPI backend): for each operation and message size,
 * the time per call, algorithm bandwidth (bytes / time) and bus bandwidth
 * (algbw times nccl-tests' factor: all-reduce 2(n-1)/n, all-gather and
 * reduce-scatter (n-1)/n, send/recv 1), so the numbers read like the ones
 * every GPU-cluster operator knows. Inputs are small integers, so every
 * result is exact and checked: #wrong counts elements that differ.
 *
 *   mpirun -np 2 build/bench/loom_comm_bench [--max-bytes N] [--iters N]
 *       [--plan PLAN --bucket-mb MiB] [--backend mpi|nccl]
 *
 * --backend nccl (CUDA builds with NCCL, one rank per GPU) runs the same rows
 * on device buffers through the NCCL backend; each timed loop ends with a
 * stream synchronisation, and the checks copy results back to the host.
 *
 * With a plan, the all-reduce is also timed at the sizes that plan's
 * data-parallel gradient reduction sends: each stage's fp32 grads per rank
 * (its parameters / tp) cut into buckets of --bucket-mb (the last one short);
 * and ZeRO-3's pattern at that plan's buckets: each layer's weights
 * all-gathered before its forward and backward and its grads
 * reduce-scattered after, and the edges' (wte, wpe, final norm) likewise
 * (fp32; bf16 runs gather half the bytes).
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/ops.h"
#include "comm/mpi/comm_mpi.h"
#include "core/timer.h"
#include "layers/gpt.h"
#include "plan/memory.h"
#ifdef LOOM_HAVE_NCCL
#include "backend/cuda/cuda_backend.h"
#include "comm/nccl/comm_nccl.h"
#endif

/* The group under test, and where its buffers live. */
typedef struct {
  loom_comm *world; /* MPI: barriers and the result reductions */
  loom_comm *c;     /* the backend under test */
  bool device;      /* send/recv are device buffers; host_send/host_recv stage them */
  const loom_ops *cuda; /* the CUDA context, when device */
  float *host_send, *host_recv;
} bench;

static void settle(const bench *b) {
#ifdef LOOM_HAVE_NCCL
  if (b->device) loom_cuda_sync(b->cuda);
#else
  (void)b;
#endif
}

static void stage(const bench *b, void *dst, const void *src, size_t bytes, bool to_device) {
#ifdef LOOM_HAVE_NCCL
  if (b->device) {
    if (to_device) loom_cuda_to_device(b->cuda, dst, src, bytes);
    else loom_cuda_to_host(b->cuda, dst, src, bytes);
    return;
  }
#endif
  (void)b, (void)dst, (void)src, (void)bytes, (void)to_device;
}

typedef enum { OP_ALLREDUCE, OP_ALLGATHER, OP_REDUCE_SCATTER, OP_SENDRECV } op_kind;
static const char *const OP_NAMES[] = {"all_reduce", "all_gather", "reduce_scatter", "sendrecv"};

/* count: floats per rank's contribution (the nccl-tests "count"). */
static void run_op(loom_comm *c, op_kind op, float *send, float *recv, size_t count) {
  const int n = c->size, peer_to = (c->rank + 1) % n, peer_from = (c->rank + n - 1) % n;
  switch (op) {
  case OP_ALLREDUCE: loom_comm_allreduce(c, recv, count, LOOM_REDUCE_SUM); break;
  case OP_ALLGATHER: loom_comm_allgather(c, send, recv, count / n); break;
  case OP_REDUCE_SCATTER: loom_comm_reduce_scatter(c, send, recv, count / n); break;
  case OP_SENDRECV: {
    loom_request *r = loom_comm_irecv(c, recv, count, peer_from, 7);
    loom_comm_wait(c, loom_comm_isend(c, send, count, peer_to, 7));
    loom_comm_wait(c, r);
    break;
  }
  }
}

/* Fills inputs with small integers and returns how many outputs are wrong. */
static size_t check_op(const bench *b, op_kind op, float *send, float *recv, size_t count) {
  loom_comm *c = b->c;
  const int n = c->size;
  float *hs = b->device ? b->host_send : send, *hr = b->device ? b->host_recv : recv;
  for (size_t i = 0; i < count; i++) hs[i] = hr[i] = (float)((c->rank + 1) * (int)(i % 7 + 1));
  stage(b, send, hs, count * sizeof(float), true);
  stage(b, recv, hr, count * sizeof(float), true);
  run_op(c, op, send, recv, count);
  settle(b);
  stage(b, hr, recv, count * sizeof(float), false);
  size_t wrong = 0;
  const size_t chunk = count / n;
  for (size_t i = 0; i < (op == OP_REDUCE_SCATTER ? chunk : count); i++) {
    float want;
    const int k = (int)(i % 7 + 1);
    if (op == OP_ALLREDUCE) want = (float)(k * n * (n + 1) / 2);
    else if (op == OP_ALLGATHER) want = (float)((int)(i / chunk) + 1) * (float)(int)((i % chunk) % 7 + 1);
    else if (op == OP_REDUCE_SCATTER) want = (float)(((c->rank * chunk + i) % 7 + 1) * n * (n + 1) / 2);
    else want = (float)(((c->rank + n - 1) % n + 1) * k);
    wrong += hr[i] != want;
  }
  return wrong;
}

/* Appends size to sizes[n] unless it is 0 or there already (or cap is reached); returns the new count. */
static int add_distinct(size_t *sizes, int n, int cap, size_t size) {
  int seen = size == 0;
  for (int i = 0; i < n && !seen; i++) seen = sizes[i] == size;
  if (!seen && n < cap) sizes[n++] = size;
  return n;
}

/* The bucket sizes (floats) a plan's DP reduction sends: per stage, full
 * buckets and the remainder. Returns how many distinct sizes, at most cap. */
static int plan_sizes(const loom_plan *plan, double bucket_mb, size_t *sizes, int cap) {
  const size_t bucket = (size_t)(bucket_mb * 1048576.0 / sizeof(float));
  int n = 0;
  for (size_t k = 0; k < plan->estimates->n_stages; k++) {
    const size_t grads = (size_t)(plan->estimates->stages[k]->parameters / plan->parallel->tp);
    n = add_distinct(sizes, n, cap, grads < bucket ? grads : bucket);
    n = add_distinct(sizes, n, cap, bucket ? grads % bucket : grads);
  }
  return n;
}

/* ZeRO-3's bucket sizes (floats of one tp rank, padded over the replicas as ZeRO's cut pads them) in a plan: each
 * stage's largest layer and its edges. Returns how many. */
static int zero3_sizes(const loom_plan *plan, size_t *sizes, int cap) {
  int n = 0;
  for (size_t k = 0; k < plan->n_stages; k++) {
    const loom_stage_range range = loom_plan_stage_range(plan, (int)k);
    const loom_zero_cut z = loom_plan_zero_cut(plan, &range);
    n = add_distinct(sizes, n, cap, z.layer_max);
    n = add_distinct(sizes, n, cap, z.edges);
  }
  return n;
}

static double bus_factor(op_kind op, int n) {
  if (op == OP_ALLREDUCE) return 2.0 * (n - 1) / n;
  if (op == OP_SENDRECV) return 1.0;
  return (double)(n - 1) / n;
}

/* Checks, times and prints one row; returns 1 if any result was wrong. */
static int bench_row(const bench *b, op_kind op, const char *name, float *send, float *recv, size_t count, int iters) {
  loom_comm *world = b->world;
  const size_t wrong = check_op(b, op, send, recv, count);
  loom_comm_barrier(world);
  const double t0 = loom_now_s();
  for (int it = 0; it < iters; it++) run_op(b->c, op, send, recv, count);
  settle(b);
  float dt = (float)((loom_now_s() - t0) / iters);
  loom_comm_allreduce(world, &dt, 1, LOOM_REDUCE_MAX);
  float bad = (float)wrong;
  loom_comm_allreduce(world, &bad, 1, LOOM_REDUCE_SUM);
  const double algbw = (double)count * sizeof(float) / dt * 1e-9;
  if (world->rank == 0)
    printf("  %-14s %12zu %12zu %10.1f %9.3f %9.3f %7.0f\n", name, count * sizeof(float), count, dt * 1e6, algbw,
           algbw * bus_factor(op, world->size), bad);
  return bad > 0;
}

int main(int argc, char **argv) {
  loom_comm *world = loom_comm_mpi_world(&argc, &argv);
  size_t max_bytes = 64u << 20;
  int iters = 20;
  const char *plan = NULL, *backend = "mpi";
  double bucket_mb = 4.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--max-bytes") == 0) max_bytes = strtoull(argv[i + 1], NULL, 10);
    else if (strcmp(argv[i], "--iters") == 0) iters = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--plan") == 0) plan = argv[i + 1];
    else if (strcmp(argv[i], "--bucket-mb") == 0) bucket_mb = atof(argv[i + 1]);
    else if (strcmp(argv[i], "--backend") == 0) backend = argv[i + 1];
  }
  size_t plan_floats[64], zero3_floats[64], message_floats = 0; /* the plan's pipeline message (loom_gpt_boundary_floats) */
  int nplan = 0, nzero3 = 0;
  if (plan) {
    loom_plan *p;
    loom_error err;
    if (loom_plan_read(plan, &p, &err) != LOOM_OK) {
      fprintf(stderr, "%s\n", err.msg);
      loom_mpi_abort(2);
    }
    loom_plan_estimate(p);
    nplan = plan_sizes(p, bucket_mb, plan_floats, 64);
    nzero3 = zero3_sizes(p, zero3_floats, 64);
    loom_gpt_config cfg;
    loom_plan_model_config(p, &cfg);
    message_floats = loom_gpt_boundary_floats(&cfg, loom_plan_train_seq(p), p->batch->micro_batch, p->parallel->tp,
                                              p->parallel->sequence_parallel);
    loom_plan_free(p);
  }
  for (int i = 0; i < nplan; i++)
    if (plan_floats[i] * sizeof(float) > max_bytes) max_bytes = plan_floats[i] * sizeof(float);
  if (message_floats * sizeof(float) > max_bytes) max_bytes = message_floats * sizeof(float);
  for (int i = 0; i < nzero3; i++) /* the gathered bucket, padded to the ranks */
    if ((zero3_floats[i] + (size_t)world->size) * sizeof(float) > max_bytes)
      max_bytes = (zero3_floats[i] + (size_t)world->size) * sizeof(float);
  const int n = world->size;
  bench b = {world, world, false, NULL, NULL, NULL};
  if (strcmp(backend, "nccl") == 0) {
#ifdef LOOM_HAVE_NCCL
    if (!loom_cuda_available()) {
      if (world->rank == 0) printf("SKIP: --backend nccl needs a CUDA device\n");
      loom_mpi_finalize();
      return 77;
    }
    loom_cuda_select_device(world->rank);
    b.cuda = loom_cuda_open(false);
    b.c = loom_comm_nccl_create(world, loom_cuda_stream(b.cuda));
    if (!b.c) loom_mpi_abort(1);
    b.device = true;
    b.host_send = malloc(max_bytes);
    b.host_recv = malloc(max_bytes);
#else
    if (world->rank == 0) fprintf(stderr, "loom_comm_bench: --backend nccl: this build has no NCCL\n");
    loom_mpi_abort(2);
#endif
  } else if (strcmp(backend, "mpi") != 0) {
    if (world->rank == 0) fprintf(stderr, "loom_comm_bench: --backend %s: expected mpi or nccl\n", backend);
    loom_mpi_abort(2);
  }
#ifdef LOOM_HAVE_NCCL
  float *send = b.device ? loom_cuda_malloc(max_bytes) : malloc(max_bytes);
  float *recv = b.device ? loom_cuda_malloc(max_bytes) : malloc(max_bytes);
#else
  float *send = malloc(max_bytes), *recv = malloc(max_bytes);
#endif
  int failed = 0;
  if (world->rank == 0)
    printf("# loom comm bench: %d ranks, %s backend, float32, %d iterations\n"
           "# %-14s %12s %12s %10s %9s %9s %7s\n", n, b.device ? "NCCL" : "MPI", iters, "op", "size(B)", "count", "time(us)", "algbw", "busbw", "#wrong");
  for (int op = 0; op < 4; op++)
    for (size_t bytes = 4 * (size_t)n * 2; bytes <= max_bytes; bytes *= 4)
      failed |= bench_row(&b, (op_kind)op, OP_NAMES[op], send, recv, bytes / sizeof(float) / n * n, iters);
  /* The plan's data-parallel buckets, all-reduced as the trainer sends them. */
  for (int i = 0; i < nplan; i++) {
    const size_t rounded = plan_floats[i] / (size_t)n * (size_t)n; /* whole floats per rank for the exact check */
    failed |= bench_row(&b, OP_ALLREDUCE, "dp_bucket", send, recv, rounded > 0 ? rounded : (size_t)n, iters);
  }
  /* The plan's pipeline message, an activation or its grad between stages, as the executor sends it. */
  if (message_floats) {
    const size_t rounded = message_floats / (size_t)n * (size_t)n; /* whole floats per rank for the exact check */
    failed |= bench_row(&b, OP_SENDRECV, "pp_message", send, recv, rounded > 0 ? rounded : (size_t)n, iters);
  }
  /* ZeRO-3's gathers and reduce-scatters of the plan's buckets, each cut into one piece per rank. */
  for (int i = 0; i < nzero3; i++) {
    const size_t padded = (zero3_floats[i] + (size_t)n - 1) / (size_t)n * (size_t)n;
    failed |= bench_row(&b, OP_ALLGATHER, "zero3_gather", send, recv, padded, iters);
    failed |= bench_row(&b, OP_REDUCE_SCATTER, "zero3_scatter", send, recv, padded, iters);
  }
  if (world->rank == 0) printf("# algbw, busbw in GB/s; busbw factors as nccl-tests%s%s\n",
                               nplan ? "; dp_bucket: the plan's data-parallel gradient buckets; pp_message: its pipeline "
                                       "message" : "",
                               nzero3 ? "; zero3_*: ZeRO-3's per-layer and edge buckets of the plan, over these ranks" : "");
#ifdef LOOM_HAVE_NCCL
  if (b.device) {
    loom_cuda_free(send);
    loom_cuda_free(recv);
    free(b.host_send);
    free(b.host_recv);
    loom_comm_free(b.c);
    loom_cuda_close(b.cuda);
    send = recv = NULL;
  }
#endif
  free(send);
  free(recv);
  loom_comm_free(world);
  loom_mpi_finalize();
  return failed;
}
