/* `loom sim calibrate`: measures the machine it runs on into a cluster
 * profile of the same form as examples/clusters. A device is one launched
 * rank with its threads: its GEMM throughput over a grid of shapes in fp32
 * and bf16 (the peak is the best large GEMM; the efficiency model is fitted
 * to the grid), its memory bandwidth, the fixed cost of an op, and, with two
 * or more ranks, all-reduce, all-gather, reduce-scatter and send/recv over
 * message sizes, each fitted to latency + bytes / bandwidth. */
#ifndef LOOM_SIM_CALIBRATE_H
#define LOOM_SIM_CALIBRATE_H

#include "backend/ops.h"
#include "comm/comm.h"
#include "sim/profile.h"

typedef struct {
  double seconds;          /* the least time each measurement runs */
  size_t mem_bytes;        /* the bandwidth test's three arrays together */
  const loom_profile *links_from; /* links for a run of one rank (which cannot measure any), else NULL */
  const char *name;
} loom_calibrate_options;

/* Collective over world (NULL when alone). Every rank gets the profile in
 * *out and, in *notes, the measurements as text-format comment lines (the
 * caller frees both). One rank without links_from is refused. */
loom_status loom_sim_calibrate(loom_comm *world, const loom_ops *ops, const loom_calibrate_options *o, loom_profile **out,
                               char **notes, loom_error *err);

#endif
