/* Cluster profiles: loading, checking, and the device's cost functions. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/read_file.h"
#include "plan/plan.h"
#include "plan/plan_io.h"
#include "plan/textformat.h"
#include "sim/profile.h"
#include "sim/profile_builtin.h"

#define MAX_PROFILE_BYTES (1 << 20)
/* The least rate (TFLOP/s, GB/s) and efficiency a profile may give: below
 * them a prediction would be days per step, not a figure of a real machine. */
#define MIN_RATE 1e-6
#define MIN_EFFICIENCY 1e-3

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

static loom_status check_profile(const loom_profile *p, const char *what, loom_error *err) {
  const Loom__DeviceProfile *d = p->device;
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
  if (d->has_attention_efficiency) CHECK("device.attention_efficiency", 1, d->attention_efficiency, MIN_EFFICIENCY, 1.0);
  if (d->has_attention_half_seq) {
    CHECK("device.attention_half_seq", 1, d->attention_half_seq, 0.0, 1e7);
    if (!d->has_attention_efficiency)
      return loom_fail(err, LOOM_ERR_FORMAT, "%s: device.attention_half_seq shapes device.attention_efficiency, which is "
                       "absent; give both or neither", what);
  }
  for (size_t i = 0; i < d->n_gemm; i++) {
    const Loom__GemmEfficiency *g = d->gemm[i];
    CHECK("device.gemm.dtype", g->has_dtype, g->dtype, 0.0, 2.0);
    CHECK("device.gemm.max_efficiency", g->has_max_efficiency, g->max_efficiency, MIN_EFFICIENCY, 1.0);
    CHECK("device.gemm.half_dim", g->has_half_dim, g->half_dim, 0.0, 1e6);
    if (gemm_of(d, g->dtype) != g)
      return loom_fail(err, LOOM_ERR_FORMAT, "%s: device.gemm gives dtype %s twice", what,
                       protobuf_c_enum_descriptor_get_value(&loom__precision__descriptor, g->dtype)->name);
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
  const loom_status st = check_profile(p, what, err);
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
    else if ((st = check_profile(p, name_or_path, err)) != LOOM_OK) loom_profile_free(p);
    else *out = p;
  }
  free(data);
  return st;
}

void loom_profile_free(loom_profile *p) {
  if (p) loom__cluster_profile__free_unpacked(p, NULL);
}

double loom_profile_peak_flops(const loom_profile *p, Loom__Precision precision) {
  const Loom__DeviceProfile *d = p->device;
  if (precision == LOOM__PRECISION__PRECISION_BF16) return d->peak_tflops_bf16 * 1e12;
  if (precision == LOOM__PRECISION__PRECISION_FP8) return d->peak_tflops_fp8 * 1e12;
  return (d->fp32_uses_tf32 ? d->peak_tflops_tf32 : d->peak_tflops_fp32) * 1e12;
}

double loom_profile_gemm_seconds(const loom_profile *p, Loom__Precision precision, double m, double n, double k,
                                 double batch) {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0) return 0.0;
  const Loom__GemmEfficiency *g = gemm_of(p->device, precision);
  const double h = g->half_dim;
  const double efficiency = g->max_efficiency * (m / (m + h)) * (n / (n + h)) * (k / (k + h));
  return 2.0 * m * n * k * batch / (loom_profile_peak_flops(p, precision) * efficiency);
}

bool loom_profile_has_fp8(const loom_profile *p) { return p->device->has_peak_tflops_fp8; }

double loom_profile_memory_seconds(const loom_profile *p, double bytes) {
  return bytes / (p->device->memory_bandwidth_gbs * 1e9 * p->device->memory_efficiency);
}
