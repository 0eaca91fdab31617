/* The cost model and plan search: profiles and their refusals, collective
 * costs against the ring formulas, the replay against a hand count, the
 * pipeline bubble against theory, traces, and the search's ranking. SC21's
 * published runs are tests/sim_tables.py's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "schedule/timeline.h"
#include "sim/goodput_model.h"
#include "plan/textformat.h"
#include "sim/profile_report.h"
#include "sim/search.h"
#include "cli/names.h"
#include "test_util.h"

static loom_profile *builtin(const char *name) {
  loom_profile *p = NULL;
  loom_error err = {0};
  ck_assert_msg(loom_profile_load(name, &p, &err) == LOOM_OK, "%s", err.msg);
  return p;
}

/* The bus bandwidth (bytes/s) a kind of collective reaches inside a node: its curve's, else the link's share. */
static double intra_bus(const loom_profile *p, Loom__CollectiveKind kind) {
  for (size_t i = 0; i < p->intra_node->n_collective; i++)
    if (p->intra_node->collective[i]->kind == kind) return p->intra_node->collective[i]->bus_gbs * 1e9;
  return p->intra_node->bandwidth_gbs * p->intra_node->efficiency * 1e9;
}

static loom_plan *plan_of(loom_plan_spec spec) {
  loom_gpt_config_finish(&spec.model);
  if (!spec.fp8_scaling.history) spec.fp8_scaling.history = 1; /* Megatron-Core's default */
  if (!spec.schedule) spec.schedule = LOOM_SCHEDULE_1F1B;
  loom_plan *p = NULL;
  loom_error err = {0};
  ck_assert_msg(loom_plan_build(&spec, &p, &err) == LOOM_OK, "%s", err.msg);
  char lines[2048];
  ck_assert_msg(loom_plan_check_rules(p, 0, 0, lines, sizeof lines) == 0, "%s", lines);
  return p;
}

/* A plan predicted on a built-in profile, all three kept for the test to read. */
typedef struct {
  loom_profile *prof;
  loom_plan *plan;
  loom_sim_result r;
} predicted;

static void predict(predicted *x, const char *cluster, loom_plan_spec spec) {
  x->prof = builtin(cluster);
  x->plan = plan_of(spec);
  loom_error err = {0};
  ck_assert_msg(loom_sim_run(x->plan, x->prof, &LOOM_SIM_ASSUME_BALANCED, &x->r, &err) == LOOM_OK, "%s", err.msg);
}

static void predicted_free(predicted *x) {
  loom_sim_result_free(&x->r);
  loom_plan_free(x->plan);
  loom_profile_free(x->prof);
}

static const loom_gpt_config GPT = {.layers = 32, .hidden = 1024, .heads = 16, .vocab = 1024, .seq = 1024};

START_TEST(builtin_profiles_load) {
  const char *names[] = {"a100-80gb", "h100-sxm", "h200"};
  const double bf16[] = {312, 989, 989};
  for (int i = 0; i < 3; i++) {
    loom_profile *p = builtin(names[i]);
    ck_assert_str_eq(p->name, names[i]);
    ck_assert_double_eq_tol(loom_profile_peak_flops(p, LOOM__PRECISION__PRECISION_BF16), bf16[i] * 1e12, 1.0);
    ck_assert_int_eq(p->devices_per_node, 8);
    /* A large GEMM reaches about max_efficiency; a small one much less. */
    const double big = 2.0 * 8192.0 * 8192 * 8192 / loom_profile_gemm_seconds(p, LOOM__PRECISION__PRECISION_BF16, 8192, 8192, 8192, 1);
    const double small = 2.0 * 32.0 * 32 * 32 / loom_profile_gemm_seconds(p, LOOM__PRECISION__PRECISION_BF16, 32, 32, 32, 1);
    ck_assert(big > 0.4 * bf16[i] * 1e12 && big < bf16[i] * 1e12);
    ck_assert(small < 0.25 * big);
    loom_profile_free(p);
  }
  ck_assert_str_eq(loom_profile_builtin_names(), "a100-80gb, h100-sxm, h200");
}
END_TEST

/* A valid profile's text with one line replaced: each refusal names its field. */
static const char *const GOOD =
    "name: \"t\"\n"
    "device { peak_tflops_bf16: 100 peak_tflops_fp32: 10 memory_bytes: 1000000000 memory_bandwidth_gbs: 1000\n"
    "  memory_efficiency: 0.8\n"
    "  gemm { dtype: PRECISION_BF16 max_efficiency: 0.7 half_dim: 64 }\n"
    "  gemm { dtype: PRECISION_FP32 max_efficiency: 0.7 half_dim: 64 } }\n"
    "devices_per_node: 8\n"
    "intra_node { bandwidth_gbs: 100 latency_us: 1 efficiency: 1 }\n"
    "inter_node { bandwidth_gbs: 10 latency_us: 5 efficiency: 1 }\n";

static loom_status parse_with(const char *from, const char *to, loom_error *err) {
  char text[2048];
  const char *at = strstr(GOOD, from);
  ck_assert_ptr_nonnull(at);
  snprintf(text, sizeof text, "%.*s%s%s", (int)(at - GOOD), GOOD, to, at + strlen(from));
  loom_profile *p = NULL;
  const loom_status st = loom_profile_parse(text, strlen(text), "t.txtpb", &p, err);
  loom_profile_free(p);
  return st;
}

START_TEST(profiles_refuse_bad_figures) {
  loom_error err = {0};
  ck_assert_int_eq(parse_with("name", "name", &err), LOOM_OK);
  const struct {
    const char *from, *to, *why;
  } cases[] = {
      {"peak_tflops_bf16: 100", "peak_tflops_bf16: -1", "t.txtpb: device.peak_tflops_bf16 = -1 must be >= 1e-06 and at most 1e+06"},
      {"peak_tflops_fp32: 10 ", "", "t.txtpb: device.peak_tflops_fp32 is missing; every profile gives it"},
      {"memory_efficiency: 0.8", "memory_efficiency: 1.5", "device.memory_efficiency = 1.5 must be >= 0.001 and at most 1"},
      {"max_efficiency: 0.7 half_dim: 64 } }", "max_efficiency: 0 half_dim: 64 } }", "device.gemm.max_efficiency = 0 must be >= 0.001"},
      {"gemm { dtype: PRECISION_FP32", "gemm { dtype: PRECISION_BF16", "device.gemm gives dtype PRECISION_BF16 twice"},
      {"devices_per_node: 8", "devices_per_node: 0", "devices_per_node = 0 must be >= 1"},
      {"intra_node { bandwidth_gbs: 100", "intra_node { bandwidth_gbs: 0", "intra_node.bandwidth_gbs = 0 must be >= 1e-06"},
      {"inter_node { bandwidth_gbs: 10 latency_us: 5 efficiency: 1 }\n", "", "inter_node is missing"},
      {"latency_us: 5", "latency_us: -5", "inter_node.latency_us = -5 must be >= 0"},
      {"memory_efficiency: 0.8", "memory_efficiency: 0.8 attention_efficiency: 2", "device.attention_efficiency = 2"},
      {"memory_efficiency: 0.8", "memory_efficiency: 0.8 attention_half_seq: 512",
       "t.txtpb: device.attention_half_seq shapes device.attention_efficiency, which is absent; give both or neither"},
      {"memory_efficiency: 0.8", "memory_efficiency: 0.8 attention_efficiency: 0.5 attention_half_seq: -1",
       "device.attention_half_seq = -1 must be >= 0"},
      {"devices_per_node: 8", "devices_per_nodes: 8", "not a cluster profile"},
      {"name: \"t\"", "name: \"a\\\"b\"", "t.txtpb: name may hold printable ASCII only, without quotes or backslashes"},
      {"peak_tflops_fp32: 10 ", "peak_tflops_fp32: 10 peak_tflops_fp8: 400 ",
       "t.txtpb: device.peak_tflops_fp8 and a PRECISION_FP8 device.gemm entry come together"},
      {"gemm { dtype: PRECISION_FP32", "gemm { dtype: PRECISION_FP8 max_efficiency: 0.5 half_dim: 8 } gemm { dtype: PRECISION_FP32",
       "t.txtpb: device.peak_tflops_fp8 and a PRECISION_FP8 device.gemm entry come together"},
      {"peak_tflops_fp32: 10 ", "peak_tflops_fp32: 10 peak_tflops_fp8: -3 ", "device.peak_tflops_fp8 = -3 must be >= 1e-06"},
      {"devices_per_node: 8", "devices_per_node: 8 reliability { mtbf_node_hours: 0 }",
       "reliability.mtbf_node_hours = 0 must be >= 0.001"},
      {"devices_per_node: 8", "devices_per_node: 8 reliability { unrecoverable_share: 1.5 }",
       "reliability.unrecoverable_share = 1.5 must be >= 0 and at most 1"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ck_assert_int_eq(parse_with(cases[i].from, cases[i].to, &err), LOOM_ERR_FORMAT);
    ck_assert_msg(strstr(err.msg, cases[i].why) != NULL, "case %zu: '%s' lacks '%s'", i, err.msg, cases[i].why);
  }
  loom_profile *p = NULL;
  ck_assert_int_eq(loom_profile_load("tpu-v9", &p, &err), LOOM_ERR_USAGE);
  ck_assert_int_eq(loom_profile_load("/nonexistent/x.txtpb", &p, &err), LOOM_ERR_IO);
}
END_TEST

/* A profile of GOOD's whose bf16 entry and intra-node all-gather hold measurements made from known constants
 * (efficiency 0.7 x g(m) g(n) h(k), halves 100 and 300; 5 us a step, 300 GB/s), and an inter-node all-reduce over 2
 * nodes of 8 at 40 GB/s an adapter: loading fits them back. */
static void measured_profile(char *text, size_t len) {
  char gemm[4096] = "", gather[2048] = "", reduce[2048] = "";
  static const double SHAPES[][3] = {{64, 4096, 4096}, {256, 8192, 1024}, {1024, 1024, 256}, {4096, 4096, 4096},
                                     {8192, 512, 8192}, {128, 2048, 64}, {2048, 128, 16384}};
  for (size_t i = 0; i < sizeof SHAPES / sizeof SHAPES[0]; i++) {
    const double m = SHAPES[i][0], n = SHAPES[i][1], k = SHAPES[i][2];
    const double tflops = 100.0 * 0.7 * m / (m + 100) * n / (n + 100) * k / (k + 300);
    snprintf(gemm + strlen(gemm), sizeof gemm - strlen(gemm), "measured { m: %g n: %g k: %g tflops: %.17g source: \"t\" } ", m,
             n, k, tflops);
  }
  for (double bytes = 65536; bytes <= 1 << 30; bytes *= 16) {
    const double bus = 7.0 / 8 * bytes, t = 7 * 5e-6 + bus / 300e9; /* 8 ranks: 7 steps */
    snprintf(gather + strlen(gather), sizeof gather - strlen(gather), "measured { ranks: 8 bytes: %g busbw_gbs: %.17g } ",
             bytes, bus / t / 1e9);
    const double bus16 = 2.0 * 15 / 16 * bytes, t16 = 8 * 2e-6 + bus16 / (8 * 40e9); /* 16 ranks: a tree's 8 steps */
    snprintf(reduce + strlen(reduce), sizeof reduce - strlen(reduce),
             "measured { ranks: 16 ranks_per_node: 8 bytes: %g busbw_gbs: %.17g } ", bytes, bus16 / t16 / 1e9);
  }
  snprintf(text, len,
           "name: \"t\"\n"
           "device { peak_tflops_bf16: 100 peak_tflops_fp32: 10 memory_bytes: 1000000000 memory_bandwidth_gbs: 1000\n"
           "  memory_efficiency: 0.8\n"
           "  gemm { dtype: PRECISION_BF16 %s }\n"
           "  gemm { dtype: PRECISION_FP32 max_efficiency: 0.7 half_dim: 64 } }\n"
           "devices_per_node: 8\n"
           "intra_node { bandwidth_gbs: 100 latency_us: 1 efficiency: 1 collective { kind: COLLECTIVE_ALL_GATHER %s } }\n"
           "inter_node { bandwidth_gbs: 10 latency_us: 5 efficiency: 1 collective { kind: COLLECTIVE_ALL_REDUCE %s } }\n",
           gemm, gather, reduce);
}

/* Measurements become the curves they came from: the GEMM's three constants (on the fit's grid, 10% steps) and the
 * collective's latency and bus bandwidth (exactly, from exact times), which the cost model then prices with. */
START_TEST(curves_fit_their_measurements) {
  static char text[16384];
  measured_profile(text, sizeof text);
  loom_profile *p = NULL;
  loom_error err = {0};
  ck_assert_msg(loom_profile_parse(text, strlen(text), "t", &p, &err) == LOOM_OK, "%s", err.msg);
  const Loom__GemmEfficiency *g = p->device->gemm[0];
  ck_assert(g->has_max_efficiency && g->has_half_dim && g->has_half_k);
  ck_assert_msg(fabs(g->max_efficiency - 0.7) < 0.03 && fabs(g->half_dim / 100 - 1) < 0.1 && fabs(g->half_k / 300 - 1) < 0.1,
                "fitted %g, %g, %g", g->max_efficiency, g->half_dim, g->half_k);
  /* A shape no measurement had, read within 2% of the generating curve. */
  const double want = 0.7 * 512 / 612.0 * 3000 / 3100.0 * 700 / 1000.0;
  ck_assert_double_eq_tol(loom_profile_gemm_efficiency(p, LOOM__PRECISION__PRECISION_BF16, 512, 3000, 700) / want, 1.0, 0.02);
  const Loom__CollectiveCurve *c = p->intra_node->collective[0];
  ck_assert_double_eq_tol(c->latency_us, 5.0, 5e-4); /* the normal equations over sizes 65536 to 1 GiB: 1e-4 relative */
  ck_assert_double_eq_tol(c->bus_gbs, 300.0, 3e-2);
  ck_assert_double_eq_tol(loom_collective_seconds(p, LOOM_COLL_ALLGATHER, 1e9, 8, 8, NULL), 7.0 / 8 * 1e9 / 300e9 + 7 * 5e-6, 1e-8);
  /* Without a curve of their own the other kinds keep the link's figures. */
  ck_assert_double_eq_tol(loom_collective_seconds(p, LOOM_COLL_REDUCE_SCATTER, 1e9, 8, 8, NULL), 7.0 / 8 * 1e9 / 100e9 + 7e-6, 1e-12);
  /* Between nodes the curve is an adapter's: 40 GB/s each, 8 members of a node together, the intra-node link's rate
   * (100 GB/s, no all-reduce curve there) the cap; one member a node gets one adapter's. */
  const Loom__CollectiveCurve *r = p->inter_node->collective[0];
  ck_assert_double_eq_tol(r->latency_us, 2.0, 2e-4);
  ck_assert_double_eq_tol(r->bus_gbs, 40.0, 4e-3);
  ck_assert_double_eq_tol(loom_collective_seconds(p, LOOM_COLL_ALLREDUCE, 1e9, 16, 8, NULL), 2.0 * 15 / 16 * 1e9 / 100e9 + 8 * 2e-6,
                          1e-8);
  ck_assert_double_eq_tol(loom_collective_seconds(p, LOOM_COLL_ALLREDUCE, 1e9, 16, 1, NULL), 2.0 * 15 / 16 * 1e9 / 40e9 + 8 * 2e-6,
                          1e-8);
  /* Printed without the fitted constants, it loads again to the same curves. */
  loom_profile_unfit(p);
  char *again = loom_text_print(&p->base);
  loom_profile *q = NULL;
  ck_assert_msg(loom_profile_parse(again, strlen(again), "again", &q, &err) == LOOM_OK, "%s", err.msg);
  ck_assert_double_eq(q->device->gemm[0]->max_efficiency, g->max_efficiency);
  ck_assert_double_eq(q->intra_node->collective[0]->bus_gbs, c->bus_gbs);
  free(again);
  loom_profile_free(q);
  loom_profile_free(p);
}
END_TEST

/* The built-in profiles read against points of their cited sources, by hand: H100 SXM bf16 at the 8192 cube
 * (torch-performance-test-data #79: 797.51 TFLOP/s) and at MAMF's best shape (792.1), fp8 at 4096 x 7168 x 16384
 * (DeepGEMM's README: 1358), within the fit's 10%; A100 bf16 at MAMF's shape (267.9); and the H100's tp-8 all-gather
 * at NCCL's ~370 GB/s of NVLink bus bandwidth (nccl-tests #212). */
START_TEST(profiles_read_their_sources) {
  loom_profile *h = builtin("h100-sxm"), *a = builtin("a100-80gb");
  const Loom__Precision bf16 = LOOM__PRECISION__PRECISION_BF16, fp8 = LOOM__PRECISION__PRECISION_FP8;
  const struct {
    loom_profile *p;
    Loom__Precision dtype;
    double m, n, k, peak, tflops;
  } points[] = {{h, bf16, 8192, 8192, 8192, 989, 797.51}, {h, bf16, 6144, 17920, 2816, 989, 792.1},
                {h, fp8, 4096, 7168, 16384, 1979, 1358}, {a, bf16, 6912, 16384, 2048, 312, 267.9}};
  for (size_t i = 0; i < sizeof points / sizeof points[0]; i++) {
    const double got = loom_profile_gemm_efficiency(points[i].p, points[i].dtype, points[i].m, points[i].n, points[i].k) * points[i].peak;
    ck_assert_msg(fabs(got / points[i].tflops - 1.0) < 0.1, "point %zu: %g TFLOP/s, the source %g", i, got, points[i].tflops);
  }
  /* FlashAttention-3 at 8K keys, head dim 128 (Shah et al. 2024, Figures 5 and 6): forward 602, backward 559 TFLOP/s,
   * 572.6 weighted 1:2 as their FLOPs are; the fitted curve reads it within 3%. */
  const Loom__DeviceProfile *d = h->device;
  const double fa3 = 3.0 / (1.0 / 602 + 2.0 / 559), curve = 989.0 * d->attention_efficiency * 8192 / (8192 + d->attention_half_seq);
  ck_assert_msg(d->n_attention_measured == 6 && fabs(curve / fa3 - 1.0) < 0.03, "attention at 8K: %g, FA3 %g", curve, fa3);
  const double bytes = 1 << 30, t = loom_collective_seconds(h, LOOM_COLL_ALLGATHER, bytes, 8, 8, NULL);
  ck_assert_double_eq_tol(7.0 / 8 * bytes / t / 1e9, 370.0, 3.7); /* 1%: the 7 latency steps of 3 us */
  loom_profile_free(h);
  loom_profile_free(a);
}
END_TEST

/* Measurements that cannot make a curve are refused, each with one line naming what. */
START_TEST(curves_refuse_bad_measurements) {
  loom_error err = {0};
  const struct {
    const char *from, *to, *why;
  } cases[] = {
      {"gemm { dtype: PRECISION_BF16 max_efficiency: 0.7 half_dim: 64 }",
       "gemm { dtype: PRECISION_BF16 max_efficiency: 0.7 measured { m: 64 n: 64 k: 64 tflops: 10 } }",
       "t.txtpb: device.gemm PRECISION_BF16 gives measurements and constants; give one or the other"},
      {"gemm { dtype: PRECISION_BF16 max_efficiency: 0.7 half_dim: 64 }",
       "gemm { dtype: PRECISION_BF16 measured { m: 64 n: 64 k: 64 tflops: 101 } }",
       "device.gemm.measured.tflops = 101 must be >= 1e-06 and at most 100"},
      {"gemm { dtype: PRECISION_BF16 max_efficiency: 0.7 half_dim: 64 }",
       "gemm { dtype: PRECISION_BF16 measured { m: 0 n: 64 k: 64 tflops: 1 } }", "device.gemm.measured.m = 0 must be >= 1"},
      {"efficiency: 1 }\ninter", "efficiency: 1 collective { kind: COLLECTIVE_ALL_GATHER measured { ranks: 8 bytes: 1e6 busbw_gbs: 50 } } }\ninter",
       "t.txtpb: intra_node.collective holds 1 measurements; a curve takes 2 to 1024 message sizes"},
      {"efficiency: 1 }\ninter",
       "efficiency: 1 collective { kind: COLLECTIVE_ALL_GATHER measured { ranks: 16 ranks_per_node: 8 bytes: 1e6 busbw_gbs: 50 } "
       "measured { ranks: 16 ranks_per_node: 8 bytes: 1e8 busbw_gbs: 90 } } }\ninter",
       "t.txtpb: intra_node.collective measures 16 ranks with 8 in a node: the link in a node needs every rank in one node"},
      {"efficiency: 1 }\ninter",
       "efficiency: 1 collective { kind: COLLECTIVE_ALL_GATHER bus_gbs: 50 latency_us: 1 measured { ranks: 8 bytes: 1e6 busbw_gbs: 5 } "
       "measured { ranks: 8 bytes: 1e8 busbw_gbs: 40 } } }\ninter",
       "t.txtpb: intra_node.collective gives measurements and constants; give one or the other"},
      {"efficiency: 1 }\ninter", "efficiency: 1 collective { kind: COLLECTIVE_ALL_GATHER bus_gbs: 50 latency_us: 1 } "
       "collective { kind: COLLECTIVE_ALL_GATHER bus_gbs: 60 latency_us: 1 } }\ninter",
       "t.txtpb: intra_node.collective gives kind 1 twice"},
      {"efficiency: 1 }\ninter", "efficiency: 1 collective { kind: COLLECTIVE_ALL_GATHER latency_us: 1 } }\ninter",
       "t.txtpb: intra_node.collective.bus_gbs is missing"},
      {"memory_efficiency: 0.8", "memory_efficiency: 0.8 attention_efficiency: 0.5 "
       "attention_measured { seq: 1024 head_dim: 128 forward_tflops: 50 backward_tflops: 40 }",
       "t.txtpb: device.attention_measured and device.attention_efficiency or attention_half_seq: give one or the other"},
      {"memory_efficiency: 0.8", "memory_efficiency: 0.8 attention_measured { seq: 1024 head_dim: 128 forward_tflops: 150 "
       "backward_tflops: 40 }", "device.attention_measured.forward_tflops = 150 must be >= 1e-06 and at most 100"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ck_assert_int_eq(parse_with(cases[i].from, cases[i].to, &err), LOOM_ERR_FORMAT);
    ck_assert_msg(strstr(err.msg, cases[i].why) != NULL, "case %zu: '%s' lacks '%s'", i, err.msg, cases[i].why);
  }
}
END_TEST

START_TEST(collectives_follow_ring_formulas) {
  loom_profile *p = NULL;
  loom_error err = {0};
  ck_assert_int_eq(loom_profile_parse(GOOD, strlen(GOOD), "t", &p, &err), LOOM_OK);
  const double S = 1e9;
  double sent;
  /* Inside a node: 2 (n-1)/n S over 100 GB/s, and a tree's 2 log2(8) = 6 steps of 1 us. */
  ck_assert_double_eq_tol(loom_collective_seconds(p, LOOM_COLL_ALLREDUCE, S, 8, 8, &sent), 2.0 * 7 / 8 * S / 100e9 + 6e-6, 1e-12);
  ck_assert_double_eq_tol(sent, 2.0 * 7 / 8 * S, 1.0);
  /* A ring's 7 steps for a gather or scatter. */
  ck_assert_double_eq_tol(loom_collective_seconds(p, LOOM_COLL_ALLGATHER, S, 8, 8, NULL), 7.0 / 8 * S / 100e9 + 7e-6, 1e-12);
  ck_assert_double_eq_tol(loom_collective_seconds(p, LOOM_COLL_REDUCE_SCATTER, S, 8, 8, NULL), 7.0 / 8 * S / 100e9 + 7e-6, 1e-12);
  /* Across nodes, one member per node: the adapter's 10 GB/s and 5 us; four per node share four adapters. */
  ck_assert_double_eq_tol(loom_collective_seconds(p, LOOM_COLL_ALLREDUCE, S, 8, 1, NULL), 2.0 * 7 / 8 * S / 10e9 + 6 * 5e-6, 1e-12);
  ck_assert_double_eq_tol(loom_collective_seconds(p, LOOM_COLL_ALLREDUCE, S, 8, 4, NULL), 2.0 * 7 / 8 * S / 40e9 + 6 * 5e-6, 1e-12);
  ck_assert_double_eq_tol(loom_collective_seconds(p, LOOM_COLL_SENDRECV, S, 2, 1, NULL), S / 10e9 + 5e-6, 1e-12);
  ck_assert_double_eq(loom_collective_seconds(p, LOOM_COLL_ALLREDUCE, S, 1, 1, NULL), 0.0);
  /* Rank order: tp groups are consecutive ranks, dp groups tp apart. */
  ck_assert_int_eq(loom_group_per_node(8, 1, 8), 8);
  ck_assert_int_eq(loom_group_per_node(32, 1, 8), 8);
  ck_assert_int_eq(loom_group_per_node(4, 2, 8), 4);
  ck_assert_int_eq(loom_group_per_node(64, 8, 8), 1);
  loom_profile_free(p);
}
END_TEST

START_TEST(replay_adds_up_one_rank) {
  predicted x;
  predict(&x, "a100-80gb", (loom_plan_spec){.model = GPT, .tp = 1, .pp = 1, .dp = 1, .vpp = 1, .micro_batch = 2,
                                            .global_batch = 8, .precision = LOOM__PRECISION__PRECISION_BF16});
  const loom_sim_result r = x.r;
  ck_assert_int_eq(r.costs.m, 4);
  ck_assert(r.costs.forward[0] > 0 && r.costs.backward[0] > 1.5 * r.costs.forward[0]);
  /* One rank: every micro-batch's forward and backward, then the optimizer, nothing idle. */
  const double want = 4.0 * (r.costs.forward[0] + r.costs.backward[0]) + r.costs.optimizer[0];
  ck_assert_double_eq_tol(r.step_s, want, 1e-12 * want);
  ck_assert_double_eq_tol(r.bubble, 0.0, 1e-12);
  ck_assert_double_eq_tol(r.tflops_per_gpu * 1e12 * r.step_s, r.model_flops, 1e-9 * r.model_flops);
  ck_assert_double_eq_tol(r.mfu, r.tflops_per_gpu / 312.0, 1e-9);
  ck_assert_int_eq(r.max_rank_memory_bytes, loom_plan_rank_bytes(x.plan, 0, NULL));
  predicted_free(&x);
}
END_TEST

START_TEST(replay_waits_for_transfers) {
  /* Two stages, one micro-batch: stage 0's forward, the activation's flight, stage 1's forward and backward, the
   * grad's flight, stage 0's backward; then the tied embedding's reduction (both ends leave together) and the
   * slower optimizer step. */
  predicted x;
  predict(&x, "a100-80gb", (loom_plan_spec){.model = GPT, .tp = 1, .pp = 2, .dp = 1, .vpp = 1, .micro_batch = 1,
                                            .global_batch = 1, .precision = LOOM__PRECISION__PRECISION_BF16});
  const loom_sim_costs *c = &x.r.costs;
  ck_assert(c->p2p > 0 && c->tied > 0);
  const double want = c->forward[0] + c->p2p + c->forward[1] + c->backward[1] + c->p2p + c->backward[0] + c->tied +
                      fmax(c->optimizer[0], c->optimizer[1]);
  ck_assert_double_eq_tol(x.r.step_s, want, 1e-12 * want);
  predicted_free(&x);
}
END_TEST

START_TEST(pipeline_bubble_follows_theory) {
  const int m[] = {4, 8, 16};
  for (int i = 0; i < 3; i++) {
    predicted x;
    predict(&x, "a100-80gb", (loom_plan_spec){.model = GPT, .tp = 1, .pp = 4, .dp = 1, .vpp = 1, .micro_batch = 1,
                                              .global_batch = m[i], .precision = LOOM__PRECISION__PRECISION_BF16});
    const double theory = 3.0 / (m[i] + 3.0);
    ck_assert_double_eq_tol(x.r.theory_bubble, theory, 1e-12);
    /* Equal stages (a small vocab keeps the edges light), and transfers that take time: near theory, never below. */
    ck_assert_msg(x.r.bubble >= theory - 0.01 && x.r.bubble <= theory + 0.03, "m %d: bubble %g, theory %g", m[i], x.r.bubble,
                  theory);
    predicted_free(&x);
  }
}
END_TEST

/* A split backward costs as the whole one: W is the weight-grad GEMMs (and
 * the embedding's grads), B the rest. On two stages with one micro-batch
 * under ZB-H1 the last stage's W runs while the grad flies back, so the
 * step is the chain of forwards, B's and transfers, the first stage's W,
 * then the tied reduction and the slower optimizer step. */
START_TEST(zero_bubble_is_costed) {
  predicted x;
  predict(&x, "a100-80gb", (loom_plan_spec){.model = GPT, .tp = 1, .pp = 2, .dp = 1, .vpp = 1, .micro_batch = 1,
                                            .global_batch = 1, .schedule = LOOM_SCHEDULE_ZB_H1,
                                            .precision = LOOM__PRECISION__PRECISION_BF16});
  const loom_sim_costs *c = &x.r.costs;
  for (int i = 0; i < 2; i++) {
    const loom_action b = {.kind = LOOM_ACT_BACKWARD_INPUT, .chunk = 0}, w = {.kind = LOOM_ACT_BACKWARD_WEIGHT, .chunk = 0};
    const double bs = loom_sim_action_seconds(c, i, &b), ws = loom_sim_action_seconds(c, i, &w);
    ck_assert(ws > 0 && bs > ws / 4);
    ck_assert_double_eq_tol(bs + ws, c->backward[i], 1e-12 * c->backward[i]);
  }
  const double b0 = c->backward[0] - c->weight[0], b1 = c->backward[1] - c->weight[1];
  ck_assert(c->weight[1] < c->p2p + b0 + c->weight[0]); /* rank 1's W hides behind the way back */
  const double want = c->forward[0] + c->p2p + c->forward[1] + b1 + c->p2p + b0 + c->weight[0] + c->tied +
                      fmax(c->optimizer[0], c->optimizer[1]);
  ck_assert_double_eq_tol(x.r.step_s, want, 1e-12 * want);
  predicted_free(&x);
}
END_TEST

START_TEST(links_follow_the_rank_order) {
  loom_profile *prof = builtin("a100-80gb");
  loom_sim_costs c;
  /* tp 8 fills a node: tp inside it, dp and pipeline transfers between nodes. */
  loom_plan *plan = plan_of((loom_plan_spec){.model = GPT, .tp = 8, .pp = 2, .dp = 2, .vpp = 1, .micro_batch = 1,
                                             .global_batch = 8, .precision = LOOM__PRECISION__PRECISION_BF16});
  loom_sim_costs_build(plan, prof, &c);
  ck_assert_int_eq(c.tp_link, LOOM_LINK_INTRA);
  ck_assert_int_eq(c.dp_link, LOOM_LINK_INTER);
  ck_assert_int_eq(c.p2p_link, LOOM_LINK_INTER);
  ck_assert(c.tp_bytes[0] > 0 && c.dp_bytes[0] > 0 && c.p2p_bytes[0] > 0);
  ck_assert(c.forward_comm[0] > 0);
  loom_sim_costs_free(&c);
  loom_plan_free(plan);
  /* tp 2 x dp 2 x pp 2 is 8 ranks of one node: everything inside. */
  plan = plan_of((loom_plan_spec){.model = GPT, .tp = 2, .pp = 2, .dp = 2, .vpp = 1, .micro_batch = 1, .global_batch = 8,
                                  .precision = LOOM__PRECISION__PRECISION_BF16});
  loom_sim_costs_build(plan, prof, &c);
  ck_assert_int_eq(c.tp_link + c.dp_link + c.p2p_link, 3 * LOOM_LINK_INTRA);
  loom_sim_costs_free(&c);
  loom_plan_free(plan);
  loom_profile_free(prof);
}
END_TEST

/* Context parallelism's ring against a hand count on GPT's 32 layers at cp
 * 2, tp 1 (no other communication in a layer): a block of keys and values
 * is the rank's 512 rows of 16 heads' k and v in fp32, a hop that block's
 * send-receive between two GPUs of a node. Where communication cannot
 * overlap compute, a layer's forward waits for its cp - 1 hops and its
 * backward for cp - 1 more and the grads' cp; where it can, the forward
 * hides its hops behind the blocks' attention (less, never below 0) and
 * the backward all but the grads' last hop home. The bytes: 3 cp - 2
 * blocks per layer and micro-batch. At cp 16 the ring leaves the node.
 * The all-gather variant waits for its all-gather in each pass and for the
 * grads' reduce-scatter, 3 (cp - 1) blocks. */
START_TEST(ring_is_costed) {
  loom_profile *prof = builtin("h100-sxm");
  ck_assert(prof->comm_overlaps_compute);
  const int cp = 2, layers = GPT.layers;
  loom_plan *plan = plan_of((loom_plan_spec){.model = GPT, .tp = 1, .cp = cp, .pp = 1, .dp = 1, .vpp = 1, .micro_batch = 1,
                                             .global_batch = 1, .precision = LOOM__PRECISION__PRECISION_BF16});
  const double block = GPT.seq / cp * 2.0 * GPT.heads * (GPT.hidden / GPT.heads) * 4.0;
  const double hop = loom_collective_seconds(prof, LOOM_COLL_SENDRECV, block, 2, 2, NULL);
  loom_sim_costs hidden, waited;
  loom_sim_costs_build(plan, prof, &hidden);
  prof->comm_overlaps_compute = false;
  loom_sim_costs_build(plan, prof, &waited);
  ck_assert(hop > 0 && waited.cp_link == LOOM_LINK_INTRA);
  ck_assert_double_eq_tol(waited.forward_comm[0], layers * (cp - 1) * hop, 1e-12);
  ck_assert_double_eq_tol(waited.backward_comm[0], layers * (2 * cp - 1) * hop, 1e-12); /* 2 + 2 (cp - 2) + 1 hops */
  ck_assert(hidden.forward_comm[0] >= 0.0 && hidden.forward_comm[0] < waited.forward_comm[0]);
  ck_assert(hidden.backward_comm[0] >= layers * hop - 1e-12 && hidden.backward_comm[0] < waited.backward_comm[0]);
  ck_assert_double_eq(hidden.cp_bytes[0], layers * (3.0 * cp - 2.0) * block);
  loom_sim_costs_free(&hidden);
  loom_sim_costs_free(&waited);
  loom_plan_free(plan);
  plan = plan_of((loom_plan_spec){.model = GPT, .tp = 1, .cp = cp, .cp_comm = LOOM__CP_COMM_TYPE__CP_COMM_ALL_GATHER, .pp = 1,
                                  .dp = 1, .vpp = 1, .micro_batch = 1, .global_batch = 1,
                                  .precision = LOOM__PRECISION__PRECISION_BF16});
  loom_sim_costs_build(plan, prof, &hidden);
  const double gather = loom_collective_seconds(prof, LOOM_COLL_ALLGATHER, cp * block, cp, cp, NULL);
  const double scatter = loom_collective_seconds(prof, LOOM_COLL_REDUCE_SCATTER, cp * block, cp, cp, NULL);
  ck_assert_double_eq_tol(hidden.forward_comm[0], layers * gather, 1e-12);
  ck_assert_double_eq_tol(hidden.backward_comm[0], layers * (gather + scatter), 1e-12);
  ck_assert_double_eq(hidden.cp_bytes[0], layers * 3.0 * (cp - 1) * block);
  loom_sim_costs_free(&hidden);
  loom_plan_free(plan);
  plan = plan_of((loom_plan_spec){.model = GPT, .tp = 1, .cp = 16, .pp = 1, .dp = 1, .vpp = 1, .micro_batch = 1,
                                  .global_batch = 1, .precision = LOOM__PRECISION__PRECISION_BF16});
  loom_sim_costs_build(plan, prof, &waited);
  ck_assert_int_eq(waited.cp_link, LOOM_LINK_INTER);
  loom_sim_costs_free(&waited);
  loom_plan_free(plan);
  loom_profile_free(prof);
}
END_TEST

/* A collective of c seconds beside compute of g, by hand: what g cannot
 * hide, plus g's slowdown while they share the device (share/(1-share) of
 * the overlapped time). */
static double beside_by_hand(double c, double g, double share) {
  const double hidden = c < g ? c : g;
  return c - hidden + share / (1.0 - share) * hidden;
}

/* The overlaps against a hand count on one layer of GPT (hidden 1024, 16
 * heads, ffn 4096) at tp 2 with SP on an H100 (overlap_sm_share 24/132):
 * --tp-comm-overlap turns each of the layer's four all-gathers and
 * reduce-scatters a pass from c into what its GEMM cannot hide plus the
 * GEMM's slowdown, forward beside qkv, proj, fc1 and fc2, backward beside
 * their backward GEMMs; and --overlap-grad-reduce (loom's default) hides
 * the dp buckets but the last behind backward, slowed alike, where
 * --no-overlap-grad-reduce exposes all of it; under ZeRO-1 the stepped
 * weights' all-gather (the plan's dp_gather_bytes_sent over the node's
 * link) is waited for after the step, or with --overlap-param-gather runs
 * beside the next first forward, its first bucket (one a layer) waited for.
 * A model without the slowdown fails all three; one that runs the
 * overlapped GEMMs whole, as if their exchanges came free of chunking,
 * fails the compute's count. */
START_TEST(overlaps_are_costed) {
  loom_profile *prof = builtin("h100-sxm");
  const double share = prof->overlap_sm_share;
  ck_assert(share > 0.1 && share < 0.2);
  const loom_gpt_config one = {.layers = 1, .hidden = 1024, .heads = 16, .vocab = 1024, .seq = 1024};
  loom_sim_costs c[2];
  for (int o = 0; o < 2; o++) {
    loom_plan *plan = plan_of((loom_plan_spec){.model = one, .tp = 2, .pp = 1, .dp = 1, .vpp = 1, .sequence_parallel = true,
                                               .tp_comm_overlap = o, .micro_batch = 1, .global_batch = 1,
                                               .precision = LOOM__PRECISION__PRECISION_BF16});
    loom_sim_costs_build(plan, prof, &c[o]);
    loom_plan_free(plan);
  }
  const double T = 1024, h = 1024, q = 8 * 64, qkv = 3 * q, f = 2048; /* a rank's: 8 heads, ffn 4096 / 2 */
  const double comm = loom_collective_seconds(prof, LOOM_COLL_ALLGATHER, T * h * 2.0, 2, 2, NULL);
  const double shapes[4][3] = {{T, qkv, h}, {T, h, q}, {T, f, h}, {T, h, f}}; /* qkv, proj, fc1, fc2 */
  /* Overlapped, the GEMMs run in chunks of rows (Transformer Engine's userbuffers): q|k|v's and fc1's forwards in tp
   * (2), the projection's and fc2's in 4; backward, the projection's and fc2's input grads in tp, the rest whole. */
  const double split_f[4] = {2, 4, 2, 4}, split_g[4] = {1, 2, 1, 2};
  const Loom__Precision bf16 = LOOM__PRECISION__PRECISION_BF16;
  double saved_f = 0.0, saved_g = 0.0, chunked_f = 0.0, chunked_g = 0.0;
  for (int i = 0; i < 4; i++) {
    const double m = shapes[i][0], n = shapes[i][1], k = shapes[i][2];
    const double fw = split_f[i] * loom_profile_gemm_seconds(prof, bf16, m / split_f[i], n, k, 1);
    const double bw = split_g[i] * loom_profile_gemm_seconds(prof, bf16, m / split_g[i], k, n, 1) +
                      loom_profile_gemm_seconds(prof, bf16, n, k, m, 1);
    saved_f += comm - beside_by_hand(comm, fw, share), saved_g += comm - beside_by_hand(comm, bw, share);
    chunked_f += fw - loom_profile_gemm_seconds(prof, bf16, m, n, k, 1);
    chunked_g += bw - loom_profile_gemm_seconds(prof, bf16, m, k, n, 1) - loom_profile_gemm_seconds(prof, bf16, n, k, m, 1);
  }
  ck_assert(comm > 0 && saved_f > 0 && saved_g > 0 && chunked_f > 0 && chunked_g > 0);
  ck_assert_double_eq_tol(c[0].forward_comm[0] - c[1].forward_comm[0], saved_f, 1e-12);
  ck_assert_double_eq_tol(c[0].backward_comm[0] - c[1].backward_comm[0], saved_g, 1e-12);
  /* A pass's time is its compute and its exposed communication: the chunks cost compute, the overlap saves comm. */
  ck_assert_double_eq_tol(c[1].forward[0] - c[0].forward[0], chunked_f - saved_f, 1e-12);
  ck_assert_double_eq_tol(c[1].backward[0] - c[0].backward[0], chunked_g - saved_g, 1e-12);
  ck_assert_double_eq_tol(c[1].weight[0], c[0].weight[0], 1e-15); /* the weight grads overlap in bulk, whole */
  ck_assert_double_eq(c[0].tp_bytes[0], c[1].tp_bytes[0]); /* the same bytes, hidden */
  for (int o = 0; o < 2; o++) loom_sim_costs_free(&c[o]);
  /* dp 2 over 32 layers: the buckets (one a layer) but the last beside backward's window, or none. */
  for (int o = 0; o < 2; o++) {
    loom_plan *plan = plan_of((loom_plan_spec){.model = GPT, .tp = 1, .pp = 1, .dp = 2, .vpp = 1, .micro_batch = 1,
                                               .global_batch = 2, .no_grad_reduce_overlap = o,
                                               .precision = LOOM__PRECISION__PRECISION_BF16});
    loom_sim_costs_build(plan, prof, &c[o]);
    loom_plan_free(plan);
  }
  const double dp = c[0].dp[0], last = dp / GPT.layers, window = c[0].backward[0];
  ck_assert(dp > 0 && c[1].dp[0] == dp);
  ck_assert_double_eq_tol(c[0].dp_exposed[0], last + beside_by_hand(dp - last, window, share), 1e-12);
  ck_assert_double_eq(c[1].dp_exposed[0], dp);
  for (int o = 0; o < 2; o++) loom_sim_costs_free(&c[o]);
  double gathered = 0.0;
  for (int o = 0; o < 2; o++) {
    loom_plan *plan = plan_of((loom_plan_spec){.model = GPT, .tp = 1, .pp = 1, .dp = 2, .vpp = 1, .micro_batch = 1,
                                               .global_batch = 2, .zero_stage = 1, .param_gather_overlap = o,
                                               .precision = LOOM__PRECISION__PRECISION_BF16});
    loom_sim_costs_build(plan, prof, &c[o]);
    gathered = (double)plan->estimates->stages[0]->dp_gather_bytes_sent;
    loom_plan_free(plan);
  }
  const double bw = intra_bus(prof, LOOM__COLLECTIVE_KIND__COLLECTIVE_ALL_GATHER);
  const double gather = gathered / bw, forward = c[0].forward[0];
  ck_assert(gathered > 0 && gather < forward);
  const double first = gather / GPT.layers;
  ck_assert_double_eq_tol(c[0].dp_exposed[0] - c[1].dp_exposed[0], gather - first - beside_by_hand(gather - first, forward, share),
                          1e-12);
  for (int o = 0; o < 2; o++) loom_sim_costs_free(&c[o]);
  loom_profile_free(prof);
}
END_TEST

/* --fp8-format against a hand count on one layer of GPT (hidden 1024, ffn
 * 4096, 1024 tokens) on an H100: the four linears' GEMMs, forward, backward
 * and the weight grad's share, at the fp8 entry's rate instead of bf16's;
 * the attention's products and the LM head as they were; and Transformer
 * Engine's casts added: forward the inputs no fused norm writes in fp8 (the
 * projection's and fc2's, 3 bytes an element), backward every linear's
 * output grad (4 bytes an element). A model that runs the attention in fp8
 * too, or drops the casts, fails. */
START_TEST(fp8_is_costed) {
  loom_profile *prof = builtin("h100-sxm");
  const loom_gpt_config one = {.layers = 1, .hidden = 1024, .heads = 16, .vocab = 1024, .seq = 1024};
  loom_sim_costs c[2];
  for (int o = 0; o < 2; o++) {
    loom_plan *plan = plan_of((loom_plan_spec){.model = one, .tp = 1, .pp = 1, .dp = 1, .vpp = 1, .micro_batch = 1,
                                               .global_batch = 1, .precision = LOOM__PRECISION__PRECISION_BF16,
                                               .fp8 = o ? LOOM__FP8_FORMAT__FP8_HYBRID : LOOM__FP8_FORMAT__FP8_NONE});
    loom_sim_costs_build(plan, prof, &c[o]);
    loom_plan_free(plan);
  }
  const double T = 1024, h = 1024, f = 4096;
  const double shapes[4][3] = {{T, 3 * h, h}, {T, h, h}, {T, f, h}, {T, h, f}}; /* qkv, proj, fc1, fc2 */
  const Loom__Precision dt[2] = {LOOM__PRECISION__PRECISION_BF16, LOOM__PRECISION__PRECISION_FP8};
  double fw[2] = {0}, bw[2] = {0};
  for (int i = 0; i < 4; i++)
    for (int o = 0; o < 2; o++) {
      const double m = shapes[i][0], n = shapes[i][1], k = shapes[i][2];
      fw[o] += loom_profile_gemm_seconds(prof, dt[o], m, n, k, 1);
      bw[o] += loom_profile_gemm_seconds(prof, dt[o], m, k, n, 1) + loom_profile_gemm_seconds(prof, dt[o], n, k, m, 1);
    }
  const double cast_f = loom_profile_memory_seconds(prof, 3.0 * T * (h + f));
  const double cast_g = loom_profile_memory_seconds(prof, 4.0 * T * (3 * h + h + f + h));
  ck_assert(fw[1] > 0 && fw[1] < fw[0] && cast_f > 0 && cast_g > 0);
  ck_assert_double_eq_tol(c[0].forward[0] - c[1].forward[0], fw[0] - fw[1] - cast_f, 1e-12);
  ck_assert_double_eq_tol(c[0].backward[0] - c[1].backward[0], bw[0] - bw[1] - cast_g, 1e-12);
  ck_assert_double_eq_tol(c[0].weight[0] - c[1].weight[0], fw[0] - fw[1], 1e-12);
  for (int o = 0; o < 2; o++) loom_sim_costs_free(&c[o]);
  loom_profile_free(prof);
}
END_TEST

/* Each FP8 recipe's casts, on the same layer as above: tensorwise reads
 * every operand once more for its amax (forward and backward dearer than
 * delayed's), blockwise writes the input twice (forward dearer, backward
 * as delayed's), the GEMMs alike; MXFP8 refused on an H100, and costed as
 * blockwise on a profile whose device has it. A sim that prices the
 * recipes alike fails. */
START_TEST(fp8_recipes_are_costed) {
  loom_profile *prof = builtin("h100-sxm");
  const loom_gpt_config one = {.layers = 1, .hidden = 1024, .heads = 16, .vocab = 1024, .seq = 1024};
  loom_sim_costs c[4];
  loom_plan *plans[4];
  for (int r = 0; r < 4; r++) {
    plans[r] = plan_of((loom_plan_spec){.model = one, .tp = 1, .pp = 1, .dp = 1, .vpp = 1, .micro_batch = 1, .global_batch = 1,
                                        .precision = LOOM__PRECISION__PRECISION_BF16, .fp8 = LOOM__FP8_FORMAT__FP8_HYBRID,
                                        .fp8_scaling = {.recipe = (loom_fp8_recipe)r, .history = 1}});
    loom_sim_costs_build(plans[r], prof, &c[r]);
  }
  const int D = LOOM_FP8_RECIPE_DELAYED, TW = LOOM_FP8_RECIPE_TENSORWISE, BW = LOOM_FP8_RECIPE_BLOCKWISE,
            MX = LOOM_FP8_RECIPE_MXFP8;
  ck_assert(c[TW].forward[0] > c[D].forward[0] && c[TW].backward[0] > c[D].backward[0]);
  ck_assert(c[BW].forward[0] > c[D].forward[0]);
  ck_assert_double_eq_tol(c[BW].backward[0], c[D].backward[0], 1e-15);
  for (int r = 0; r < 4; r++) ck_assert_double_eq_tol(c[r].weight[0], c[D].weight[0], 1e-15);
  ck_assert_double_eq_tol(c[MX].forward[0], c[BW].forward[0], 1e-15);
  loom_sim_result res;
  loom_error err = {0};
  ck_assert_int_eq(loom_sim_run(plans[MX], prof, &LOOM_SIM_ASSUME_BALANCED, &res, &err), LOOM_ERR_USAGE);
  ck_assert_str_eq(err.msg, "--fp8-recipe mxfp8: the profile h100-sxm's device has no MXFP8 GEMMs (Blackwell's block-scaled "
                            "tensor cores, device.mxfp8); use --fp8-recipe blockwise or tensorwise, or a profile that gives them");
  prof->device->has_mxfp8 = prof->device->mxfp8 = 1;
  ck_assert_int_eq(loom_sim_run(plans[MX], prof, &LOOM_SIM_ASSUME_BALANCED, &res, &err), LOOM_OK);
  loom_sim_result_free(&res);
  for (int r = 0; r < 4; r++) loom_sim_costs_free(&c[r]), loom_plan_free(plans[r]);
  loom_profile_free(prof);
}
END_TEST

/* A fused attention kernel's efficiency by length: attention_efficiency x
 * keys / (keys + attention_half_seq), the keys being what one kernel's
 * queries meet (the whole sequence, or a ring's block of it under context
 * parallelism). One layer of GPT (16 heads of 64, 1024 tokens, causal) on
 * an H100 against the same profile without the length term: the forward
 * grows by the attention's FLOPs at the flat rate times half / keys, the
 * backward by twice that (their compute: the ring's hops hide behind it),
 * the weight half not at all; at cp 2 the keys are 512. A model that
 * ignores the length, or the ring's blocks, fails. */
START_TEST(attention_follows_its_length) {
  loom_profile *prof = builtin("h100-sxm");
  const Loom__DeviceProfile *d = prof->device;
  ck_assert(d->has_attention_half_seq && d->attention_half_seq > 0);
  const loom_gpt_config one = {.layers = 1, .hidden = 1024, .heads = 16, .vocab = 1024, .seq = 1024};
  for (int cp = 1; cp <= 2; cp++) {
    loom_plan *plan = plan_of((loom_plan_spec){.model = one, .tp = 1, .pp = 1, .dp = 1, .cp = cp, .vpp = 1, .micro_batch = 1,
                                               .global_batch = 1, .precision = LOOM__PRECISION__PRECISION_BF16});
    loom_sim_costs c[2];
    for (int o = 0; o < 2; o++) {
      prof->device->has_attention_half_seq = o == 0;
      loom_sim_costs_build(plan, prof, &c[o]);
    }
    prof->device->has_attention_half_seq = 1;
    const double keys = 1024.0 / cp, flops = 2.0 * 16 * (1024.0 / cp) * 1024 * 64;
    const double flat = flops / (loom_profile_peak_flops(prof, LOOM__PRECISION__PRECISION_BF16) * d->attention_efficiency);
    const double more = flat * d->attention_half_seq / keys;
    ck_assert(more > 0);
    /* compute alone: the ring's hops hide behind the attention, so what of them shows moves too */
    const double f[2] = {c[0].forward[0] - c[0].forward_comm[0], c[1].forward[0] - c[1].forward_comm[0]};
    const double g[2] = {c[0].backward[0] - c[0].backward_comm[0], c[1].backward[0] - c[1].backward_comm[0]};
    ck_assert_double_eq_tol(f[0] - f[1], more, 1e-12);
    ck_assert_double_eq_tol(g[0] - g[1], 2.0 * more, 1e-12);
    ck_assert_double_eq_tol(c[0].weight[0] - c[1].weight[0], 0.0, 1e-15);
    for (int o = 0; o < 2; o++) loom_sim_costs_free(&c[o]);
    loom_plan_free(plan);
  }
  loom_profile_free(prof);
}
END_TEST

/* A hand count of what one MoE layer's expert GEMMs (SwiGLU, hidden and
 * expert ffn 1024, bf16) grow by when each of `experts` local experts
 * takes `to` rows instead of `from`: forward into *fw, backward into *bw. */
static void expert_gemms_grow(const loom_profile *prof, double from, double to, double experts, double *fw, double *bw) {
  const Loom__Precision bf16 = LOOM__PRECISION__PRECISION_BF16;
  *fw = *bw = 0.0;
  for (int o = 0; o < 2; o++) {
    const double r = o ? to : from, sign = o ? 1.0 : -1.0;
    const double shapes[2][3] = {{r, 2048, 1024}, {r, 1024, 1024}}; /* gate|up, down */
    for (int i = 0; i < 2; i++) {
      const double m = shapes[i][0], n = shapes[i][1], k = shapes[i][2];
      *fw += sign * loom_profile_gemm_seconds(prof, bf16, m, n, k, experts);
      *bw += sign * (loom_profile_gemm_seconds(prof, bf16, m, k, n, experts) + loom_profile_gemm_seconds(prof, bf16, n, k, m, experts));
    }
  }
}

/* The experts' load as the sim states it, against a hand count on one MoE
 * layer (hidden 1024, 8 SwiGLU experts of 1024, top 2, 1024 tokens, one
 * rank) on an H100: dropless, each expert's GEMMs over an even share of the
 * 2048 choices (256 rows); with a capacity factor of 1.5, over 1.5 times
 * it (384), the busiest expert at its capacity. Forward, backward and the
 * weight grads each differ by just those GEMMs. A model that ignores the
 * capacity factor fails. */
START_TEST(expert_load_is_costed) {
  loom_profile *prof = builtin("h100-sxm");
  loom_gpt_config moe = {.layers = 1, .hidden = 1024, .heads = 16, .ffn = 1024, .vocab = 1024, .seq = 1024,
                         .mlp = LOOM_MLP_SWIGLU, .no_bias = true, .moe = {.experts = 8, .topk = 2}};
  loom_gpt_config_finish(&moe);
  loom_sim_costs c[2];
  for (int o = 0; o < 2; o++) {
    moe.moe.capacity_factor = o ? 1.5 : 0.0;
    loom_plan *plan = plan_of((loom_plan_spec){.model = moe, .tp = 1, .pp = 1, .dp = 1, .vpp = 1, .micro_batch = 1,
                                               .global_batch = 1, .precision = LOOM__PRECISION__PRECISION_BF16});
    loom_sim_costs_build(plan, prof, &c[o]);
    loom_plan_free(plan);
  }
  double fw, bw;
  expert_gemms_grow(prof, 1024 * 2 / 8, 1.5 * 1024 * 2 / 8, 8, &fw, &bw);
  ck_assert(fw > 0 && bw > 0);
  ck_assert_double_eq_tol(c[1].forward[0] - c[0].forward[0], fw, 1e-12);
  ck_assert_double_eq_tol(c[1].backward[0] - c[0].backward[0], bw, 1e-12);
  ck_assert_double_eq_tol(c[1].weight[0] - c[0].weight[0], fw, 1e-12);
  for (int o = 0; o < 2; o++) loom_sim_costs_free(&c[o]);
  loom_profile_free(prof);
}
END_TEST

/* A dropless run's stated rank imbalance F: the busiest ep rank's experts
 * take F times an even share of the rows, in their GEMMs and in the
 * all-to-alls there and back in each pass. A hand count at ep 2 (one node)
 * gives the forward's, backward's and weight half's growth from F = 1 to
 * 1.5; a model that leaves the all-to-alls even fails. loom_sim_run
 * refuses F over ep, and for a dense model or one with a capacity factor. */
START_TEST(rank_imbalance_is_costed) {
  loom_profile *prof = builtin("h100-sxm");
  loom_gpt_config moe = {.layers = 1, .hidden = 1024, .heads = 16, .ffn = 1024, .vocab = 1024, .seq = 1024,
                         .mlp = LOOM_MLP_SWIGLU, .no_bias = true, .moe = {.experts = 8, .topk = 2}};
  loom_plan *plan = plan_of((loom_plan_spec){.model = moe, .tp = 1, .pp = 1, .dp = 2, .ep = 2, .vpp = 1, .micro_batch = 1,
                                             .global_batch = 2, .precision = LOOM__PRECISION__PRECISION_BF16});
  const double F = 1.5;
  loom_sim_costs c[2];
  for (int o = 0; o < 2; o++) {
    loom_sim_assumptions a = LOOM_SIM_ASSUME_BALANCED;
    a.moe_rank_imbalance = o ? F : 1.0;
    loom_sim_costs_build_assuming(plan, prof, &a, &c[o]);
  }
  double fw, bw;
  expert_gemms_grow(prof, 1024 * 2 / 4, F * 1024 * 2 / 4, 4, &fw, &bw); /* 4 local experts */
  const double bus = prof->intra_node->bandwidth_gbs * prof->intra_node->efficiency * 1e9;
  const double a2a = 2.0 * (F - 1.0) * 1024 * 2 * 1024 * 2.0 / 2.0 / bus; /* there and back, half the rows leave */
  ck_assert(fw > 0 && bw > 0 && a2a > 0);
  ck_assert_double_eq_tol(c[1].forward[0] - c[0].forward[0], fw + a2a, 1e-12);
  ck_assert_double_eq_tol(c[1].backward[0] - c[0].backward[0], bw + a2a, 1e-12);
  ck_assert_double_eq_tol(c[1].weight[0] - c[0].weight[0], fw, 1e-12);
  for (int o = 0; o < 2; o++) loom_sim_costs_free(&c[o]);
  loom_error err = {0};
  loom_sim_result r;
  loom_sim_assumptions a = LOOM_SIM_ASSUME_BALANCED;
  a.moe_rank_imbalance = 2.5;
  ck_assert_int_eq(loom_sim_run(plan, prof, &a, &r, &err), LOOM_ERR_USAGE);
  ck_assert_msg(strstr(err.msg, "at most 2 times") != NULL, "%s", err.msg);
  a.moe_rank_imbalance = 2.0;
  ck_assert_int_eq(loom_sim_run(plan, prof, &a, &r, &err), LOOM_OK);
  loom_sim_result_free(&r);
  loom_plan_free(plan);
  moe.moe.capacity_factor = 1.25;
  plan = plan_of((loom_plan_spec){.model = moe, .tp = 1, .pp = 1, .dp = 2, .ep = 2, .vpp = 1, .micro_batch = 1,
                                  .global_batch = 2, .precision = LOOM__PRECISION__PRECISION_BF16});
  ck_assert_int_eq(loom_sim_check_imbalance(plan, 1.5, &err), LOOM_ERR_USAGE);
  ck_assert_msg(strstr(err.msg, "capacity factor") != NULL, "%s", err.msg);
  loom_plan_free(plan);
  plan = plan_of((loom_plan_spec){.model = GPT, .tp = 1, .pp = 1, .dp = 1, .vpp = 1, .micro_batch = 1, .global_batch = 1});
  ck_assert_int_eq(loom_sim_check_imbalance(plan, 1.5, &err), LOOM_ERR_USAGE);
  ck_assert_msg(strstr(err.msg, "no experts") != NULL, "%s", err.msg);
  ck_assert_int_eq(loom_sim_check_imbalance(plan, 1.0, &err), LOOM_OK);
  ck_assert_int_eq(loom_sim_check_imbalance(plan, 0.5, &err), LOOM_ERR_USAGE);
  loom_plan_free(plan);
  loom_profile_free(prof);
}
END_TEST

/* Under expert parallelism with ZeRO-1 the experts' stepped weights are
 * gathered over their own data-parallel group (the plan's
 * edp_gather_bytes_sent, apart from the rest's dp_gather_bytes_sent), and
 * --overlap-param-gather runs both beside the next forward: a hand count at
 * dp 4, ep 2 (each group inside a node) gives what it saves, the first
 * bucket still waited for. A model that leaves the experts' gather with
 * their grads fails. */
START_TEST(expert_gathers_are_split) {
  loom_profile *prof = builtin("h100-sxm");
  const double share = prof->overlap_sm_share;
  loom_gpt_config moe = {.layers = 4, .hidden = 256, .heads = 4, .ffn = 256, .vocab = 512, .seq = 256,
                         .mlp = LOOM_MLP_SWIGLU, .no_bias = true, .moe = {.experts = 4, .topk = 2}};
  loom_gpt_config_finish(&moe);
  loom_sim_costs c[2];
  double dense = 0.0, experts = 0.0;
  for (int o = 0; o < 2; o++) {
    loom_plan *plan = plan_of((loom_plan_spec){.model = moe, .tp = 1, .pp = 1, .dp = 4, .vpp = 1, .ep = 2, .zero_stage = 1,
                                               .param_gather_overlap = o, .micro_batch = 1, .global_batch = 4,
                                               .precision = LOOM__PRECISION__PRECISION_BF16});
    loom_sim_costs_build(plan, prof, &c[o]);
    dense = (double)plan->estimates->stages[0]->dp_gather_bytes_sent;
    experts = (double)plan->estimates->stages[0]->edp_gather_bytes_sent;
    loom_plan_free(plan);
  }
  const double bw = intra_bus(prof, LOOM__COLLECTIVE_KIND__COLLECTIVE_ALL_GATHER);
  const double gather = (dense + experts) / bw, first = gather / moe.layers, forward = c[0].forward[0];
  ck_assert(dense > 0 && experts > 0 && gather < forward);
  ck_assert_double_eq_tol(c[0].dp_exposed[0] - c[1].dp_exposed[0], gather - first - beside_by_hand(gather - first, forward, share),
                          1e-12);
  for (int o = 0; o < 2; o++) loom_sim_costs_free(&c[o]);
  loom_profile_free(prof);
}
END_TEST

/* The memory-bound bytes a step moves (what `loom bench step`'s roofline
 * holds to the triad): each micro-batch adds the same activation bytes, the
 * rest is AdamW's pass over the rank's state, 28 bytes a parameter in fp32
 * and 30 in bf16 (the bf16 copy written too), and bf16 activations move
 * fewer bytes than fp32 ones. */
static double step_memory_bytes(const loom_profile *prof, int micro_batches, Loom__Precision precision) {
  loom_plan *plan = plan_of((loom_plan_spec){.model = GPT, .tp = 1, .pp = 1, .dp = 1, .vpp = 1, .micro_batch = 2,
                                             .global_batch = 2 * micro_batches, .precision = precision});
  loom_sim_costs c;
  loom_sim_costs_build(plan, prof, &c);
  const double bytes = c.memory_bytes[0];
  loom_sim_costs_free(&c);
  loom_plan_free(plan);
  return bytes;
}

START_TEST(memory_bytes_add_up) {
  loom_profile *prof = builtin("h100-sxm");
  const loom_stage_range whole = {.layer_begin = 0, .layer_end = GPT.layers, .first = true, .last = true};
  loom_gpt_config cfg = GPT;
  loom_gpt_config_finish(&cfg);
  const double params = (double)loom_gpt_param_count(&cfg, &whole, 1);
  const Loom__Precision fp32 = LOOM__PRECISION__PRECISION_FP32, bf16 = LOOM__PRECISION__PRECISION_BF16;
  const double one = step_memory_bytes(prof, 1, fp32), two = step_memory_bytes(prof, 2, fp32);
  const double activations = two - one;
  ck_assert_msg(activations > 0.0, "a micro-batch moves bytes: %g", activations);
  ck_assert_double_eq_tol(one - activations, 28.0 * params, 1e-9 * one);
  const double one16 = step_memory_bytes(prof, 1, bf16), two16 = step_memory_bytes(prof, 2, bf16);
  ck_assert_double_eq_tol(one16 - (two16 - one16), 30.0 * params, 1e-9 * one16);
  ck_assert_msg(two16 - one16 < activations, "bf16 activations move fewer bytes: %g, fp32 %g", two16 - one16, activations);
  loom_profile_free(prof);
}
END_TEST

/* A trace's buffer counters reach, rank by rank and kind by kind, the
 * peaks the schedule's events give (what the memory model sizes), and end
 * with nothing held. */
static void expect_counted_buffers(const char *json, const loom_schedule *s) {
  size_t n;
  char *text = tu_read_bytes(json, &n);
  int most[8][LOOM_BUFFER_KINDS] = {{0}}, last[8] = {0}, counters = 0;
  ck_assert_int_le(s->p, 8);
  for (const char *at = strstr(text, "\"ph\": \"C\""); at; at = strstr(at + 1, "\"ph\": \"C\"")) {
    int tid, held[LOOM_BUFFER_KINDS];
    ck_assert_int_eq(sscanf(at, "\"ph\": \"C\", \"ts\": %*f, \"pid\": 0, \"tid\": %d, \"args\": {\"slots\": %d, "
                                "\"weight_states\": %d, \"sends\": %d}", &tid, &held[0], &held[1], &held[2]), 4);
    ck_assert(tid >= 0 && tid < s->p);
    for (int k = 0; k < LOOM_BUFFER_KINDS; k++) most[tid][k] = held[k] > most[tid][k] ? held[k] : most[tid][k];
    last[tid] = held[0] + held[1] + held[2];
    counters++;
  }
  ck_assert_int_gt(counters, 2 * s->p);
  for (int r = 0; r < s->p; r++) {
    const loom_schedule_peaks peaks = loom_schedule_rank_peaks(s, r, -1);
    ck_assert_int_gt(peaks.live, 0);
    ck_assert_msg(most[r][LOOM_BUFFER_SLOT] == peaks.live && most[r][LOOM_BUFFER_WSTATE] == peaks.deferred &&
                      most[r][LOOM_BUFFER_SEND] == peaks.sends,
                  "rank %d: the trace counts %d slots, %d weight-grad states, %d sends at most; the events %d, %d, %d", r,
                  most[r][0], most[r][1], most[r][2], peaks.live, peaks.deferred, peaks.sends);
    ck_assert_int_eq(last[r], 0);
  }
  free(text);
}

START_TEST(trace_is_drawn) {
  predicted x;
  predict(&x, "h100-sxm", (loom_plan_spec){.model = GPT, .tp = 1, .pp = 2, .dp = 1, .vpp = 2, .micro_batch = 1,
                                           .global_batch = 4, .schedule = LOOM_SCHEDULE_INTERLEAVED,
                                           .precision = LOOM__PRECISION__PRECISION_BF16});
  loom_error err = {0};
  const char *json = tu_tmp_path("sim_trace.json"), *svg = tu_tmp_path("sim_trace.svg");
  ck_assert_int_eq(loom_sim_write_trace(&x.r, json, &err), LOOM_OK);
  ck_assert_msg(loom_trace_svg(json, svg, &err) == LOOM_OK, "%s", err.msg);
  size_t n;
  char *text = tu_read_bytes(svg, &n);
  ck_assert_msg(strstr(text, "interleaved schedule") && strstr(text, "bubble predicted") && strstr(text, ">F3b<"), "%.300s", text);
  free(text);
  text = tu_read_bytes(json, &n);
  ck_assert(strstr(text, "\"bubble_predicted\"") && strstr(text, "optimizer step"));
  free(text);
  expect_counted_buffers(json, &x.r.schedule);
  predicted_free(&x);
  /* ZB-V: weight passes drawn as W, on the V's chunks. */
  predict(&x, "h100-sxm", (loom_plan_spec){.model = GPT, .tp = 1, .pp = 2, .dp = 1, .vpp = 2, .micro_batch = 1,
                                           .global_batch = 4, .schedule = LOOM_SCHEDULE_ZB_V,
                                           .precision = LOOM__PRECISION__PRECISION_BF16});
  ck_assert_int_eq(loom_sim_write_trace(&x.r, json, &err), LOOM_OK);
  text = tu_read_bytes(json, &n);
  ck_assert_msg(strstr(text, "\"name\": \"W3b\", \"cat\": \"weight\"") && strstr(text, "\"schedule\": \"zb_v\""), "%.300s", text);
  free(text);
  ck_assert_msg(loom_trace_svg(json, svg, &err) == LOOM_OK, "%s", err.msg);
  text = tu_read_bytes(svg, &n);
  ck_assert_msg(strstr(text, "zb_v schedule") && strstr(text, "weight grads (W)") && strstr(text, "buffers held (at most"),
                "%.300s", text);
  free(text);
  expect_counted_buffers(json, &x.r.schedule);
  unlink(json);
  unlink(svg);
  predicted_free(&x);
}
END_TEST

/* Memory prunes the search: a grid (or a micro-batch) whose leanest layout is over the device's memory is not
 * enumerated, and pruning loses no layout that fits; a search in which nothing can fit ends at once, saying so
 * (the Mixtral 8x22B with 64 experts, top 8, on 4096 H100s once ran past 139,286 layouts). */
START_TEST(search_prunes_what_cannot_fit) {
  loom_profile *prof = builtin("a100-80gb");
  loom_gpt_config model = {.layers = 32, .hidden = 4096, .heads = 32, .vocab = 51200, .seq = 2048};
  loom_plan *base = plan_of((loom_plan_spec){.model = model, .tp = 1, .pp = 1, .dp = 1, .vpp = 1, .micro_batch = 1,
                                             .global_batch = 64, .precision = LOOM__PRECISION__PRECISION_BF16});
  loom_search_result pruned, all;
  loom_error err = {0};
  ck_assert_int_eq(loom_plan_search(base, 16, prof, &LOOM_SIM_ASSUME_BALANCED, &(loom_search_options){0}, &pruned, &err), LOOM_OK);
  ck_assert_int_eq(loom_plan_search(base, 16, prof, &LOOM_SIM_ASSUME_BALANCED, &(loom_search_options){.exhaustive = true}, &all,
                                    &err), LOOM_OK);
  ck_assert_int_gt(all.fit, 10);
  ck_assert_int_lt(pruned.considered, all.considered); /* something was pruned */
  ck_assert_int_eq(pruned.fit, all.fit);                /* and nothing that fits */
  ck_assert_int_eq(pruned.nranked, all.nranked);
  for (int i = 0; i < all.nranked; i++) ck_assert_double_eq(pruned.ranked[i].step_s, all.ranked[i].step_s);
  loom_search_result_free(&pruned);
  loom_search_result_free(&all);
  loom_plan_free(base);
  loom_profile_free(prof);
  prof = builtin("h100-sxm");
  ck_assert_int_eq(loom_cli_preset("mixtral-8x22b", &model), 0);
  model.layers = 64, model.moe.experts = 64, model.moe.topk = 8;
  loom_gpt_config_finish(&model);
  base = plan_of((loom_plan_spec){.model = model, .tp = 1, .pp = 1, .dp = 1, .vpp = 1, .micro_batch = 1,
                                  .global_batch = 4096, .precision = LOOM__PRECISION__PRECISION_BF16});
  ck_assert_int_eq(loom_plan_search(base, 4096, prof, &LOOM_SIM_ASSUME_BALANCED, &(loom_search_options){0}, &pruned, &err), LOOM_OK);
  ck_assert_int_eq(pruned.fit, 0);
  ck_assert_int_gt(pruned.pruned, 0);
  ck_assert_int_gt(pruned.pruned_least_bytes, prof->device->memory_bytes);
  ck_assert_int_le(pruned.considered, 100); /* layouts it had to evaluate, where it once enumerated 139,286 and more */
  loom_search_result_free(&pruned);
  loom_plan_free(base);
  loom_profile_free(prof);
}
END_TEST

START_TEST(search_ranks_what_fits) {
  loom_profile *prof = builtin("a100-80gb");
  loom_gpt_config model = {.layers = 32, .hidden = 4096, .heads = 32, .vocab = 51200, .seq = 2048}; /* 6.7B: not every layout fits */
  loom_plan *base = plan_of((loom_plan_spec){.model = model, .tp = 1, .pp = 1, .dp = 1, .vpp = 1, .micro_batch = 1,
                                             .global_batch = 64, .precision = LOOM__PRECISION__PRECISION_BF16});
  loom_search_result r;
  loom_error err = {0};
  ck_assert_int_eq(loom_plan_search(base, 16, prof, &LOOM_SIM_ASSUME_BALANCED, &(loom_search_options){0}, &r, &err), LOOM_OK);
  ck_assert_int_gt(r.nranked, 10);
  int dropped = 0; /* every candidate is ranked or dropped for one reason */
  for (int i = 0; i < r.ndropped; i++) dropped += r.dropped[i].count;
  ck_assert_int_eq(r.considered, r.nranked + dropped);
  ck_assert_int_gt(r.nunfit, 0);
  for (int i = 0; i < r.nranked; i++) {
    const loom_candidate *c = &r.ranked[i];
    ck_assert_int_eq(c->tp * c->pp * c->dp, 16);
    ck_assert(c->tp <= 8 && c->memory <= prof->device->memory_bytes);
    if (i) ck_assert(c->tokens_per_s <= r.ranked[i - 1].tokens_per_s);
  }
  for (int i = 0; i < r.nunfit; i++) ck_assert(r.unfit[i].memory > prof->device->memory_bytes);
  /* The zero-bubble schedules are among those tried, never with ZeRO-2/3. */
  int zb_h1 = 0, zb_v = 0;
  for (int i = 0; i < r.nranked; i++) {
    const loom_candidate *c = &r.ranked[i];
    zb_h1 += c->schedule == LOOM_SCHEDULE_ZB_H1, zb_v += c->schedule == LOOM_SCHEDULE_ZB_V;
    if (loom_schedule_kind_splits_backward(c->schedule)) ck_assert_int_le(c->zero, 1);
  }
  ck_assert(zb_h1 > 0 && zb_v > 0);
  /* Partial recompute where a layout fits only with some: the fewest of each stage's first layers that fit. */
  int blocks = 0;
  for (int i = 0; i < r.nranked; i++) {
    loom_candidate c = r.ranked[i];
    if (!c.recompute || !c.recompute_layers) continue;
    blocks++;
    loom_plan *plan;
    ck_assert_int_eq(loom_candidate_plan(base, &c, &plan, &err), LOOM_OK);
    ck_assert(c.recompute_layers < loom_plan_stage_range(plan, 0).layer_end); /* fewer than a stage's layers */
    loom_plan_free(plan);
    c.recompute_layers--, c.recompute = c.recompute_layers > 0; /* one layer fewer: over memory */
    ck_assert_int_eq(loom_candidate_plan(base, &c, &plan, &err), LOOM_OK);
    int64_t most = 0;
    for (int q = 0; q < c.pp; q++) most = loom_plan_rank_bytes(plan, q, NULL) > most ? loom_plan_rank_bytes(plan, q, NULL) : most;
    ck_assert_msg(most > prof->device->memory_bytes, "block %d fits too", c.recompute_layers);
    loom_plan_free(plan);
  }
  ck_assert_int_gt(blocks, 0);
  /* The best candidate's plan, simulated on its own, predicts what the search printed. */
  loom_plan *best;
  ck_assert_int_eq(loom_candidate_plan(base, &r.ranked[0], &best, &err), LOOM_OK);
  char lines[1024];
  ck_assert_msg(loom_plan_check_rules(best, 16, prof->device->memory_bytes, lines, sizeof lines) == 0, "%s", lines);
  loom_sim_result s;
  ck_assert_int_eq(loom_sim_run(best, prof, &LOOM_SIM_ASSUME_BALANCED, &s, &err), LOOM_OK);
  ck_assert_double_eq_tol(s.step_s, r.ranked[0].step_s, 1e-12 * s.step_s);
  loom_sim_result_free(&s);
  loom_plan_free(best);
  loom_search_result_free(&r);
  loom_plan_free(base);
  loom_profile_free(prof);
}
END_TEST

/* Plan search tries context parallelism for long sequences: at 32K on 16
 * H100s a 7B model's fastest layouts include sequence splits (cp 2 or
 * more, each rank keeping at least LOOM_SEARCH_CP_MIN_ROWS rows; tp 2 x cp
 * 2 within 0.5% of the best, tp 4), and every layout it tries keeps tp x
 * cp x dp x pp = 16; at 2048 it tries none. */
START_TEST(search_tries_context_parallelism) {
  loom_profile *prof = builtin("h100-sxm");
  const loom_gpt_config model = {.layers = 32, .hidden = 4096, .heads = 32, .vocab = 32000, .seq = 32768};
  loom_search_result r;
  loom_error err = {0};
  for (int seq = 2048; seq <= 32768; seq *= 16) {
    loom_plan *base = plan_of((loom_plan_spec){.model = model, .train_seq = seq, .tp = 1, .pp = 1, .dp = 1, .vpp = 1,
                                               .micro_batch = 1, .global_batch = 16,
                                               .precision = LOOM__PRECISION__PRECISION_BF16});
    ck_assert_int_eq(loom_plan_search(base, 16, prof, &LOOM_SIM_ASSUME_BALANCED, &(loom_search_options){.keep = 8}, &r, &err), LOOM_OK);
    int split = 0;
    for (int i = 0; i < r.nranked; i++) {
      const loom_candidate *c = &r.ranked[i];
      ck_assert_int_eq(c->tp * (c->cp > 1 ? c->cp : 1) * c->dp * c->pp, 16);
      if (c->cp <= 1) continue;
      split++;
      ck_assert_int_ge(seq / c->cp, LOOM_SEARCH_CP_MIN_ROWS);
    }
    if (seq == 2048) ck_assert_int_eq(split, 0);
    else ck_assert(r.nranked > 0 && split > 0);
    loom_search_result_free(&r);
    loom_plan_free(base);
  }
  loom_profile_free(prof);
}
END_TEST

/* --no-overlap-p2p-communication: each sender waits for its message to
 * cross. At pp 2 with two micro-batches of 1F1B the last backward waits on
 * a chain that holds one more of those waits than the overlapped run's
 * (rank 0's second send, then rank 1's last grad after its first one), so
 * the compute ends exactly one crossing later; a replay that ignores the
 * sender's wait fails. The bound stays a bound. */
START_TEST(p2p_waits_are_costed) {
  double end[2], crossing = 0.0;
  for (int o = 0; o < 2; o++) {
    predicted x;
    predict(&x, "a100-80gb", (loom_plan_spec){.model = GPT, .tp = 1, .pp = 2, .dp = 1, .vpp = 1, .micro_batch = 1,
                                              .global_batch = 2, .no_p2p_overlap = o == 1});
    ck_assert(x.r.costs.p2p_waited == (o == 1));
    end[o] = x.r.replay.compute_end, crossing = x.r.costs.p2p;
    ck_assert(loom_sim_step_lower_bound(&x.r.costs, false) <= x.r.step_s);
    predicted_free(&x);
  }
  ck_assert(crossing > 0.0);
  ck_assert_double_eq_tol(end[1] - end[0], crossing, 1e-12);
}
END_TEST

/* The bound plan search prunes with never exceeds the replay, for every
 * schedule kind, with and without recompute, and the 1F1B bound is close
 * (its only slack is idling the replay finds and the bound cannot). */
START_TEST(step_lower_bound_holds) {
  loom_profile *prof = builtin("a100-80gb");
  const struct {
    loom_schedule_kind kind;
    int vpp;
  } kinds[] = {{LOOM_SCHEDULE_1F1B, 1}, {LOOM_SCHEDULE_GPIPE, 1}, {LOOM_SCHEDULE_ZB_H1, 1},
               {LOOM_SCHEDULE_INTERLEAVED, 2}, {LOOM_SCHEDULE_ZB_V, 2}};
  int checked = 0;
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
    for (int pp = 2; pp <= 4; pp *= 2)
      for (int m = pp; m <= 4 * pp; m += pp)
        for (int rc = 0; rc < 2; rc++) {
          loom_plan *plan = plan_of((loom_plan_spec){.model = GPT, .tp = 2, .pp = pp, .dp = 2, .vpp = kinds[k].vpp,
                                                     .micro_batch = 2, .global_batch = 2 * 2 * m, .recompute = rc,
                                                     .schedule = kinds[k].kind, .precision = LOOM__PRECISION__PRECISION_BF16});
          loom_sim_result r;
          loom_error err = {0};
          ck_assert_msg(loom_sim_run(plan, prof, &LOOM_SIM_ASSUME_BALANCED, &r, &err) == LOOM_OK, "%s", err.msg);
          const double bound = loom_sim_step_lower_bound(&r.costs, loom_schedule_kind_splits_backward(kinds[k].kind));
          ck_assert_msg(bound > 0.0 && bound <= r.step_s * (1.0 + 1e-12), "%s pp %d m %d recompute %d: bound %.6g over the replay's %.6g",
                        loom_schedule_kind_name(kinds[k].kind), pp, m, rc, bound, r.step_s);
          if (kinds[k].kind == LOOM_SCHEDULE_1F1B)
            ck_assert_msg(bound >= 0.95 * r.step_s, "1F1B pp %d m %d: bound %.6g, replay %.6g", pp, m, bound, r.step_s);
          checked++;
          loom_sim_result_free(&r);
          loom_plan_free(plan);
        }
  ck_assert_int_eq(checked, 5 * 2 * 4 * 2);
  loom_profile_free(prof);
}
END_TEST

/* Recompute costs each recomputed layer's forward once more in backward:
 * with each stage's first N layers recomputed (Megatron's block method),
 * N of full recompute's L extra forwards, stage by stage; forward costs and
 * the weight halves stay as they are. */
START_TEST(partial_recompute_is_costed) {
  loom_profile *prof = builtin("h100-sxm");
  const loom_plan_spec base = {.model = GPT, .tp = 2, .pp = 4, .dp = 1, .vpp = 1, .micro_batch = 1, .global_batch = 8,
                               .schedule = LOOM_SCHEDULE_1F1B, .precision = LOOM__PRECISION__PRECISION_BF16};
  loom_sim_costs c[3];
  const int redo[3] = {0, 3, LOOM_RECOMPUTE_ALL};
  for (int i = 0; i < 3; i++) {
    loom_plan_spec spec = base;
    spec.recompute = redo[i] > 0;
    spec.recompute_layers = redo[i] == LOOM_RECOMPUTE_ALL ? 0 : redo[i];
    loom_plan *plan = plan_of(spec);
    loom_sim_costs_build(plan, prof, &c[i]);
    loom_plan_free(plan);
  }
  const double L = GPT.layers / 4.0; /* 8 layers a stage */
  for (int q = 0; q < 4; q++) {
    const double full_extra = c[2].backward[q] - c[0].backward[q], block_extra = c[1].backward[q] - c[0].backward[q];
    ck_assert_msg(full_extra > 0.0 && fabs(block_extra - 3.0 / L * full_extra) <= 1e-9 * full_extra,
                  "stage %d: block 3 adds %.6g s, full %.6g s", q, block_extra, full_extra);
    ck_assert(c[1].forward[q] == c[0].forward[q] && c[2].forward[q] == c[0].forward[q]);
  }
  for (int i = 0; i < 3; i++) loom_sim_costs_free(&c[i]);
  loom_profile_free(prof);
}
END_TEST

/* Searching with keep leaves out only what cannot matter: the same top rows
 * as predicting every layout, and every layout on the memory-throughput
 * frontier (none faster with no more memory) still predicted. */
START_TEST(search_bounds_only_what_cannot_matter) {
  loom_profile *prof = builtin("a100-80gb");
  loom_gpt_config model = {.layers = 32, .hidden = 4096, .heads = 32, .vocab = 51200, .seq = 2048};
  loom_plan *base = plan_of((loom_plan_spec){.model = model, .tp = 1, .pp = 1, .dp = 1, .vpp = 1, .micro_batch = 1,
                                             .global_batch = 64, .precision = LOOM__PRECISION__PRECISION_BF16});
  loom_search_result all, kept;
  loom_error err = {0};
  ck_assert_int_eq(loom_plan_search(base, 16, prof, &LOOM_SIM_ASSUME_BALANCED, &(loom_search_options){0}, &all, &err), LOOM_OK);
  ck_assert_int_eq(loom_plan_search(base, 16, prof, &LOOM_SIM_ASSUME_BALANCED, &(loom_search_options){.keep = 5}, &kept, &err), LOOM_OK);
  ck_assert_int_eq(all.bounded, 0);
  ck_assert_int_eq(all.nranked, all.fit);
  ck_assert_int_gt(kept.bounded, all.fit / 2); /* the bound does its work */
  ck_assert_int_eq(kept.fit, all.fit);
  ck_assert_int_eq(kept.nranked + kept.bounded, kept.fit);
  for (int i = 0; i < 5; i++) {
    ck_assert_int_eq(kept.ranked[i].order, all.ranked[i].order);
    ck_assert_double_eq(kept.ranked[i].step_s, all.ranked[i].step_s);
  }
  int frontier = 0;
  for (int i = 0; i < all.nranked; i++) {
    const loom_candidate *c = &all.ranked[i];
    bool beaten = false;
    for (int j = 0; j < all.nranked && !beaten; j++)
      beaten = all.ranked[j].step_s < c->step_s && all.ranked[j].memory <= c->memory;
    if (beaten) continue;
    frontier++;
    bool found = false;
    for (int j = 0; j < kept.nranked && !found; j++) found = kept.ranked[j].order == c->order;
    ck_assert_msg(found, "frontier layout tp %d pp %d dp %d vpp %d micro %d zero %d was not predicted", c->tp, c->pp, c->dp,
                  c->vpp, c->micro_batch, c->zero);
  }
  ck_assert_int_gt(frontier, 1);
  loom_search_result_free(&all);
  loom_search_result_free(&kept);
  loom_plan_free(base);
  loom_profile_free(prof);
}
END_TEST

START_TEST(mpi_tags_bound_micro_batches_per_chunk) {
  /* SC21's trillion-parameter row: 512 micro-batches through 64 stages fit the tags (512 x 1 x 2). */
  loom_plan *ok = plan_of((loom_plan_spec){.model = {.layers = 64, .hidden = 64, .heads = 4, .vocab = 256, .seq = 16},
                                           .tp = 1, .pp = 64, .dp = 1, .vpp = 1, .micro_batch = 1, .global_batch = 512});
  loom_plan_free(ok);
  loom_plan_spec spec = {.model = {.layers = 4, .hidden = 64, .heads = 4, .vocab = 256, .seq = 16}, .tp = 1, .pp = 2, .dp = 1,
                         .vpp = 2, .micro_batch = 1, .global_batch = 8192, .schedule = LOOM_SCHEDULE_INTERLEAVED};
  loom_gpt_config_finish(&spec.model);
  loom_plan *p = NULL;
  loom_error err = {0};
  ck_assert_int_eq(loom_plan_build(&spec, &p, &err), LOOM_OK);
  char lines[2048];
  ck_assert_int_gt(loom_plan_check_rules(p, 0, 0, lines, sizeof lines), 0);
  ck_assert_msg(strstr(lines, "8192 micro-batches x 2 chunks per rank is too many for MPI tags"), "%s", lines);
  loom_plan_free(p);
}
END_TEST

/* Goodput against the closed forms and the failure process simulated: a save stall of 20 s, a restart of 10 min and
 * a job MTBF of 8 h, steps of 5 s. */
START_TEST(goodput_optimum_is_dalys) {
  const loom_goodput_model m = {.step_s = 5, .mtbf_s = 8 * 3600, .relaunch_s = 540, .save_stall_s = 20, .restore_s = 60};
  loom_goodput_prediction g;
  loom_error err = {0};
  ck_assert_int_eq(loom_goodput_predict(&m, 20000, &g, &err), LOOM_OK);
  const loom_goodput_level *p = &g.persistent;
  const double d = m.save_stall_s, M = m.mtbf_s;
  /* Daly's higher-order estimate of the optimum (2006, eq. 37), for delta < 2M: within 0.5% of the exact optimum. */
  const double daly2 = sqrt(2 * d * M) * (1 + sqrt(d / (2 * M)) / 3 + d / (18 * M)) - d;
  ck_assert_msg(fabs(p->optimum_s - daly2) < 5e-3 * daly2, "optimum %g s, Daly's estimate %g s", p->optimum_s, daly2);
  ck_assert_msg(fabs(p->young_s - sqrt(2 * d * M)) < 1e-9 * p->young_s && fabs(p->optimum_s - p->young_s) < 0.03 * p->young_s,
                "Young %g s against the optimum %g s", p->young_s, p->optimum_s);
  ck_assert_msg(fabs((double)p->interval_steps * m.step_s - p->optimum_s) <= m.step_s, "%lld steps of %g s for %g s",
                (long long)p->interval_steps, m.step_s, p->optimum_s);
  /* At the optimum the expectation is a maximum: a tenth either side is worse. */
  const double R = m.restore_s + m.relaunch_s, tau = (double)p->interval_steps * m.step_s;
  ck_assert(loom_goodput_daly(tau, d, R, M) > loom_goodput_daly(0.9 * tau, d, R, M));
  ck_assert(loom_goodput_daly(tau, d, R, M) > loom_goodput_daly(1.1 * tau, d, R, M));
  /* The failure process, simulated, agrees with Daly's expectation within three standard errors and 0.1%. */
  ck_assert_msg(p->simulated_se > 0 && p->simulated_se < 2e-3, "standard error %g", p->simulated_se);
  ck_assert_msg(fabs(p->simulated - p->goodput) < 3 * p->simulated_se + 1e-3, "simulated %g, Daly %g (se %g)", p->simulated,
                p->goodput, p->simulated_se);
  /* A slower failure rate, a higher goodput and a longer interval. */
  loom_goodput_model rarer = m;
  rarer.mtbf_s *= 4;
  loom_goodput_prediction h;
  ck_assert_int_eq(loom_goodput_predict(&rarer, 2000, &h, &err), LOOM_OK);
  ck_assert(h.persistent.goodput > p->goodput && h.persistent.interval_steps > p->interval_steps);
}
END_TEST

/* Two levels: in-memory saves (stall 2 s, restore 5 s) between persistent ones (stall 60 s: a slow store), 5% of
 * failures beyond the replicas. The first-order expectation against the simulated process, and the gain. */
START_TEST(goodput_in_memory_pays) {
  const loom_goodput_model m = {.step_s = 5, .mtbf_s = 4 * 3600, .relaunch_s = 120, .save_stall_s = 60, .restore_s = 300,
                                .local_stall_s = 2, .local_restore_s = 5, .unrecoverable = 0.05};
  loom_goodput_prediction g;
  loom_error err = {0};
  ck_assert_int_eq(loom_goodput_predict(&m, 20000, &g, &err), LOOM_OK);
  ck_assert_msg(g.persistent_every > 1 && g.local_steps < g.persistent.interval_steps, "in memory every %lld, persistent "
                "every %lld of them; persistent alone every %lld", (long long)g.local_steps, (long long)g.persistent_every,
                (long long)g.persistent.interval_steps);
  ck_assert_msg(g.local_goodput > g.persistent.goodput + 0.01, "in memory %g, persistent alone %g", g.local_goodput,
                g.persistent.goodput);
  /* First order: within 0.5% of the simulated process (its second-order terms, (tau / M)^2, are that small here). */
  ck_assert_msg(fabs(g.local_simulated - g.local_goodput) < 3 * g.local_simulated_se + 5e-3, "simulated %g, expected %g (se %g)",
                g.local_simulated, g.local_goodput, g.local_simulated_se);
  /* With every failure beyond the replicas and every save persistent, the two levels are Daly's one, to first order. */
  loom_goodput_model one = m;
  one.unrecoverable = 1, one.local_stall_s = m.save_stall_s;
  const double tau = (double)g.persistent.interval_steps * m.step_s;
  ck_assert(fabs(loom_goodput_two_level(&one, tau, 1) - loom_goodput_daly(tau, m.save_stall_s, m.restore_s + m.relaunch_s,
                                                                              m.mtbf_s)) < 5e-3);
  loom_goodput_model bad = m;
  bad.unrecoverable = 2;
  ck_assert_int_eq(loom_goodput_predict(&bad, 100, &g, &err), LOOM_ERR_USAGE);
}
END_TEST

int main(void) {
  Suite *s = suite_create("sim");
  TCase *tc = tcase_create("sim");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, builtin_profiles_load);
  tcase_add_test(tc, profiles_refuse_bad_figures);
  tcase_add_test(tc, collectives_follow_ring_formulas);
  tcase_add_test(tc, replay_adds_up_one_rank);
  tcase_add_test(tc, replay_waits_for_transfers);
  tcase_add_test(tc, pipeline_bubble_follows_theory);
  tcase_add_test(tc, links_follow_the_rank_order);
  tcase_add_test(tc, ring_is_costed);
  tcase_add_test(tc, search_tries_context_parallelism);
  tcase_add_test(tc, overlaps_are_costed);
  tcase_add_test(tc, fp8_is_costed);
  tcase_add_test(tc, fp8_recipes_are_costed);
  tcase_add_test(tc, attention_follows_its_length);
  tcase_add_test(tc, expert_load_is_costed);
  tcase_add_test(tc, rank_imbalance_is_costed);
  tcase_add_test(tc, expert_gathers_are_split);
  tcase_add_test(tc, memory_bytes_add_up);
  tcase_add_test(tc, trace_is_drawn);
  tcase_add_test(tc, zero_bubble_is_costed);
  tcase_add_test(tc, search_ranks_what_fits);
  tcase_add_test(tc, search_prunes_what_cannot_fit);
  tcase_add_test(tc, step_lower_bound_holds);
  tcase_add_test(tc, p2p_waits_are_costed);
  tcase_add_test(tc, partial_recompute_is_costed);
  tcase_add_test(tc, search_bounds_only_what_cannot_matter);
  tcase_add_test(tc, mpi_tags_bound_micro_batches_per_chunk);
  tcase_add_test(tc, curves_fit_their_measurements);
  tcase_add_test(tc, profiles_read_their_sources);
  tcase_add_test(tc, curves_refuse_bad_measurements);
  suite_add_tcase(s, tc);
  TCase *failures = tcase_create("goodput");
  tcase_set_timeout(failures, 120);
  tcase_add_test(failures, goodput_optimum_is_dalys);
  tcase_add_test(failures, goodput_in_memory_pays);
  suite_add_tcase(s, failures);
  return tu_run(s);
}
