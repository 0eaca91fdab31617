/* The profile, printed with its fits against their measurements. */
#include <math.h>
#include "comm/comm.h"
#include "sim/cost.h"
#include "sim/profile_report.h"

double loom_profile_curve_busbw(const Loom__CollectiveCurve *c, int ranks, int per_node, double bytes) {
  const loom_collective kind = (loom_collective)c->kind;
  const double bus_bytes = loom_collective_factor(kind, ranks) * bytes;
  const double bw = c->bus_gbs * 1e9 * (per_node < ranks ? per_node : 1);
  const double t = loom_collective_latency_steps(kind, ranks) * c->latency_us * 1e-6 + bus_bytes / bw;
  return bus_bytes / t / 1e9;
}

static const char *enum_name(const ProtobufCEnumDescriptor *d, int value) {
  const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(d, value);
  return v ? v->name : "?";
}

/* A fit's line against its n measurements (measured[i], the curve's curve[i]): their count, the mean absolute and
 * the worst relative error; then the table's header. */
static void fit_line(FILE *out, const double *measured, const double *curve, size_t n, const char *header) {
  double sum = 0.0, worst = 0.0;
  for (size_t i = 0; i < n; i++) {
    const double e = curve[i] / measured[i] - 1.0;
    sum += fabs(e);
    if (fabs(e) > fabs(worst)) worst = e;
  }
  fprintf(out, "; fitted to %zu measurements, mean |error| %.1f%%, worst %+.1f%%\n%s\n", n, 100.0 * sum / (double)n,
          100.0 * worst, header);
}

static void report_gemm(const loom_profile *p, const Loom__GemmEfficiency *g, FILE *out) {
  const double peak = loom_profile_peak_flops(p, g->dtype) / 1e12;
  fprintf(out, "  gemm %s: %.4g x g(m) g(n) h(k) of %g TFLOP/s, g(x) = x / (x + %g), h(k) = k / (k + %g)",
          enum_name(&loom__precision__descriptor, g->dtype), g->max_efficiency, peak, g->half_dim,
          g->has_half_k ? g->half_k : g->half_dim);
  if (!g->n_measured) {
    fprintf(out, " (stated)\n");
    return;
  }
  double measured[LOOM_PROFILE_MAX_MEASUREMENTS], curve[LOOM_PROFILE_MAX_MEASUREMENTS];
  for (size_t i = 0; i < g->n_measured; i++) {
    const Loom__GemmMeasurement *x = g->measured[i];
    measured[i] = x->tflops, curve[i] = loom_profile_gemm_efficiency(p, g->dtype, x->m, x->n, x->k) * peak;
  }
  char header[128];
  snprintf(header, sizeof header, "    %8s %8s %8s %10s %10s %7s  %s", "m", "n", "k", "measured", "curve", "error", "source");
  fit_line(out, measured, curve, g->n_measured, header);
  for (size_t i = 0; i < g->n_measured; i++) {
    const Loom__GemmMeasurement *x = g->measured[i];
    fprintf(out, "    %8g %8g %8g %10.4g %10.4g %+6.1f%%  %s\n", x->m, x->n, x->k, measured[i], curve[i],
            100.0 * (curve[i] / measured[i] - 1.0), x->source ? x->source : "");
  }
}

static void report_link(const char *name, const Loom__Link *l, FILE *out) {
  fprintf(out, "  %s: %g GB/s each way, collectives at %.0f%% of it, %g us a latency step%s\n", name, l->bandwidth_gbs,
          100.0 * l->efficiency, l->latency_us, l->rail_optimized ? ", rail-optimized" : "");
  for (size_t c = 0; c < l->n_collective; c++) {
    const Loom__CollectiveCurve *k = l->collective[c];
    fprintf(out, "    %s: %.4g GB/s bus bandwidth a device, %.3g us a latency step",
            enum_name(&loom__collective_kind__descriptor, k->kind), k->bus_gbs, k->latency_us);
    if (!k->n_measured) {
      fprintf(out, " (stated)\n");
      continue;
    }
    double measured[LOOM_PROFILE_MAX_MEASUREMENTS], curve[LOOM_PROFILE_MAX_MEASUREMENTS];
    for (size_t i = 0; i < k->n_measured; i++) {
      const Loom__BusBandwidthMeasurement *x = k->measured[i];
      measured[i] = x->busbw_gbs;
      curve[i] = loom_profile_curve_busbw(k, x->ranks, x->has_ranks_per_node ? x->ranks_per_node : x->ranks, x->bytes);
    }
    char header[128];
    snprintf(header, sizeof header, "      %6s %8s %12s %10s %10s %7s  %s", "ranks", "per node", "bytes", "busbw", "curve",
             "error", "source");
    fit_line(out, measured, curve, k->n_measured, header);
    for (size_t i = 0; i < k->n_measured; i++) {
      const Loom__BusBandwidthMeasurement *x = k->measured[i];
      fprintf(out, "      %6d %8d %12.0f %10.4g %10.4g %+6.1f%%  %s\n", x->ranks,
              x->has_ranks_per_node ? x->ranks_per_node : x->ranks, x->bytes, measured[i], curve[i],
              100.0 * (curve[i] / measured[i] - 1.0), x->source ? x->source : "");
    }
  }
}

/* The attention fit against its measurements, forward and backward weighted 1:2. */
static void report_attention(const Loom__DeviceProfile *d, FILE *out) {
  double measured[LOOM_PROFILE_MAX_MEASUREMENTS], curve[LOOM_PROFILE_MAX_MEASUREMENTS];
  for (size_t i = 0; i < d->n_attention_measured; i++) {
    const Loom__AttentionMeasurement *x = d->attention_measured[i];
    measured[i] = loom_profile_attention_rate(x);
    curve[i] = d->peak_tflops_bf16 * d->attention_efficiency * x->seq / (x->seq + d->attention_half_seq);
  }
  char header[128];
  snprintf(header, sizeof header, "    %8s %8s %10s %10s %10s %10s %7s  %s", "seq", "head dim", "forward", "backward", "1:2",
           "curve", "error", "source");
  fit_line(out, measured, curve, d->n_attention_measured, header);
  for (size_t i = 0; i < d->n_attention_measured; i++) {
    const Loom__AttentionMeasurement *x = d->attention_measured[i];
    fprintf(out, "    %8g %8g %10.4g %10.4g %10.4g %10.4g %+6.1f%%  %s\n", x->seq, x->head_dim, x->forward_tflops,
            x->backward_tflops, measured[i], curve[i], 100.0 * (curve[i] / measured[i] - 1.0), x->source ? x->source : "");
  }
}

void loom_profile_report(const loom_profile *p, FILE *out) {
  const Loom__DeviceProfile *d = p->device;
  fprintf(out, "loom sim profile: %s (%s), %d per node\n", p->name ? p->name : "profile", d->name ? d->name : "device",
          p->devices_per_node);
  fprintf(out, "  peaks (TFLOP/s, dense): bf16 %g", d->peak_tflops_bf16);
  if (d->has_peak_tflops_tf32) fprintf(out, ", tf32 %g", d->peak_tflops_tf32);
  fprintf(out, ", fp32 %g", d->peak_tflops_fp32);
  if (d->has_peak_tflops_fp8) fprintf(out, ", fp8 %g", d->peak_tflops_fp8);
  fprintf(out, "%s\n", d->fp32_uses_tf32 ? "; fp32 GEMMs on TF32" : "");
  fprintf(out, "  memory: %.2f GiB at %g GB/s; memory-bound passes at %.0f%% of it; %g us an op\n",
          (double)d->memory_bytes / 1073741824.0, d->memory_bandwidth_gbs, 100.0 * d->memory_efficiency, p->op_overhead_us);
  for (size_t i = 0; i < d->n_gemm; i++) report_gemm(p, d->gemm[i], out);
  if (d->has_attention_efficiency) {
    fprintf(out, "  fused attention: %.4g of the run's peak", d->attention_efficiency);
    if (d->has_attention_half_seq) fprintf(out, " x s / (s + %g) over the keys s a query meets", d->attention_half_seq);
    if (d->n_attention_measured) report_attention(d, out);
    else fprintf(out, " (stated)\n");
  } else {
    fprintf(out, "  attention: unfused, its products as GEMMs, its softmax as memory-bound passes\n");
  }
  report_link("intra_node", p->intra_node, out);
  report_link("inter_node", p->inter_node, out);
  if (p->has_overlap_sm_share) fprintf(out, "  a collective beside compute holds %.1f%% of the SMs\n", 100.0 * p->overlap_sm_share);
}
