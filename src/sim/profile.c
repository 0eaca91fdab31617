/* Cluster profiles: loading, checking, and the device's cost functions. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/read_file.h"
#include "plan/plan.h"
#include "plan/plan_io.h"
#include "plan/textformat.h"
#include "sim/cost.h"
#include "sim/profile.h"
#include "sim/profile_builtin.h"

#define MAX_PROFILE_BYTES (1 << 20)
/* The least rate (TFLOP/s, GB/s) and efficiency a profile may give: below
 * them a prediction would be days per step, not a figure of a real machine. */
#define MIN_RATE 1e-6
#define MIN_EFFICIENCY 1e-3
/* The largest half the fits try. */
#define MAX_HALF_DIM 8192
/* How much worse than the least (an RMS log error, ~1%) a fit with smaller halves may be and still win. */
#define FIT_SLACK 0.01

const char *loom_profile_builtin_names(void) {
  static char names[512];
  if (!names[0])
    for (int i = 0; i < LOOM_BUILTIN_PROFILE_COUNT; i++)
      snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", LOOM_BUILTIN_PROFILES[i].name);
  return names;
}

/* One figure against its range: "h100.txtpb: device.peak_tflops_bf16 = -1 must be > 0". */
static loom_status check_range(const char *what, const char *field, int has, double v, double lo, double hi,
                               loom_error *err) {
  if (!has) return loom_fail(err, LOOM_ERR_FORMAT, "%s: %s is missing; every profile gives it", what, field);
  if (!isfinite(v) || v < lo || v > hi)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: %s = %g must be >= %g and at most %g", what, field, v, lo, hi);
  return LOOM_OK;
}

#define CHECK(field, has, value, lo, hi)                                                  \
  do {                                                                                   \
    const loom_status st_ = check_range(what, field, has, (double)(value), lo, hi, err); \
    if (st_ != LOOM_OK) return st_;                                                      \
  } while (0)

static loom_status check_link(const char *what, const char *name, const Loom__Link *l, loom_error *err) {
  char field[64];
  if (!l) return loom_fail(err, LOOM_ERR_FORMAT, "%s: %s is missing; every profile gives both links", what, name);
  snprintf(field, sizeof field, "%s.bandwidth_gbs", name);
  CHECK(field, l->has_bandwidth_gbs, l->bandwidth_gbs, MIN_RATE, 1e6);
  snprintf(field, sizeof field, "%s.latency_us", name);
  CHECK(field, l->has_latency_us, l->latency_us, 0.0, 1e6);
  snprintf(field, sizeof field, "%s.efficiency", name);
  CHECK(field, l->has_efficiency, l->efficiency, MIN_EFFICIENCY, 1.0);
  return LOOM_OK;
}

static const Loom__GemmEfficiency *gemm_of(const Loom__DeviceProfile *d, Loom__Precision precision) {
  for (size_t i = 0; i < d->n_gemm; i++)
    if (d->gemm[i]->dtype == precision) return d->gemm[i];
  return NULL;
}

/* Names are printed in reports and JSON: printable ASCII, no quotes or backslashes. */
static loom_status check_name(const char *what, const char *field, const char *name, loom_error *err) {
  for (const char *c = name; c && *c; c++)
    if (*c < 0x20 || *c > 0x7e || *c == '"' || *c == '\\')
      return loom_fail(err, LOOM_ERR_FORMAT, "%s: %s may hold printable ASCII only, without quotes or backslashes", what, field);
  return LOOM_OK;
}

static const char *precision_name(Loom__Precision precision) {
  const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(&loom__precision__descriptor, precision);
  return v ? v->name : "?";
}

/* A dtype's dense peak in TFLOP/s (fp32: TF32's when the device runs fp32 GEMMs on it). */
static double peak_tflops(const Loom__DeviceProfile *d, Loom__Precision precision) {
  if (precision == LOOM__PRECISION__PRECISION_BF16) return d->peak_tflops_bf16;
  if (precision == LOOM__PRECISION__PRECISION_FP8) return d->peak_tflops_fp8;
  return d->fp32_uses_tf32 ? d->peak_tflops_tf32 : d->peak_tflops_fp32;
}

/* A GEMM's share of its dtype's peak by an entry's curve. */
static double gemm_curve(const Loom__GemmEfficiency *g, double m, double n, double k) {
  const double h = g->half_dim, hk = g->has_half_k ? g->half_k : h;
  return g->max_efficiency * (m / (m + h)) * (n / (n + h)) * (k / (k + hk));
}

/* The halves the fits try: 0, then 16 by steps of 10% up to MAX_HALF_DIM. */
enum { FIT_HALVES = 80 };
static double fit_half(int i) {
  double h = i ? 16.0 : 0.0;
  for (int k = 1; k < i; k++) h = fmin(h * 1.1, MAX_HALF_DIM);
  return h;
}

/* Least squares in log of measured = scale x shape: the log residuals r[n] (log(measured / peak / shape)) give the
 * scale's log, their mean, in *mean, and the squared error; INFINITY where the scale would pass the peak. */
static double log_fit(const double *r, size_t n, double *mean) {
  double m = 0.0, sq = 0.0;
  for (size_t i = 0; i < n; i++) m += r[i] / (double)n;
  for (size_t i = 0; i < n; i++) sq += (r[i] - m) * (r[i] - m);
  *mean = m;
  return m <= 0.0 ? sq : INFINITY;
}

/* How much worse than the least squared error a fit with smaller halves may be and still win: FIT_SLACK of RMS. */
static double fit_slack(double best, size_t n) { return best + FIT_SLACK * FIT_SLACK * (double)n; }

/* A GEMM entry's fit at halves a (output) and b (contracted) of the grid: its squared log error, *mean its scale. */
static double gemm_fit_error(const Loom__GemmEfficiency *g, double peak, int a, int b, double *mean) {
  double r[LOOM_PROFILE_MAX_MEASUREMENTS];
  Loom__GemmEfficiency trial = *g;
  trial.has_half_k = 1, trial.max_efficiency = 1.0, trial.half_dim = fit_half(a), trial.half_k = fit_half(b);
  for (size_t i = 0; i < g->n_measured; i++) {
    const Loom__GemmMeasurement *x = g->measured[i];
    r[i] = log(x->tflops / peak / gemm_curve(&trial, x->m, x->n, x->k));
  }
  return log_fit(r, g->n_measured, mean);
}

/* A GEMM entry's constants from its measurements. For each (half_dim,
 * half_k) on the grid the max_efficiency of least squared log error has a
 * closed form, exp(mean(log(efficiency / shape))). Of the triples whose
 * max_efficiency is at most 1, the one with the smallest halves (by their
 * grid steps together) whose error is within FIT_SLACK of the least wins:
 * few or only large measurements cannot tell the halves apart, and then
 * they stay as small as the data allows. */
static loom_status fit_gemm(const char *what, const Loom__DeviceProfile *d, Loom__GemmEfficiency *g, loom_error *err) {
  const char *dtype = precision_name(g->dtype);
  if (g->has_max_efficiency || g->has_half_dim || g->has_half_k)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: device.gemm %s gives measurements and constants; give one or the other "
                     "(the constants are fitted to the measurements)", what, dtype);
  if (g->n_measured > LOOM_PROFILE_MAX_MEASUREMENTS)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: device.gemm %s holds %zu measurements, more than %d", what, dtype,
                     g->n_measured, LOOM_PROFILE_MAX_MEASUREMENTS);
  const double peak = peak_tflops(d, g->dtype);
  for (size_t i = 0; i < g->n_measured; i++) {
    const Loom__GemmMeasurement *x = g->measured[i];
    CHECK("device.gemm.measured.m", x->has_m, x->m, 1.0, 1e7);
    CHECK("device.gemm.measured.n", x->has_n, x->n, 1.0, 1e7);
    CHECK("device.gemm.measured.k", x->has_k, x->k, 1.0, 1e7);
    CHECK("device.gemm.measured.tflops", x->has_tflops, x->tflops, MIN_RATE, peak);
  }
  /* The least error's halves (at 0 and 0 the scale is at most 1: every measurement is under the peak), then any with
   * fewer grid steps together within the slack. */
  double best = INFINITY, mean;
  int ca = 0, cb = 0;
  for (int a = 0; a < FIT_HALVES; a++)
    for (int b = 0; b < FIT_HALVES; b++) {
      const double e = gemm_fit_error(g, peak, a, b, &mean);
      if (e < best) best = e, ca = a, cb = b;
    }
  const double slack = fit_slack(best, g->n_measured);
  for (int steps = 0; steps < ca + cb; steps++)
    for (int a = steps < FIT_HALVES ? steps : FIT_HALVES - 1; a >= 0 && steps - a < FIT_HALVES && steps < ca + cb; a--)
      if (gemm_fit_error(g, peak, a, steps - a, &mean) <= slack) ca = a, cb = steps - a;
  gemm_fit_error(g, peak, ca, cb, &mean);
  g->max_efficiency = exp(mean), g->half_dim = fit_half(ca), g->half_k = fit_half(cb);
  g->has_max_efficiency = g->has_half_dim = g->has_half_k = 1;
  return LOOM_OK;
}

double loom_profile_attention_rate(const Loom__AttentionMeasurement *x) {
  return 3.0 / (1.0 / x->forward_tflops + 2.0 / x->backward_tflops);
}

/* A fused attention's fit at half a of the grid: its squared log error, *mean its scale. */
static double attention_fit_error(const Loom__DeviceProfile *d, int a, double *mean) {
  double r[LOOM_PROFILE_MAX_MEASUREMENTS];
  const double half = fit_half(a);
  for (size_t i = 0; i < d->n_attention_measured; i++) {
    const Loom__AttentionMeasurement *x = d->attention_measured[i];
    r[i] = log(loom_profile_attention_rate(x) / d->peak_tflops_bf16 * (x->seq + half) / x->seq);
  }
  return log_fit(r, d->n_attention_measured, mean);
}

/* A fused attention's constants from its measurements: each one's rate over a step's passes, as a share of the bf16
 * peak, fitted to attention_efficiency x s / (s + attention_half_seq) as the GEMMs are (the smallest half within
 * FIT_SLACK of the least error). */
static loom_status fit_attention(const char *what, Loom__DeviceProfile *d, loom_error *err) {
  if (d->has_attention_efficiency || d->has_attention_half_seq)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: device.attention_measured and device.attention_efficiency or "
                     "attention_half_seq: give one or the other (the constants are fitted to the measurements)", what);
  if (d->n_attention_measured > LOOM_PROFILE_MAX_MEASUREMENTS)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: device.attention_measured holds %zu measurements, more than %d", what,
                     d->n_attention_measured, LOOM_PROFILE_MAX_MEASUREMENTS);
  const double peak = d->peak_tflops_bf16;
  for (size_t i = 0; i < d->n_attention_measured; i++) {
    const Loom__AttentionMeasurement *x = d->attention_measured[i];
    CHECK("device.attention_measured.seq", x->has_seq, x->seq, 1.0, 1e8);
    CHECK("device.attention_measured.head_dim", x->has_head_dim, x->head_dim, 1.0, 4096.0);
    CHECK("device.attention_measured.forward_tflops", x->has_forward_tflops, x->forward_tflops, MIN_RATE, peak);
    CHECK("device.attention_measured.backward_tflops", x->has_backward_tflops, x->backward_tflops, MIN_RATE, peak);
  }
  double best = INFINITY, mean;
  int chosen = 0;
  for (int a = 0; a < FIT_HALVES; a++) {
    const double e = attention_fit_error(d, a, &mean);
    if (e < best) best = e, chosen = a;
  }
  const double slack = fit_slack(best, d->n_attention_measured);
  for (int a = 0; a < chosen; a++)
    if (attention_fit_error(d, a, &mean) <= slack) chosen = a;
  attention_fit_error(d, chosen, &mean);
  d->attention_efficiency = exp(mean), d->attention_half_seq = fit_half(chosen);
  d->has_attention_efficiency = d->has_attention_half_seq = 1;
  return LOOM_OK;
}

_Static_assert((int)LOOM__COLLECTIVE_KIND__COLLECTIVE_ALL_REDUCE == (int)LOOM_COLL_ALLREDUCE &&
                   (int)LOOM__COLLECTIVE_KIND__COLLECTIVE_ALL_GATHER == (int)LOOM_COLL_ALLGATHER &&
                   (int)LOOM__COLLECTIVE_KIND__COLLECTIVE_REDUCE_SCATTER == (int)LOOM_COLL_REDUCE_SCATTER &&
                   (int)LOOM__COLLECTIVE_KIND__COLLECTIVE_SEND_RECV == (int)LOOM_COLL_SENDRECV,
               "proto CollectiveKind follows loom_collective");

/* A collective curve's constants from nccl-tests measurements: the time of
 * each, factor x bytes / busbw, is latency steps x latency + factor x bytes
 * / (bus bandwidth per device x the node's members between nodes); the two
 * are the least squares of the relative time error. */
static loom_status fit_collective(const char *what, const char *link, bool between_nodes, Loom__CollectiveCurve *c,
                                  loom_error *err) {
  char field[96];
  if (c->has_bus_gbs || c->has_latency_us)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: %s.collective gives measurements and constants; give one or the other "
                     "(the constants are fitted to the measurements)", what, link);
  if (c->n_measured < 2 || c->n_measured > LOOM_PROFILE_MAX_MEASUREMENTS)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: %s.collective holds %zu measurements; a curve takes 2 to %d message sizes",
                     what, link, c->n_measured, LOOM_PROFILE_MAX_MEASUREMENTS);
  const loom_collective kind = (loom_collective)c->kind;
  double sxx = 0.0, sxy = 0.0, syy = 0.0, sx = 0.0, sy = 0.0;
  for (size_t i = 0; i < c->n_measured; i++) {
    const Loom__BusBandwidthMeasurement *x = c->measured[i];
    snprintf(field, sizeof field, "%s.collective.measured.ranks", link);
    CHECK(field, x->has_ranks, x->ranks, 2.0, 1e6);
    const int per_node = x->has_ranks_per_node ? x->ranks_per_node : x->ranks;
    snprintf(field, sizeof field, "%s.collective.measured.ranks_per_node", link);
    CHECK(field, 1, per_node, 1.0, x->ranks);
    if (between_nodes == (per_node == x->ranks))
      return loom_fail(err, LOOM_ERR_FORMAT, "%s: %s.collective measures %d ranks with %d in a node: %s", what, link,
                       x->ranks, per_node, between_nodes ? "the link between nodes needs ranks in two or more nodes"
                                                         : "the link in a node needs every rank in one node");
    snprintf(field, sizeof field, "%s.collective.measured.bytes", link);
    CHECK(field, x->has_bytes, x->bytes, 1.0, 1e13);
    snprintf(field, sizeof field, "%s.collective.measured.busbw_gbs", link);
    CHECK(field, x->has_busbw_gbs, x->busbw_gbs, MIN_RATE, 1e6);
    const double bus_bytes = loom_collective_factor(kind, x->ranks) * x->bytes;
    const double t = bus_bytes / (x->busbw_gbs * 1e9);
    const double xi = loom_collective_latency_steps(kind, x->ranks) / t, yi = bus_bytes / (per_node < x->ranks ? per_node : 1) / t;
    sxx += xi * xi, sxy += xi * yi, syy += yi * yi, sx += xi, sy += yi;
  }
  const double det = sxx * syy - sxy * sxy;
  double latency = det > 1e-12 * sxx * syy ? (sx * syy - sy * sxy) / det : -1.0;
  double inverse_bw = latency >= 0.0 ? (sxx * sy - sxy * sx) / det : 0.0;
  if (latency < 0.0 || inverse_bw <= 0.0) latency = 0.0, inverse_bw = sy / syy; /* no latency the sizes can tell */
  c->bus_gbs = 1e-9 / inverse_bw, c->latency_us = latency * 1e6;
  c->has_bus_gbs = c->has_latency_us = 1;
  return LOOM_OK;
}

static loom_status check_curves(const char *what, const char *name, bool between_nodes, Loom__Link *l, loom_error *err) {
  char field[96];
  for (size_t i = 0; i < l->n_collective; i++) {
    Loom__CollectiveCurve *c = l->collective[i];
    snprintf(field, sizeof field, "%s.collective.kind", name);
    CHECK(field, c->has_kind, c->kind, 0.0, LOOM__COLLECTIVE_KIND__COLLECTIVE_SEND_RECV);
    for (size_t j = 0; j < i; j++)
      if (l->collective[j]->kind == c->kind)
        return loom_fail(err, LOOM_ERR_FORMAT, "%s: %s.collective gives kind %d twice", what, name, (int)c->kind);
    if (c->n_measured) {
      const loom_status st = fit_collective(what, name, between_nodes, c, err);
      if (st != LOOM_OK) return st;
    }
    snprintf(field, sizeof field, "%s.collective.bus_gbs", name);
    CHECK(field, c->has_bus_gbs, c->bus_gbs, MIN_RATE, 1e6);
    snprintf(field, sizeof field, "%s.collective.latency_us", name);
    CHECK(field, c->has_latency_us, c->latency_us, 0.0, 1e6);
  }
  return LOOM_OK;
}

loom_status loom_profile_check(loom_profile *p, const char *what, loom_error *err) {
  Loom__DeviceProfile *d = p->device;
  loom_status named = check_name(what, "name", p->name, err);
  if (named == LOOM_OK && d) named = check_name(what, "device.name", d->name, err);
  if (named != LOOM_OK) return named;
  if (!d) return loom_fail(err, LOOM_ERR_FORMAT, "%s: device is missing; every profile describes its device", what);
  CHECK("device.peak_tflops_bf16", d->has_peak_tflops_bf16, d->peak_tflops_bf16, MIN_RATE, 1e6);
  CHECK("device.peak_tflops_fp32", d->has_peak_tflops_fp32, d->peak_tflops_fp32, MIN_RATE, 1e6);
  if (d->fp32_uses_tf32) CHECK("device.peak_tflops_tf32", d->has_peak_tflops_tf32, d->peak_tflops_tf32, MIN_RATE, 1e6);
  CHECK("device.memory_bytes", d->has_memory_bytes, d->memory_bytes, 1048576.0, 1e15);
  CHECK("device.memory_bandwidth_gbs", d->has_memory_bandwidth_gbs, d->memory_bandwidth_gbs, MIN_RATE, 1e6);
  CHECK("device.memory_efficiency", d->has_memory_efficiency, d->memory_efficiency, MIN_EFFICIENCY, 1.0);
  if (d->has_peak_tflops_fp8) CHECK("device.peak_tflops_fp8", 1, d->peak_tflops_fp8, MIN_RATE, 1e6);
  if (d->n_attention_measured) {
    const loom_status st = fit_attention(what, d, err);
    if (st != LOOM_OK) return st;
  }
  if (d->has_attention_efficiency) CHECK("device.attention_efficiency", 1, d->attention_efficiency, MIN_EFFICIENCY, 1.0);
  if (d->has_attention_half_seq) {
    CHECK("device.attention_half_seq", 1, d->attention_half_seq, 0.0, 1e7);
    if (!d->has_attention_efficiency)
      return loom_fail(err, LOOM_ERR_FORMAT, "%s: device.attention_half_seq shapes device.attention_efficiency, which is "
                       "absent; give both or neither", what);
  }
  for (size_t i = 0; i < d->n_gemm; i++) {
    Loom__GemmEfficiency *g = d->gemm[i];
    CHECK("device.gemm.dtype", g->has_dtype, g->dtype, 0.0, 2.0);
    if (g->n_measured) {
      if (g->dtype == LOOM__PRECISION__PRECISION_FP8 && !d->has_peak_tflops_fp8) continue; /* refused below, by name */
      const loom_status st = fit_gemm(what, d, g, err);
      if (st != LOOM_OK) return st;
    }
    CHECK("device.gemm.max_efficiency", g->has_max_efficiency, g->max_efficiency, MIN_EFFICIENCY, 1.0);
    CHECK("device.gemm.half_dim", g->has_half_dim, g->half_dim, 0.0, 1e6);
    if (g->has_half_k) CHECK("device.gemm.half_k", 1, g->half_k, 0.0, 1e6);
    if (gemm_of(d, g->dtype) != g)
      return loom_fail(err, LOOM_ERR_FORMAT, "%s: device.gemm gives dtype %s twice", what,
                       precision_name(g->dtype));
  }
  if (d->has_mxfp8 && d->mxfp8 && !d->has_peak_tflops_fp8)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: device.mxfp8 is set but the device prices no fp8 GEMMs "
                     "(device.peak_tflops_fp8): MXFP8 runs at the fp8 rate", what);
  if (d->has_peak_tflops_fp8 != (gemm_of(d, LOOM__PRECISION__PRECISION_FP8) != NULL))
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: device.peak_tflops_fp8 and a PRECISION_FP8 device.gemm entry come together "
                     "(a device's fp8 figures are both or neither)", what);
  if (!gemm_of(d, LOOM__PRECISION__PRECISION_BF16) || !gemm_of(d, LOOM__PRECISION__PRECISION_FP32))
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: device.gemm needs an entry for PRECISION_BF16 and one for PRECISION_FP32",
                     what);
  CHECK("devices_per_node", p->has_devices_per_node, p->devices_per_node, 1.0, LOOM_PLAN_MAX_DEVICES_PER_NODE);
  loom_status st = check_link(what, "intra_node", p->intra_node, err);
  if (st == LOOM_OK) st = check_link(what, "inter_node", p->inter_node, err);
  if (st == LOOM_OK) st = check_curves(what, "intra_node", false, p->intra_node, err);
  if (st == LOOM_OK) st = check_curves(what, "inter_node", true, p->inter_node, err);
  if (st != LOOM_OK) return st;
  CHECK("op_overhead_us", 1, p->op_overhead_us, 0.0, 1e6);
  if (p->has_overlap_sm_share) CHECK("overlap_sm_share", 1, p->overlap_sm_share, 0.0, 0.9);
  const Loom__Reliability *r = p->reliability;
  if (r) { /* each figure is optional here; loom sim --mtbf-hours asks for those it uses */
    if (r->has_mtbf_node_hours) CHECK("reliability.mtbf_node_hours", 1, r->mtbf_node_hours, 1e-3, 1e9);
    if (r->has_relaunch_s) CHECK("reliability.relaunch_s", 1, r->relaunch_s, 0.0, 1e6);
    if (r->has_store_write_gbs) CHECK("reliability.store_write_gbs", 1, r->store_write_gbs, MIN_RATE, 1e9);
    if (r->has_store_read_gbs) CHECK("reliability.store_read_gbs", 1, r->store_read_gbs, MIN_RATE, 1e9);
    if (r->has_host_copy_gbs) CHECK("reliability.host_copy_gbs", 1, r->host_copy_gbs, MIN_RATE, 1e6);
    if (r->has_unrecoverable_share) CHECK("reliability.unrecoverable_share", 1, r->unrecoverable_share, 0.0, 1.0);
  }
  return LOOM_OK;
}

loom_status loom_profile_parse(const char *text, size_t len, const char *what, loom_profile **out, loom_error *err) {
  ProtobufCMessage *msg = NULL;
  loom_error perr = {0};
  if (loom_text_parse(&loom__cluster_profile__descriptor, text, len, &msg, &perr) != LOOM_OK)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: not a cluster profile: %s", what, perr.msg);
  loom_profile *p = (loom_profile *)msg;
  const loom_status st = loom_profile_check(p, what, err);
  if (st != LOOM_OK) {
    loom_profile_free(p);
    return st;
  }
  *out = p;
  return LOOM_OK;
}

loom_status loom_profile_load(const char *name_or_path, loom_profile **out, loom_error *err) {
  for (int i = 0; i < LOOM_BUILTIN_PROFILE_COUNT; i++)
    if (strcmp(name_or_path, LOOM_BUILTIN_PROFILES[i].name) == 0)
      return loom_profile_parse(LOOM_BUILTIN_PROFILES[i].text, strlen(LOOM_BUILTIN_PROFILES[i].text), name_or_path, out, err);
  if (!strchr(name_or_path, '/') && !strchr(name_or_path, '.'))
    return loom_fail(err, LOOM_ERR_USAGE, "--cluster %s: not a built-in profile (%s) nor a profile file", name_or_path,
                     loom_profile_builtin_names());
  char *data;
  size_t len;
  loom_status st = loom_read_small_file(name_or_path, "cluster profile", MAX_PROFILE_BYTES, &data, &len, err);
  if (st != LOOM_OK) return st;
  if (loom_plan_is_text(name_or_path)) {
    st = loom_profile_parse(data, len, name_or_path, out, err);
  } else {
    loom_profile *p = loom__cluster_profile__unpack(NULL, len, (const uint8_t *)data);
    if (!p) st = loom_fail(err, LOOM_ERR_FORMAT, "%s: not a binary cluster profile (text profiles end in .txtpb)", name_or_path);
    else if ((st = loom_profile_check(p, name_or_path, err)) != LOOM_OK) loom_profile_free(p);
    else *out = p;
  }
  free(data);
  return st;
}

static void unfit_link(Loom__Link *l) {
  for (size_t i = 0; l && i < l->n_collective; i++)
    if (l->collective[i]->n_measured) l->collective[i]->has_bus_gbs = l->collective[i]->has_latency_us = 0;
}

void loom_profile_unfit(loom_profile *p) {
  if (p->device && p->device->n_attention_measured)
    p->device->has_attention_efficiency = p->device->has_attention_half_seq = 0;
  for (size_t i = 0; p->device && i < p->device->n_gemm; i++)
    if (p->device->gemm[i]->n_measured)
      p->device->gemm[i]->has_max_efficiency = p->device->gemm[i]->has_half_dim = p->device->gemm[i]->has_half_k = 0;
  unfit_link(p->intra_node);
  unfit_link(p->inter_node);
}

void loom_profile_free(loom_profile *p) {
  if (p) loom__cluster_profile__free_unpacked(p, NULL);
}

double loom_profile_peak_flops(const loom_profile *p, Loom__Precision precision) {
  return peak_tflops(p->device, precision) * 1e12;
}

double loom_profile_gemm_efficiency(const loom_profile *p, Loom__Precision precision, double m, double n, double k) {
  return gemm_curve(gemm_of(p->device, precision), m, n, k);
}

double loom_profile_gemm_seconds(const loom_profile *p, Loom__Precision precision, double m, double n, double k,
                                 double batch) {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0) return 0.0;
  return 2.0 * m * n * k * batch / (loom_profile_peak_flops(p, precision) * loom_profile_gemm_efficiency(p, precision, m, n, k));
}

bool loom_profile_has_fp8(const loom_profile *p) { return p->device->has_peak_tflops_fp8; }

double loom_profile_memory_seconds(const loom_profile *p, double bytes) {
  return bytes / (p->device->memory_bandwidth_gbs * 1e9 * p->device->memory_efficiency);
}
