/* Preflight measurements and their report. Every rank measures at once, as
 * under training's load; each number is the best of several repeats, so a
 * moment of noise on a shared machine does not name a healthy rank, while a
 * device slow on every repeat is named. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "core/check.h"
#include "core/fault.h"
#include "core/nvml.h"
#include "core/tensor.h"
#include "core/timer.h"
#include "comm/measure.h"
#include "pipeline/preflight.h"

/* What each rank measures, gathered from all; -1 where a rank has nothing to say. */
enum { V_GEMM, V_MEM, V_P2P, V_TP, V_DP, V_GPU, V_SM, V_MAX_SM, V_TEMP, V_ECC, V_THROTTLE, V_COUNT };
#define HOST_LEN 64

loom_preflight_options loom_preflight_defaults(void) {
  return (loom_preflight_options){.factor = 1.5, .seconds = 0.3, .gemm_n = 1024, .mem_bytes = (size_t)192 << 20,
                                  .comm_bytes = (size_t)16 << 20, .gpu = -1};
}

static void nap_ms(double ms) {
  const double s = ms / 1000.0;
  const struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&t, NULL);
}

typedef struct {
  const loom_ops *ops;
  float *a, *b, *c;
  int n;
} gemm_ctx;

/* One n^3 GEMM through the backend, waited for (sumsq reads its result);
 * the slow fault adds its sleep, as a throttled device would be slower. */
static void gemm_once(void *p) {
  gemm_ctx *g = p;
  g->ops->matmul_forward(g->ops, g->c, g->a, g->b, NULL, g->n, g->n, g->n);
  (void)g->ops->sumsq(g->ops, g->c, 1);
  double ms;
  if (loom_fault_fires(LOOM_FAULT_SLOW, 0, &ms)) nap_ms(ms);
}

/* On zeroed operands: GEMM speed does not depend on the values, and the
 * backend's memory is its own to fill. */
static double gemm_gflops(const loom_ops *ops, int n, double seconds) {
  const size_t nn = (size_t)n * (size_t)n;
  const loom_allocator *mem = ops->mem;
  gemm_ctx g = {ops, loom_xzalloc(mem, nn * sizeof(float), "preflight GEMM"),
                loom_xzalloc(mem, nn * sizeof(float), "preflight GEMM"), loom_xzalloc(mem, nn * sizeof(float), "preflight GEMM"),
                n};
  const double t = loom_measure_best_time(gemm_once, &g, seconds);
  mem->release(mem, g.a), mem->release(mem, g.b), mem->release(mem, g.c);
  return 2.0 * (double)n * (double)n * (double)n / t / 1e9;
}

/* NCCL-tests' bus bandwidth of the group's all-reduce: bytes x 2(n-1)/n per
 * second, the rate each rank's link carries; -1 for a group of one. */
static double allreduce_busbw(loom_comm *group, const loom_allocator *mem, size_t bytes, double seconds) {
  const double t = loom_measure_collective_seconds(group, mem, LOOM_COLL_ALLREDUCE, bytes, seconds, NULL, NULL);
  if (t < 0) return -1.0;
  const int n = loom_comm_size(group);
  return (double)bytes * loom_collective_factor(LOOM_COLL_ALLREDUCE, n) / t / 1e9;
}

/* The p2p bandwidth of each link of a chain of ranks in `group` (a pipeline,
 * or the world as a ring when there is one stage): both ends exchange
 * `bytes` at once; disjoint links in each of up to three phases. Returns
 * this rank's link to the next rank's bandwidth, -1 if it has none. */
static double p2p_gbs(loom_comm *group, const loom_allocator *mem, bool ring, size_t bytes, double seconds) {
  const int n = group ? loom_comm_size(group) : 1, me = group ? loom_comm_rank(group) : 0;
  if (n < 2) return -1.0;
  const int links = ring && n > 2 ? n : n - 1;
  const size_t count = bytes / sizeof(float);
  float *out = loom_xzalloc(mem, bytes, "preflight p2p"), *in = loom_xzalloc(mem, bytes, "preflight p2p");
  double mine = -1.0;
  for (int phase = 0; phase < 3; phase++) {
    /* Link i joins positions i and i + 1 (mod n): phase 0 the even ones, 1 the odd, 2 a ring's odd last. */
    for (int i = 0; i < links; i++) {
      const int ph = (i == n - 1 && n % 2) ? 2 : i % 2;
      if (ph != phase || (me != i && me != (i + 1) % n)) continue;
      const int peer = me == i ? (i + 1) % n : i;
      double best = INFINITY;
      const double start = loom_now_s();
      for (int rep = 0;; rep++) {
        const double t0 = loom_now_s();
        loom_request *r = loom_comm_irecv(group, in, count, peer, 9000 + phase);
        loom_request *s = loom_comm_isend(group, out, count, peer, 9000 + phase);
        loom_comm_wait(group, s);
        loom_comm_wait(group, r);
        const double dt = loom_now_s() - t0;
        if (dt < best) best = dt;
        /* Both ends must run the same repeats: the link's first rank decides, by its clock alone. */
        float more = rep < 2 || loom_now_s() - start < seconds / 2 ? 1.0f : 0.0f;
        if (me == i) loom_comm_send(group, &more, 1, peer, 9100 + phase);
        else loom_comm_recv(group, &more, 1, peer, 9100 + phase);
        if (more == 0.0f) break;
      }
      if (me == i) mine = (double)bytes / best / 1e9;
    }
    loom_comm_barrier(group);
  }
  mem->release(mem, out);
  mem->release(mem, in);
  return mine;
}

typedef struct {
  char *out;
  size_t cap, used;
} text;

static void say(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(text *t, const char *fmt, ...) {
  if (!t->out || t->used + 1 >= t->cap) return;
  va_list ap;
  va_start(ap, fmt);
  const int n = vsnprintf(t->out + t->used, t->cap - t->used, fmt, ap);
  va_end(ap);
  t->used += n > 0 ? (size_t)n : 0;
  if (t->used >= t->cap) t->used = t->cap - 1;
}

static int by_value(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median of column v over the other ranks that measured it (> 0), or
 * 0: leaving the rank out keeps one slow rank of two from hiding in the
 * median it is held to. */
static double median_of_others(const double *all, int world, int v, int skip) {
  double *xs = malloc((size_t)world * sizeof *xs);
  int k = 0;
  for (int r = 0; r < world; r++)
    if (r != skip && all[r * V_COUNT + v] > 0) xs[k++] = all[r * V_COUNT + v];
  qsort(xs, (size_t)k, sizeof *xs, by_value);
  const double m = k == 0 ? 0.0 : k % 2 ? xs[k / 2] : 0.5 * (xs[k / 2 - 1] + xs[k / 2]);
  free(xs);
  return m;
}

static void fmt_value(char *buf, size_t n, double v) {
  if (v < 0) snprintf(buf, n, "-");
  else snprintf(buf, n, "%.1f", v);
}

int loom_preflight_run(const loom_parallel *ps, const loom_ops *ops, const loom_preflight_options *o, char **report) {
  double mine[V_COUNT];
  for (int v = 0; v < V_COUNT; v++) mine[v] = -1.0;
  /* Alone first (GEMM and memory under every rank's load at once), then the groups in turn. */
  loom_comm_barrier(ps->world_group);
  mine[V_GEMM] = gemm_gflops(ops, o->gemm_n, o->seconds);
  loom_comm_barrier(ps->world_group);
  mine[V_MEM] = loom_measure_memory_gbs(o->mem_bytes, o->seconds);
  loom_comm_barrier(ps->world_group);
  mine[V_TP] = allreduce_busbw(ps->tp > 1 ? ps->tp_group : NULL, ops->mem, o->comm_bytes, o->seconds);
  loom_comm_barrier(ps->world_group);
  mine[V_DP] = allreduce_busbw(ps->dp > 1 ? ps->dp_group : NULL, ops->mem, o->comm_bytes, o->seconds);
  loom_comm_barrier(ps->world_group);
  mine[V_P2P] = ps->pp > 1 ? p2p_gbs(ps->pp_group, ops->mem, false, o->comm_bytes, o->seconds)
                           : p2p_gbs(ps->world_group, ops->mem, true, o->comm_bytes, o->seconds);
  char why[160] = "";
  loom_gpu_health gpu;
  if (o->gpu >= 0 && loom_nvml_read(o->gpu, &gpu, why, sizeof why)) {
    char bad[128];
    mine[V_GPU] = loom_nvml_bad_throttle(gpu.throttle, bad, sizeof bad)[0] == '\0' && gpu.ecc_uncorrected == 0;
    mine[V_SM] = gpu.sm_mhz, mine[V_MAX_SM] = gpu.max_sm_mhz, mine[V_TEMP] = gpu.temp_c;
    mine[V_ECC] = (double)gpu.ecc_uncorrected, mine[V_THROTTLE] = (double)gpu.throttle;
  }
  const int world = ps->world;
  double *all = malloc((size_t)world * V_COUNT * sizeof *all);
  char *hosts = malloc((size_t)world * HOST_LEN), host[HOST_LEN] = "";
  gethostname(host, sizeof host - 1);
  loom_comm_allgather_typed(ps->world_group, mine, all, V_COUNT, LOOM_DTYPE_F64);
  loom_comm_allgather_typed(ps->world_group, host, hosts, HOST_LEN, LOOM_DTYPE_BYTE);

  const size_t cap = 4096 + (size_t)world * 384;
  text t = {ps->rank == 0 ? loom_xmalloc(cap, "preflight report") : NULL, cap, 0};
  if (t.out) t.out[0] = '\0';
  *report = t.out;
  say(&t, "preflight: %d ranks (tp %d x pp %d x dp %d) | GEMM %d^3 fp32 through %s | memory triad %.0f MiB | "
          "all-reduce and p2p %.0f MiB\n",
      world, ps->tp, ps->pp, ps->dp, o->gemm_n, ops->name, (double)o->mem_bytes / 1048576.0,
      (double)o->comm_bytes / 1048576.0);
  say(&t, "%5s  %-16s %12s %12s %14s %14s %14s%s\n", "rank", "host", "GEMM GFLOP/s", "memory GB/s", "p2p next GB/s",
      "tp bus GB/s", "dp bus GB/s", o->gpu >= 0 ? "  GPU (SM MHz, C, throttle, ECC)" : "");
  for (int r = 0; r < world; r++) {
    const double *x = all + r * V_COUNT;
    char c[5][24];
    for (int k = 0; k < 5; k++) fmt_value(c[k], sizeof c[k], x[(int[]){V_GEMM, V_MEM, V_P2P, V_TP, V_DP}[k]]);
    say(&t, "%5d  %-16.16s %12s %12s %14s %14s %14s", r, hosts + (size_t)r * HOST_LEN, c[0], c[1], c[2], c[3], c[4]);
    if (x[V_GPU] >= 0)
      say(&t, "  %.0f/%.0f, %.0f, %#llx, %.0f", x[V_SM], x[V_MAX_SM], x[V_TEMP], (unsigned long long)x[V_THROTTLE], x[V_ECC]);
    say(&t, "\n");
  }
  if (o->gpu >= 0 && mine[V_GPU] < 0 && ps->rank == 0) say(&t, "preflight: GPU health not read: %s\n", why);
  /* Findings: each measure against its kind's median; GPUs by NVML's own verdict. */
  static const struct { int v; const char *what, *unit; } KINDS[] = {
      {V_GEMM, "GEMM", "GFLOP/s"}, {V_MEM, "memory bandwidth", "GB/s"}, {V_P2P, "p2p bandwidth to the next rank", "GB/s"},
      {V_TP, "tensor-parallel all-reduce", "GB/s"}, {V_DP, "data-parallel all-reduce", "GB/s"}};
  int found = 0;
  for (size_t k = 0; k < sizeof KINDS / sizeof KINDS[0]; k++) {
    const int v = KINDS[k].v;
    for (int r = 0; r < world; r++) {
      const double x = all[r * V_COUNT + v], med = median_of_others(all, world, v, r);
      if (x <= 0 || med <= 0 || x * o->factor >= med) continue;
      found++;
      say(&t, "preflight: rank %d (%s): %s %.2f %s is %.2fx the other ranks' median %.2f, slower by more than %.2gx\n", r,
          hosts + (size_t)r * HOST_LEN, KINDS[k].what, x, KINDS[k].unit, x / med, med, o->factor);
    }
  }
  for (int r = 0; r < world; r++) {
    const double *x = all + r * V_COUNT;
    if (x[V_GPU] != 0) continue;
    char bad[128];
    found++;
    say(&t, "preflight: rank %d (%s): GPU at %.0f of %.0f MHz, %.0f C%s%s, %.0f uncorrected ECC errors\n", r,
        hosts + (size_t)r * HOST_LEN, x[V_SM], x[V_MAX_SM], x[V_TEMP],
        loom_nvml_bad_throttle((uint64_t)x[V_THROTTLE], bad, sizeof bad)[0] ? ", held down by " : "", bad, x[V_ECC]);
  }
  if (!found) say(&t, "preflight: ok: no rank, group or link slower than the others' median by more than %.2gx\n", o->factor);
  free(all);
  free(hosts);
  return found;
}
