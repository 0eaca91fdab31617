/* Preflight: before hours of training, each rank measures its GEMM
 * throughput (through its backend's matmul) and memory bandwidth, every
 * tensor- and data-parallel group its all-reduce bus bandwidth, and each
 * pipeline link (or, with one stage, each pair of neighbouring ranks) its
 * p2p bandwidth; on GPUs NVML adds clocks, temperature, throttle reasons and
 * ECC errors. A rank, group or link slower than the median of its kind by
 * more than a factor, a GPU held down by heat or power, or one with
 * uncorrected ECC errors is named. */
#ifndef LOOM_PREFLIGHT_H
#define LOOM_PREFLIGHT_H

#include <stddef.h>
#include "backend/ops.h"
#include "tensor_parallel/parallel_state.h"

typedef struct {
  double factor;     /* name what is slower than its kind's median by more than this */
  double seconds;    /* the least time each measurement runs */
  int gemm_n;        /* the n x n x n GEMM */
  size_t mem_bytes;  /* the bandwidth test's three arrays together */
  size_t comm_bytes; /* each all-reduce and p2p message */
  int gpu;           /* this rank's local GPU for NVML, or -1 */
} loom_preflight_options;

loom_preflight_options loom_preflight_defaults(void);

/* Measures every rank, group and link of ps (collective over its world).
 * Rank 0's *report (the caller frees it; NULL on other ranks) gets the
 * table and one line per finding; returns the number of findings, the same
 * on every rank. */
int loom_preflight_run(const loom_parallel *ps, const loom_ops *ops, const loom_preflight_options *o, char **report);

#endif
