/* Calibration: measure, fit, and write the profile. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "core/check.h"
#include "core/timer.h"
#include "core/strbuf.h"
#include "comm/measure.h"
#include "sim/calibrate.h"

/* The grid: every (N, C, OC) of these sizes, and the large GEMM that gives the peak. */
static const int GRID[] = {64, 256, 1024};
enum { GRID_N = sizeof GRID / sizeof GRID[0], SHAPES = GRID_N * GRID_N * GRID_N, PEAK_N = 2048 };

typedef struct {
  const loom_ops *ops;
  bool bf16;
  float *a, *b, *c, *da, *db;
  uint16_t *ah, *bh, *ch; /* bf16: the input, the weight and the output grad, as bits */
  int N, C, OC;
} gemm_ctx;

/* A linear layer's GEMMs as the runtime runs them: the forward and both
 * grads (the cost model's three passes), in bf16 from bits: the weight, the
 * input and the output grad, as a bf16 block keeps them. */
static void gemm_once(void *p) {
  gemm_ctx *g = p;
  if (g->bf16) {
    g->ops->matmul_forward_bf16(g->ops, g->c, loom_bf16_bits(g->ah), g->bh, NULL, g->N, g->C, g->OC);
    g->ops->matmul_backward_bf16(g->ops, g->da, g->db, NULL, loom_bf16_bits(g->ch), loom_bf16_bits(g->ah), g->bh, g->N,
                                 g->C, g->OC);
    return;
  }
  g->ops->matmul_forward(g->ops, g->c, g->a, g->b, NULL, g->N, g->C, g->OC);
  g->ops->matmul_backward(g->ops, g->da, g->db, NULL, g->c, g->a, g->b, g->N, g->C, g->OC);
}

/* FLOP/s of one linear's GEMMs through the backend (operands zero: speed does not depend on values). */
static double gemm_flops(const loom_ops *ops, bool bf16, int N, int C, int OC, double seconds) {
  const loom_allocator *mem = ops->mem;
  gemm_ctx g = {.ops = ops, .bf16 = bf16, .N = N, .C = C, .OC = OC};
  g.c = loom_xzalloc(mem, (size_t)N * OC * sizeof(float), "calibration GEMM");
  g.a = loom_xzalloc(mem, (size_t)N * C * sizeof(float), "calibration GEMM");
  g.da = loom_xzalloc(mem, (size_t)N * C * sizeof(float), "calibration GEMM");
  g.db = loom_xzalloc(mem, (size_t)OC * C * sizeof(float), "calibration GEMM");
  if (bf16) {
    g.ah = loom_xzalloc(mem, (size_t)N * C * sizeof(uint16_t), "calibration GEMM");
    g.bh = loom_xzalloc(mem, (size_t)OC * C * sizeof(uint16_t), "calibration GEMM");
    g.ch = loom_xzalloc(mem, (size_t)N * OC * sizeof(uint16_t), "calibration GEMM");
  } else {
    g.b = loom_xzalloc(mem, (size_t)OC * C * sizeof(float), "calibration GEMM");
  }
  gemm_once(&g); /* warm-up */
  const double t = loom_measure_best_time(gemm_once, &g, seconds);
  void *all[] = {g.a, g.b, g.c, g.da, g.db, g.ah, g.bh, g.ch};
  for (int i = 0; i < 8; i++)
    if (all[i]) mem->release(mem, all[i]);
  return 6.0 * N * (double)C * OC / t;
}

/* Attention and elementwise ops through the backend, timed and expressed in
 * the cost model's own units (cost.c): attention as the share of the fp32
 * peak its 4 B H T^2 D forward FLOPs (twice that backward) reach; the norm
 * and the activation as the share of the triad's bandwidth their bytes
 * (read and write, twice backward) reach. */
typedef struct {
  const loom_ops *ops;
  float *out, *lse, *qkv, *dqkv, *dout, *mean, *rstd, *w, *dw, *b, *db;
  loom_attn_shape shape;
  int N, C;
} op_ctx;

static void attention_once(void *p) {
  op_ctx *x = p;
  const loom_dropout none = {0};
  x->ops->attention_forward(x->ops, x->out, x->lse, x->qkv, &x->shape, &none);
  x->ops->attention_backward(x->ops, x->dqkv, x->dout, x->out, x->qkv, x->lse, &x->shape, &none);
}

static void elementwise_once(void *p) {
  op_ctx *x = p;
  const size_t n = (size_t)x->N * x->C;
  x->ops->layernorm_forward(x->ops, x->out, x->mean, x->rstd, x->qkv, x->w, x->b, x->N, x->C, 1e-5f);
  x->ops->layernorm_backward(x->ops, x->dqkv, x->dw, x->db, x->dout, x->qkv, x->w, x->mean, x->rstd, x->N, x->C);
  x->ops->gelu_forward(x->ops, x->out, x->qkv, n);
  x->ops->gelu_backward(x->ops, x->dqkv, x->dout, x->qkv, n);
}

static void measure_ops(const loom_ops *ops, double seconds, double peak_flops, double stream_gbs, double *attention_eff,
                        double *memory_eff) {
  const loom_allocator *mem = ops->mem;
  op_ctx x = {.ops = ops, .shape = {.T = 256, .B = 4, .heads = 4, .kv_heads = 4, .head_dim = 64, .total_heads = 4}, .N = 8192, .C = 1024};
  const size_t rows = (size_t)x.shape.T * x.shape.B, width = loom_attn_qkv_width(&x.shape);
  const size_t rows_lse = (size_t)x.shape.B * x.shape.heads * x.shape.T, n = (size_t)x.N * x.C;
  const size_t big = n > rows * width ? n : rows * width;
  float **all[] = {&x.out, &x.qkv, &x.dqkv, &x.dout};
  for (int i = 0; i < 4; i++) *all[i] = loom_xzalloc(mem, big * sizeof(float), "calibration op");
  x.lse = loom_xzalloc(mem, rows_lse * sizeof(float), "calibration op");
  float **small[] = {&x.mean, &x.rstd, &x.w, &x.dw, &x.b, &x.db};
  for (int i = 0; i < 6; i++) *small[i] = loom_xzalloc(mem, (size_t)x.N * sizeof(float), "calibration op");
  attention_once(&x);
  /* causal: the scores and values of the unmasked half (the FLOPs FlashAttention's benchmarks count) */
  const double flops = 3.0 * 2.0 * x.shape.B * x.shape.heads * (double)x.shape.T * x.shape.T * x.shape.head_dim;
  *attention_eff = fmin(flops / loom_measure_best_time(attention_once, &x, seconds) / peak_flops, 1.0);
  elementwise_once(&x);
  const double bytes = 3.0 * (2.0 * n + 2.0 * n) * sizeof(float); /* norm and activation, forward and twice backward */
  *memory_eff = fmin(bytes / loom_measure_best_time(elementwise_once, &x, seconds) / (stream_gbs * 1e9), 1.0);
  for (int i = 0; i < 4; i++) mem->release(mem, *all[i]);
  mem->release(mem, x.lse);
  for (int i = 0; i < 6; i++) mem->release(mem, *small[i]);
}

/* The best rank's figure: the ranks of one machine are alike, and a shared
 * machine only ever slows one down. */
static double best_of_ranks(loom_comm *world, double mine) {
  if (world) loom_comm_allreduce_typed(world, &mine, 1, LOOM_DTYPE_F64, LOOM_REDUCE_MAX);
  return mine;
}

static int by_value(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Fits max_efficiency x g(N) g(C) g(OC), g(x) = x / (x + half), to measured
 * efficiencies, robustly (a shared machine only ever slows a measurement
 * down, now and then a lot): for each half on a grid, max_efficiency is the
 * median of measured / g(N) g(C) g(OC), and the error the sum of absolute
 * log residuals; the half with the least error wins. */
static void fit_gemm(const double *eff, Loom__GemmEfficiency *g) {
  static const double HALVES[] = {0, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512};
  double best_err = INFINITY;
  for (size_t h = 0; h < sizeof HALVES / sizeof HALVES[0]; h++) {
    double ratio[SHAPES], sorted[SHAPES];
    for (int i = 0; i < SHAPES; i++) {
      const double d[3] = {GRID[i / (GRID_N * GRID_N)], GRID[i / GRID_N % GRID_N], GRID[i % GRID_N]};
      double shape = 1.0;
      for (int k = 0; k < 3; k++) shape *= d[k] / (d[k] + HALVES[h]);
      ratio[i] = sorted[i] = eff[i] / shape;
    }
    qsort(sorted, SHAPES, sizeof sorted[0], by_value);
    const double median = sorted[SHAPES / 2];
    double err = 0.0;
    for (int i = 0; i < SHAPES; i++) err += fabs(log(ratio[i] / median));
    if (err < best_err) best_err = err, g->half_dim = HALVES[h], g->max_efficiency = fmin(median, 1.0);
  }
  g->has_half_dim = g->has_max_efficiency = 1;
}

/* A link from one kind's times t(S) = a + b S over sizes: latency per step, bus bandwidth (GB/s). */
static void fit_link(const double *sizes, const double *times, int n, loom_collective kind, int ranks, double *latency_us,
                     double *busbw_gbs) {
  double ms = 0, mt = 0, sst = 0, sss = 0;
  for (int i = 0; i < n; i++) ms += sizes[i] / n, mt += times[i] / n;
  for (int i = 0; i < n; i++) sst += (sizes[i] - ms) * (times[i] - mt), sss += (sizes[i] - ms) * (sizes[i] - ms);
  const double b = sst / sss, a = fmax(mt - b * ms, 0.0);
  const double steps = kind == LOOM_COLL_ALLREDUCE ? 2.0 * (ranks - 1) : kind == LOOM_COLL_SENDRECV ? 1.0 : ranks - 1.0;
  *latency_us = a / steps * 1e6;
  *busbw_gbs = loom_collective_factor(kind, ranks) / b / 1e9;
}

static Loom__Link *new_link(double gbs, double latency_us, double efficiency) {
  Loom__Link *l = loom_xmalloc(sizeof *l, "profile link");
  loom__link__init(l);
  l->has_bandwidth_gbs = l->has_latency_us = l->has_efficiency = l->has_topology = 1;
  l->bandwidth_gbs = gbs, l->latency_us = latency_us, l->efficiency = efficiency;
  l->topology = LOOM__LINK_TOPOLOGY__TOPOLOGY_SWITCH;
  return l;
}

static Loom__Link *copy_link(const Loom__Link *from) {
  Loom__Link *l = new_link(from->bandwidth_gbs, from->latency_us, from->efficiency);
  l->topology = from->topology, l->has_rail_optimized = from->has_rail_optimized, l->rail_optimized = from->rail_optimized;
  return l;
}

/* The GEMMs' peaks and efficiency fits, fp32 and bf16: the peak from the large shape, then the grid's efficiencies
 * against it. */
static void calibrate_gemms(loom_comm *world, const loom_ops *ops, double seconds, Loom__DeviceProfile *d, loom_strbuf *t) {
  d->n_gemm = 2;
  d->gemm = loom_xcalloc(2, sizeof *d->gemm, "profile GEMMs");
  for (int k = 0; k < 2; k++) {
    const bool bf16 = k == 1;
    double peak = best_of_ranks(world, gemm_flops(ops, bf16, PEAK_N, PEAK_N, PEAK_N, seconds)), eff[SHAPES];
    loom_strbuf_printf(t, "# %s GEMMs (%s), GFLOP/s per rank (N x C x OC): %dx%dx%d %.1f", bf16 ? "bf16" : "fp32", bf16 ? "forward" : "a linear's forward and both grads", PEAK_N, PEAK_N, PEAK_N, peak / 1e9);
    double flops[SHAPES];
    for (int i = 0; i < SHAPES; i++) {
      const int N = GRID[i / (GRID_N * GRID_N)], C = GRID[i / GRID_N % GRID_N], OC = GRID[i % GRID_N];
      flops[i] = best_of_ranks(world, gemm_flops(ops, bf16, N, C, OC, seconds / 2));
      peak = fmax(peak, flops[i]);
      loom_strbuf_printf(t, "%s %dx%dx%d %.1f", i % 9 == 0 ? "\n#  " : ",", N, C, OC, flops[i] / 1e9);
    }
    for (int i = 0; i < SHAPES; i++) eff[i] = flops[i] / peak;
    loom_strbuf_printf(t, "\n");
    Loom__GemmEfficiency *g = d->gemm[k] = loom_xmalloc(sizeof *g, "profile GEMM");
    loom__gemm_efficiency__init(g);
    g->has_dtype = 1, g->dtype = bf16 ? LOOM__PRECISION__PRECISION_BF16 : LOOM__PRECISION__PRECISION_FP32;
    fit_gemm(eff, g);
    if (bf16) d->has_peak_tflops_bf16 = 1, d->peak_tflops_bf16 = peak / 1e12;
    else d->has_peak_tflops_fp32 = 1, d->peak_tflops_fp32 = peak / 1e12;
  }
}

/* Memory bandwidth, the memory-bound ops' and attention's efficiencies, memory per rank and an op's fixed cost. */
static void calibrate_memory(loom_comm *world, const loom_ops *ops, const loom_calibrate_options *o, int ranks,
                             loom_profile *p, loom_strbuf *t) {
  Loom__DeviceProfile *d = p->device;
  d->has_memory_bandwidth_gbs = d->has_memory_efficiency = 1;
  d->memory_bandwidth_gbs = best_of_ranks(world, loom_measure_memory_gbs(o->mem_bytes, o->seconds));
  double attention_eff, memory_eff;
  measure_ops(ops, o->seconds, d->peak_tflops_fp32 * 1e12, d->memory_bandwidth_gbs, &attention_eff, &memory_eff);
  d->has_attention_efficiency = 1;
  d->attention_efficiency = best_of_ranks(world, attention_eff);
  d->memory_efficiency = best_of_ranks(world, memory_eff);
  /* Memory per rank: the host's, shared among the launched ranks. */
  d->has_memory_bytes = 1;
  d->memory_bytes = (int64_t)sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE) / ranks;
  p->has_op_overhead_us = 1;
  /* An 8x8x8 linear is all overhead: its three GEMMs' time, per GEMM. */
  p->op_overhead_us = 2.0 * 8 * 8 * 8 / best_of_ranks(world, gemm_flops(ops, false, 8, 8, 8, o->seconds / 4)) * 1e6;
  loom_strbuf_printf(t, "# memory: %.1f GB/s per rank (STREAM triad, every rank at once); the norm and GELU reach %.0f%% of it; "
      "attention %.0f%% of the fp32 peak; an op's fixed cost %.2f us (an 8x8x8 linear's GEMM)\n",
      d->memory_bandwidth_gbs, 100.0 * d->memory_efficiency, 100.0 * d->attention_efficiency, p->op_overhead_us);
}

/* The links: each collective timed over the ranks at several sizes and fitted; or, on one rank, --links-from's. */
static void calibrate_links(loom_comm *world, const loom_ops *ops, const loom_calibrate_options *o, int ranks,
                            loom_profile *p, loom_strbuf *t) {
  if (ranks < 2) {
    p->intra_node = copy_link(o->links_from->intra_node);
    p->inter_node = copy_link(o->links_from->inter_node);
    p->devices_per_node = o->links_from->devices_per_node;
    loom_strbuf_printf(t, "# links: copied from --links-from (one rank measures none)\n");
    return;
  }
  static const double SIZES[] = {65536, 262144, 1048576, 4194304, 16777216};
  enum { NS = sizeof SIZES / sizeof SIZES[0] };
  double latency[LOOM_COLL_KINDS], busbw[LOOM_COLL_KINDS];
  static const char *const NAMES[] = {"all_reduce", "all_gather", "reduce_scatter", "sendrecv"};
  for (int k = 0; k < LOOM_COLL_KINDS; k++) {
    double times[NS];
    loom_strbuf_printf(t, "# %s over %d ranks, us (bytes):", NAMES[k], ranks);
    for (int i = 0; i < NS; i++) {
      times[i] = loom_measure_collective_seconds(world, ops->mem, (loom_collective)k, (size_t)SIZES[i], o->seconds / 4);
      loom_strbuf_printf(t, " %.0f (%.0f)", times[i] * 1e6, SIZES[i]);
    }
    fit_link(SIZES, times, NS, (loom_collective)k, ranks, &latency[k], &busbw[k]);
    loom_strbuf_printf(t, "; fitted %.2f us per step, bus bandwidth %.2f GB/s\n", latency[k], busbw[k]);
  }
  /* The link runs at send/recv's rate; a collective reaches the all-reduce's share of it. */
  const double link = busbw[LOOM_COLL_SENDRECV];
  p->intra_node = new_link(link, latency[LOOM_COLL_ALLREDUCE], fmin(busbw[LOOM_COLL_ALLREDUCE] / link, 1.0));
  p->inter_node = copy_link(p->intra_node);
  loom_strbuf_printf(t, "# inter_node: this is one host, so it repeats intra_node\n");
}

loom_status loom_sim_calibrate(loom_comm *world, const loom_ops *ops, const loom_calibrate_options *o, loom_profile **out,
                               char **notes, loom_error *err) {
  *out = NULL, *notes = NULL;
  const int ranks = world ? loom_comm_size(world) : 1;
  if (ranks < 2 && !o->links_from)
    return loom_fail(err, LOOM_ERR_USAGE, "loom sim calibrate: one rank measures no link; launch 2 or more ranks with "
                                          "mpirun, or give --links-from PROFILE for a one-rank device");
  loom_strbuf t = {0};
  loom_profile *p = loom_xmalloc(sizeof *p, "profile");
  loom__cluster_profile__init(p);
  Loom__DeviceProfile *d = loom_xmalloc(sizeof *d, "profile device");
  loom__device_profile__init(d);
  p->device = d;
  loom_strbuf_printf(&t, "# Measured by `loom sim calibrate` on %d rank%s of this machine, each with its threads (one rank is one device).\n",
      ranks, ranks > 1 ? "s" : "");
  calibrate_gemms(world, ops, o->seconds, d, &t);
  calibrate_memory(world, ops, o, ranks, p, &t);
  p->has_devices_per_node = 1;
  p->devices_per_node = ranks;
  p->has_comm_overlaps_compute = 1;
  p->comm_overlaps_compute = false; /* MPI on CPUs progresses only inside its calls, on the cores that compute */
  calibrate_links(world, ops, o, ranks, p, &t);
  p->name = strdup(o->name ? o->name : "calibrated");
  p->source = strdup("loom sim calibrate");
  d->name = strdup("this machine's rank");
  *out = p;
  *notes = t.buf;
  return LOOM_OK;
}
