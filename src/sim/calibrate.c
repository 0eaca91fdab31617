/* Calibration: measure the device and its links into a profile of measurements. */
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

/* The GEMM dtypes measured, in the profile's order (fp8 only where the device has it). */
typedef enum { GEMM_FP32, GEMM_BF16, GEMM_FP8, GEMM_KINDS } gemm_kind;
static const Loom__Precision GEMM_PRECISION[GEMM_KINDS] = {LOOM__PRECISION__PRECISION_FP32, LOOM__PRECISION__PRECISION_BF16,
                                                           LOOM__PRECISION__PRECISION_FP8};
static const char *const GEMM_NAME[GEMM_KINDS] = {"fp32", "bf16", "fp8"};

/* A GPU's queued work, waited for: sumsq is the one op that returns a host value. */
static void wait_for(const loom_ops *ops, bool gpu, const float *x) {
  if (gpu) (void)ops->sumsq(ops, x, 1);
}

typedef struct {
  const loom_ops *ops;
  gemm_kind kind;
  bool gpu;
  int reps; /* products queued before the wait (a GPU's launches overlap) */
  float *a, *b, *c, *da, *db, *scale;
  uint16_t *ah, *bh, *ch; /* bf16: the input, the weight and the output grad, as bits */
  uint8_t *a8, *b8;       /* fp8: the input and the weight, as codes under one scale each */
  int N, C, OC;
} gemm_ctx;

/* A linear layer's GEMMs as the runtime runs them: the forward and both
 * grads (the cost model's three passes; in bf16 from bits, as a bf16 block
 * keeps them); fp8: the forward's product, as Transformer Engine runs it. */
static void gemm_once(void *p) {
  gemm_ctx *g = p;
  for (int r = 0; r < g->reps; r++) {
    if (g->kind == GEMM_BF16) {
      g->ops->matmul_forward_bf16(g->ops, g->c, loom_bf16_bits(g->ah), g->bh, NULL, g->N, g->C, g->OC);
      g->ops->matmul_backward_bf16(g->ops, g->da, g->db, NULL, loom_bf16_bits(g->ch), loom_bf16_bits(g->ah), g->bh, g->N,
                                   g->C, g->OC);
    } else if (g->kind == GEMM_FP8) {
      const loom_fp8_matrix a = {g->a8, g->scale, LOOM_FP8_E4M3, g->N, g->C}, b = {g->b8, g->scale, LOOM_FP8_E4M3, g->OC, g->C};
      g->ops->fp8_gemm(g->ops, g->c, false, &a, &b, g->N, g->OC, g->C);
    } else {
      g->ops->matmul_forward(g->ops, g->c, g->a, g->b, NULL, g->N, g->C, g->OC);
      g->ops->matmul_backward(g->ops, g->da, g->db, NULL, g->c, g->a, g->b, g->N, g->C, g->OC);
    }
  }
  wait_for(g->ops, g->gpu, g->c);
}

/* FLOP/s of one linear's GEMMs through the backend (operands zero: speed does not depend on values). */
static double gemm_flops(const loom_ops *ops, bool gpu, gemm_kind kind, int N, int C, int OC, int reps, double seconds) {
  const loom_allocator *mem = ops->mem;
  gemm_ctx g = {.ops = ops, .kind = kind, .gpu = gpu, .reps = reps, .N = N, .C = C, .OC = OC};
  g.c = loom_xzalloc(mem, (size_t)N * OC * sizeof(float), "calibration GEMM");
  if (kind == GEMM_FP8) {
    g.a8 = loom_xzalloc(mem, (size_t)N * C, "calibration GEMM");
    g.b8 = loom_xzalloc(mem, (size_t)OC * C, "calibration GEMM");
    g.scale = loom_xzalloc(mem, sizeof(float), "calibration GEMM");
  } else {
    g.da = loom_xzalloc(mem, (size_t)N * C * sizeof(float), "calibration GEMM");
    g.db = loom_xzalloc(mem, (size_t)OC * C * sizeof(float), "calibration GEMM");
  }
  if (kind == GEMM_BF16) {
    g.ah = loom_xzalloc(mem, (size_t)N * C * sizeof(uint16_t), "calibration GEMM");
    g.bh = loom_xzalloc(mem, (size_t)OC * C * sizeof(uint16_t), "calibration GEMM");
    g.ch = loom_xzalloc(mem, (size_t)N * OC * sizeof(uint16_t), "calibration GEMM");
  } else if (kind == GEMM_FP32) {
    g.a = loom_xzalloc(mem, (size_t)N * C * sizeof(float), "calibration GEMM");
    g.b = loom_xzalloc(mem, (size_t)OC * C * sizeof(float), "calibration GEMM");
  }
  gemm_once(&g); /* warm-up */
  const double t = loom_measure_best_time(gemm_once, &g, seconds);
  void *all[] = {g.a, g.b, g.c, g.da, g.db, g.scale, g.ah, g.bh, g.ch, g.a8, g.b8};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (all[i]) mem->release(mem, all[i]);
  return (kind == GEMM_FP8 ? 2.0 : 6.0) * N * (double)C * OC * reps / t;
}

/* Attention and elementwise ops through the backend, timed and expressed in
 * the cost model's own units (cost.c): attention as the share of the peak
 * its 4 B H T^2 D forward FLOPs (twice that backward) reach; the norm and
 * the activation as the share of the memory bandwidth their bytes (read and
 * written, twice backward) reach. */
typedef struct {
  const loom_ops *ops;
  bool gpu;
  float *out, *lse, *qkv, *dqkv, *dout, *mean, *rstd, *w, *dw, *b, *db;
  loom_attn_shape shape;
  int N, C;
  size_t stream_n; /* the bandwidth pass's floats */
} op_ctx;

static void attention_once(void *p) {
  op_ctx *x = p;
  const loom_dropout none = {0};
  x->ops->attention_forward(x->ops, x->out, x->lse, x->qkv, &x->shape, &none);
  x->ops->attention_backward(x->ops, x->dqkv, x->dout, x->out, x->qkv, x->lse, &x->shape, &none);
  wait_for(x->ops, x->gpu, x->dqkv);
}

static void elementwise_once(void *p) {
  op_ctx *x = p;
  const size_t n = (size_t)x->N * x->C;
  x->ops->layernorm_forward(x->ops, x->out, x->mean, x->rstd, x->qkv, x->w, x->b, x->N, x->C, 1e-5f);
  x->ops->layernorm_backward(x->ops, x->dqkv, x->dw, x->db, x->dout, x->qkv, x->w, x->mean, x->rstd, x->N, x->C);
  x->ops->gelu_forward(x->ops, x->out, x->qkv, n);
  x->ops->gelu_backward(x->ops, x->dqkv, x->dout, x->qkv, n);
  wait_for(x->ops, x->gpu, x->dqkv);
}

/* A GPU's memory bandwidth: a GELU over stream_n floats, read once and written once. */
static void stream_once(void *p) {
  op_ctx *x = p;
  x->ops->gelu_forward(x->ops, x->dout, x->out, x->stream_n);
  wait_for(x->ops, x->gpu, x->dout);
}

static double device_stream_gbs(const loom_ops *ops, size_t bytes, double seconds) {
  op_ctx x = {.ops = ops, .gpu = true, .stream_n = bytes / 2 / sizeof(float)};
  x.out = loom_xzalloc(ops->mem, x.stream_n * sizeof(float), "calibration stream");
  x.dout = loom_xzalloc(ops->mem, x.stream_n * sizeof(float), "calibration stream");
  stream_once(&x);
  const double gbs = 2.0 * x.stream_n * sizeof(float) / loom_measure_best_time(stream_once, &x, seconds) / 1e9;
  ops->mem->release(ops->mem, x.out);
  ops->mem->release(ops->mem, x.dout);
  return gbs;
}

static void measure_ops(const loom_ops *ops, bool gpu, double seconds, double peak_flops, double stream_gbs,
                        double *attention_eff, double *memory_eff) {
  const loom_allocator *mem = ops->mem;
  op_ctx x = {.ops = ops, .gpu = gpu, .shape = {.T = 256, .B = 4, .heads = 4, .kv_heads = 4, .head_dim = 64, .total_heads = 4},
              .N = 8192, .C = 1024};
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

/* One GEMM dtype over every m x n x k of the grid and a cube twice its largest size, into a measured entry; returns
 * the best rate (TFLOP/s). */
static double calibrate_gemm(loom_comm *world, const loom_ops *ops, const loom_calibrate_options *o, gemm_kind kind,
                             Loom__GemmEfficiency *g, loom_strbuf *t) {
  loom__gemm_efficiency__init(g);
  g->has_dtype = 1, g->dtype = GEMM_PRECISION[kind];
  const int nd = o->n_dims, shapes = nd * nd * nd + 1;
  g->n_measured = (size_t)shapes;
  g->measured = loom_xcalloc((size_t)shapes, sizeof *g->measured, "profile GEMM measurements");
  loom_strbuf_printf(t, "# %s GEMMs (%s), TFLOP/s per rank (m x n x k):", GEMM_NAME[kind],
                     kind == GEMM_FP8 ? "the forward's product" : "a linear's forward and both grads");
  double best = 0.0;
  for (int i = 0; i < shapes; i++) {
    const int top = 2 * o->dims[nd - 1];
    const int m = i < shapes - 1 ? o->dims[i / (nd * nd)] : top, k = i < shapes - 1 ? o->dims[i / nd % nd] : top,
              n = i < shapes - 1 ? o->dims[i % nd] : top;
    const double tflops =
        best_of_ranks(world, gemm_flops(ops, o->gpu, kind, m, k, n, o->gpu ? 4 : 1, o->seconds / 2)) / 1e12;
    Loom__GemmMeasurement *x = g->measured[i] = loom_xmalloc(sizeof *x, "profile GEMM measurement");
    loom__gemm_measurement__init(x);
    x->has_m = x->has_n = x->has_k = x->has_tflops = 1;
    x->m = m, x->n = n, x->k = k, x->tflops = tflops, x->source = strdup("loom sim calibrate");
    best = fmax(best, tflops);
    loom_strbuf_printf(t, "%s %dx%dx%d %.4g", i % 9 == 0 ? "\n#  " : ",", m, n, k, tflops);
  }
  loom_strbuf_printf(t, "\n");
  return best;
}

/* The GEMMs: every dtype's measurements and peaks. A GPU's peaks are its datasheet's where known (TF32 half the
 * bf16 peak, fp8 twice it, as on A100, H100 and B200), never below what was measured; else the best measured. */
static void calibrate_gemms(loom_comm *world, const loom_ops *ops, const loom_calibrate_options *o, Loom__DeviceProfile *d,
                            loom_strbuf *t) {
  const int kinds = o->fp8 ? 3 : 2;
  d->n_gemm = (size_t)kinds;
  d->gemm = loom_xcalloc((size_t)kinds, sizeof *d->gemm, "profile GEMMs");
  double best[GEMM_KINDS] = {0};
  if (o->set_tf32) o->set_tf32(ops, true);
  for (int k = 0; k < kinds; k++) {
    d->gemm[k] = loom_xmalloc(sizeof *d->gemm[k], "profile GEMM");
    best[k] = calibrate_gemm(world, ops, o, (gemm_kind)k, d->gemm[k], t);
  }
  const double sheet = o->peak_bf16_tflops;
  d->has_peak_tflops_bf16 = d->has_peak_tflops_fp32 = 1;
  d->peak_tflops_bf16 = fmax(sheet, best[GEMM_BF16]);
  if (o->set_tf32) { /* fp32 GEMMs run on TF32; the fp32 peak is a cube's with TF32 off */
    d->fp32_uses_tf32 = d->has_fp32_uses_tf32 = d->has_peak_tflops_tf32 = 1;
    d->peak_tflops_tf32 = fmax(sheet / 2.0, best[GEMM_FP32]);
    o->set_tf32(ops, false);
    const int top = 2 * o->dims[o->n_dims - 1];
    d->peak_tflops_fp32 = best_of_ranks(world, gemm_flops(ops, o->gpu, GEMM_FP32, top, top, top, 1, o->seconds)) / 1e12;
    o->set_tf32(ops, true);
  } else {
    d->peak_tflops_fp32 = best[GEMM_FP32];
  }
  if (o->fp8) d->has_peak_tflops_fp8 = 1, d->peak_tflops_fp8 = fmax(2.0 * sheet, best[GEMM_FP8]);
}

/* Memory bandwidth, the memory-bound ops' and attention's efficiencies, memory per rank and an op's fixed cost. */
static void calibrate_memory(loom_comm *world, const loom_ops *ops, const loom_calibrate_options *o, int ranks,
                             loom_profile *p, loom_strbuf *t) {
  Loom__DeviceProfile *d = p->device;
  d->has_memory_bandwidth_gbs = d->has_memory_efficiency = 1;
  d->memory_bandwidth_gbs = best_of_ranks(world, o->gpu ? device_stream_gbs(ops, o->mem_bytes, o->seconds)
                                                        : loom_measure_memory_gbs(o->mem_bytes, o->seconds));
  /* Attention's share of the peak its run's GEMMs use: bf16's on a GPU, fp32's on the CPU. */
  const double attention_peak = (o->gpu ? d->peak_tflops_bf16 : d->peak_tflops_fp32) * 1e12;
  double attention_eff, memory_eff;
  measure_ops(ops, o->gpu, o->seconds, attention_peak, d->memory_bandwidth_gbs, &attention_eff, &memory_eff);
  d->has_attention_efficiency = 1;
  d->attention_efficiency = best_of_ranks(world, attention_eff);
  d->memory_efficiency = best_of_ranks(world, memory_eff);
  /* Memory per rank: the device's, or the host's shared among the launched ranks. */
  d->has_memory_bytes = 1;
  d->memory_bytes = o->memory_bytes > 0 ? o->memory_bytes : (int64_t)sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE) / ranks;
  p->has_op_overhead_us = 1;
  /* An 8x8x8 linear is all overhead: its three GEMMs' time, per GEMM (on a GPU, 64 queued before one wait). */
  const int reps = o->gpu ? 64 : 1;
  p->op_overhead_us =
      2.0 * 8 * 8 * 8 / best_of_ranks(world, gemm_flops(ops, o->gpu, GEMM_FP32, 8, 8, 8, reps, o->seconds / 4)) * 1e6;
  loom_strbuf_printf(t, "# memory: %.1f GB/s per rank (%s, every rank at once); the norm and GELU reach %.0f%% of it; "
      "attention %.0f%% of the %s peak; an op's fixed cost %.2f us (an 8x8x8 linear's GEMM)\n",
      d->memory_bandwidth_gbs, o->gpu ? "a GELU over device memory" : "STREAM triad", 100.0 * d->memory_efficiency,
      100.0 * d->attention_efficiency, o->gpu ? "bf16" : "fp32", p->op_overhead_us);
}

/* wait_for as loom_measure_collective_seconds calls it. */
static void wait_gpu(void *ops, const float *result) { wait_for(ops, true, result); }

/* The links: each collective timed over the ranks at message sizes from 64 KiB by fours, as measurements of the node's
 * link (the profile's loading fits them); or, on one rank, --links-from's. */
static void calibrate_links(loom_comm *world, const loom_ops *ops, const loom_calibrate_options *o, int ranks,
                            loom_profile *p, loom_strbuf *t) {
  if (ranks < 2) {
    p->intra_node = copy_link(o->links_from->intra_node);
    p->inter_node = copy_link(o->links_from->inter_node);
    p->devices_per_node = o->links_from->devices_per_node;
    loom_strbuf_printf(t, "# links: copied from --links-from (one rank measures none)\n");
    return;
  }
  enum { MAX_SIZES = 16 };
  int sizes = 0;
  double size[MAX_SIZES];
  for (double s = 65536; s <= o->max_bytes && sizes < MAX_SIZES; s *= 4) size[sizes++] = s;
  static const char *const NAMES[] = {"all_reduce", "all_gather", "reduce_scatter", "sendrecv"};
  /* Both links' own figures are set from the fitted curves (link_figures). */
  p->intra_node = new_link(1.0, 0.0, 1.0);
  p->inter_node = new_link(1.0, 0.0, 1.0);
  Loom__Link *l = p->intra_node;
  l->n_collective = LOOM_COLL_KINDS;
  l->collective = loom_xcalloc(LOOM_COLL_KINDS, sizeof *l->collective, "profile collectives");
  for (int k = 0; k < LOOM_COLL_KINDS; k++) {
    Loom__CollectiveCurve *c = l->collective[k] = loom_xmalloc(sizeof *c, "profile collective");
    loom__collective_curve__init(c);
    c->has_kind = 1, c->kind = (Loom__CollectiveKind)k;
    c->n_measured = (size_t)sizes;
    c->measured = loom_xcalloc((size_t)sizes, sizeof *c->measured, "profile collective measurements");
    loom_strbuf_printf(t, "# %s over %d ranks, us (bytes):", NAMES[k], ranks);
    for (int i = 0; i < sizes; i++) {
      const double s = loom_measure_collective_seconds(world, ops->mem, (loom_collective)k, (size_t)size[i], o->seconds / 4,
                                                       o->gpu ? wait_gpu : NULL, (void *)ops);
      Loom__BusBandwidthMeasurement *x = c->measured[i] = loom_xmalloc(sizeof *x, "profile collective measurement");
      loom__bus_bandwidth_measurement__init(x);
      x->has_ranks = x->has_ranks_per_node = x->has_bytes = x->has_busbw_gbs = 1;
      x->ranks = x->ranks_per_node = ranks, x->bytes = size[i];
      x->busbw_gbs = loom_collective_factor((loom_collective)k, ranks) * size[i] / s / 1e9;
      x->source = strdup("loom sim calibrate");
      loom_strbuf_printf(t, " %.0f (%.0f)", s * 1e6, size[i]);
    }
    loom_strbuf_printf(t, "\n");
  }
}

/* The link's own figures from its fitted curves: it runs at send/recv's rate; a collective reaches the all-reduce's
 * share of it. One host: inter_node repeats intra_node. */
static void link_figures(loom_profile *p, loom_strbuf *t) {
  Loom__Link *l = p->intra_node;
  if (!l->n_collective) return;
  const Loom__CollectiveCurve *all_reduce = l->collective[LOOM_COLL_ALLREDUCE], *sendrecv = l->collective[LOOM_COLL_SENDRECV];
  l->bandwidth_gbs = sendrecv->bus_gbs, l->latency_us = all_reduce->latency_us;
  l->efficiency = fmin(all_reduce->bus_gbs / sendrecv->bus_gbs, 1.0);
  for (size_t k = 0; k < l->n_collective; k++)
    loom_strbuf_printf(t, "# fitted: %s %.4g us per step, bus bandwidth %.4g GB/s\n",
                       protobuf_c_enum_descriptor_get_value(&loom__collective_kind__descriptor, l->collective[k]->kind)->name,
                       l->collective[k]->latency_us, l->collective[k]->bus_gbs);
  loom__link__free_unpacked(p->inter_node, NULL);
  p->inter_node = copy_link(l);
  loom_strbuf_printf(t, "# inter_node: this is one host, so it repeats intra_node (without the curves)\n");
}

static void note_gemm_fits(const Loom__DeviceProfile *d, loom_strbuf *t) {
  for (size_t k = 0; k < d->n_gemm; k++)
    loom_strbuf_printf(t, "# fitted: %s GEMMs %.4g of the peak x g(m) g(n) h(k), half_dim %g, half_k %g\n",
                       protobuf_c_enum_descriptor_get_value(&loom__precision__descriptor, d->gemm[k]->dtype)->name,
                       d->gemm[k]->max_efficiency, d->gemm[k]->half_dim, d->gemm[k]->half_k);
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
  loom_strbuf_printf(&t, "# Measured by `loom sim calibrate` on %d rank%s, one device each: %s.\n", ranks,
                     ranks > 1 ? "s" : "", o->device_name ? o->device_name : "this machine's rank");
  calibrate_gemms(world, ops, o, d, &t);
  calibrate_memory(world, ops, o, ranks, p, &t);
  p->has_devices_per_node = 1;
  p->devices_per_node = ranks;
  /* MPI on CPUs progresses only inside its calls, on the cores that compute; NCCL on GPUs runs beside compute. */
  p->has_comm_overlaps_compute = 1;
  p->comm_overlaps_compute = o->gpu;
  calibrate_links(world, ops, o, ranks, p, &t);
  p->name = strdup(o->name ? o->name : "calibrated");
  p->source = strdup("loom sim calibrate");
  d->name = strdup(o->device_name ? o->device_name : "this machine's rank");
  /* Fit the measurements as loading will, for the link's own figures and the notes; then print them alone. */
  loom_status st = loom_profile_check(p, "the calibrated profile", err);
  if (st == LOOM_OK) {
    note_gemm_fits(d, &t);
    link_figures(p, &t);
    loom_profile_unfit(p);
    *out = p;
    *notes = t.buf;
  } else {
    loom_profile_free(p);
    free(t.buf);
  }
  return st;
}
