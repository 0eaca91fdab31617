/* Cluster profiles (proto/loom.proto ClusterProfile): a device's peaks,
 * memory and GEMM efficiency, and the links inside and between nodes. They
 * come by name from examples/clusters (built in) or from a file, such as one
 * `loom sim calibrate` wrote, and every figure is range-checked on load. */
#ifndef LOOM_SIM_PROFILE_H
#define LOOM_SIM_PROFILE_H

#include <stdbool.h>
#include <stddef.h>
#include "core/status.h"
#include "loom.pb-c.h"

typedef Loom__ClusterProfile loom_profile;

/* The most measurements a GEMM entry, a collective curve or the attention may hold. */
#define LOOM_PROFILE_MAX_MEASUREMENTS 1024

/* A built-in name ("a100-80gb") or a .txtpb/.pb file; refused with one line
 * naming the field and its rule. Free with loom_profile_free. */
loom_status loom_profile_load(const char *name_or_path, loom_profile **out, loom_error *err);
/* The same checks on a profile's text, from `what` (a name or path). */
loom_status loom_profile_parse(const char *text, size_t len, const char *what, loom_profile **out, loom_error *err);
void loom_profile_free(loom_profile *p);
/* The checks loading makes, on a profile built in memory (`what` names it
 * in errors), fitting the constants of each GEMM entry and collective curve
 * that gives measurements (proto/loom.proto) in place. */
loom_status loom_profile_check(loom_profile *p, const char *what, loom_error *err);
/* Clears the constants fitted to measurements, so that the profile, printed,
 * holds the measurements alone and loads again (the loader refits them). */
void loom_profile_unfit(loom_profile *p);
/* The built-in names, comma-separated, for help and errors. */
const char *loom_profile_builtin_names(void);

/* Dense peak in FLOP/s for GEMMs of a precision (bf16: the bf16 tensor peak;
 * fp32: TF32's when the device runs fp32 GEMMs on it, else fp32's). */
double loom_profile_peak_flops(const loom_profile *p, Loom__Precision precision);
/* Whether the device's fp8 GEMMs are priced (its fp8 peak and gemm entry). */
bool loom_profile_has_fp8(const loom_profile *p);
/* The share of a dtype's peak a GEMM of m x n x k reaches (its entry's curve). */
double loom_profile_gemm_efficiency(const loom_profile *p, Loom__Precision precision, double m, double n, double k);
/* Seconds for `batch` GEMMs of m x n x k, through the efficiency model. */
double loom_profile_gemm_seconds(const loom_profile *p, Loom__Precision precision, double m, double n, double k,
                                 double batch);
/* A measured fused attention's TFLOP/s over a training step's passes: forward and backward weighted 1:2, as their FLOPs
 * are (the rate its fit and its report compare). */
double loom_profile_attention_rate(const Loom__AttentionMeasurement *x);
/* Seconds to stream `bytes` through memory, at the elementwise efficiency. */
double loom_profile_memory_seconds(const loom_profile *p, double bytes);

#endif
