/* `loom sim calibrate`: measures the device it runs on into a cluster
 * profile of the same form as examples/clusters. A device is one launched
 * rank: on the CPU, the rank with its threads; on a GPU, the rank's GPU.
 * The profile holds measurements, which loading fits (sim/profile.h): each
 * GEMM dtype's rate over a grid of shapes (fp32, bf16, and fp8 on a device
 * with fp8 tensor cores), and, with two or more ranks, the bus bandwidth of
 * all-reduce, all-gather, reduce-scatter and send/recv over message sizes;
 * beside them the memory bandwidth, the share of it the norm and the
 * activation reach, the attention's share of the peak and an op's fixed
 * cost. */
#ifndef LOOM_SIM_CALIBRATE_H
#define LOOM_SIM_CALIBRATE_H

#include "backend/ops.h"
#include "comm/comm.h"
#include "sim/profile.h"

typedef struct {
  double seconds;          /* the least time each measurement runs */
  size_t mem_bytes;        /* the bandwidth test's arrays together */
  const loom_profile *links_from; /* links for a run of one rank (which cannot measure any), else NULL */
  const char *name;
  /* The device. gpu: ops queue their work and only sumsq waits for it (a
   * GPU backend); its memory bandwidth is measured on the device. */
  bool gpu;
  const char *device_name;
  int64_t memory_bytes;     /* the device's memory; 0: the host's, shared among the ranks */
  double peak_bf16_tflops;  /* the datasheet's dense bf16 peak; 0: the best GEMM measured */
  bool fp8;                 /* fp8 tensor cores: fp8 GEMMs measured, at twice the bf16 peak */
  void (*set_tf32)(const loom_ops *ops, bool on); /* fp32 GEMMs on TF32 (a GPU's fp32 entry), or NULL */
  const int *dims;          /* the grid's sizes: every m x n x k of them */
  int n_dims;
  double max_bytes;         /* the largest collective measured (from 64 KiB, by fours) */
} loom_calibrate_options;

/* Collective over world (NULL when alone). Every rank gets the profile in
 * *out and, in *notes, the measurements as text-format comment lines (the
 * caller frees both). One rank without links_from is refused. */
loom_status loom_sim_calibrate(loom_comm *world, const loom_ops *ops, const loom_calibrate_options *o, loom_profile **out,
                               char **notes, loom_error *err);

#endif
