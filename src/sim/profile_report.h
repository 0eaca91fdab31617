/* `loom sim profile`: a cluster profile as the cost model reads it, each
 * fitted curve beside the measurements it was fitted to, so a reader sees
 * what every GEMM, collective and pass costs and where each figure comes
 * from. */
#ifndef LOOM_SIM_PROFILE_REPORT_H
#define LOOM_SIM_PROFILE_REPORT_H

#include <stdio.h>
#include "sim/profile.h"

/* The bus bandwidth (GB/s, nccl-tests' convention) a collective curve gives a measurement's shape: ranks, per_node of
 * them in a node (ranks: one node), bytes. */
double loom_profile_curve_busbw(const Loom__CollectiveCurve *c, int ranks, int per_node, double bytes);
void loom_profile_report(const loom_profile *p, FILE *out);

#endif
