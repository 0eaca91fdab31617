/* `--device auto|cpu|cuda|guarded`: which backend a command's model runs
 * on. auto is cuda when this loom was built with CUDA and a GPU is visible,
 * else cpu. guarded runs the CPU kernels on memory host code cannot touch
 * (a check that nothing above the backend reads tensor memory). On cuda,
 * rank r drives GPU (local rank mod GPUs); buffers are device memory and
 * every op is queued on one compute stream (cuda_backend.h's fast path). */
#ifndef LOOM_DEVICE_H
#define LOOM_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include "backend/ops.h"
#include "comm/comm.h"
#include "core/status.h"
#include "plan/plan.h"

extern const char *const LOOM_DEVICE_CHOICES[];
/* The flag's help text, the same in every command. */
extern const char LOOM_DEVICE_HELP[];

/* Sets up `device` for this process: *ops gets its op table, desc a
 * one-line description for the log. Usage errors name the flag. */
loom_status loom_device_setup(const char *cmd, const char *device, const loom_ops **ops, char *desc, size_t len,
                              loom_error *err);

/* Matches the backend to a run's precision once its plan is known: in bf16
 * runs the CUDA backend multiplies on bf16 tensor cores (the operands are
 * bf16 values already); the CPU backends need nothing. Refuses (usage) what
 * the device cannot run: MXFP8 on a GPU before Blackwell (sm_100), as
 * Transformer Engine does. */
loom_status loom_device_match_plan(const char *cmd, const loom_ops *ops, const loom_plan *plan, loom_error *err);

/* The group a run's collectives go through. On GPUs with NCCL built in and
 * one GPU per rank: an NCCL communicator over world (every group split from
 * it is NCCL too), its host waits under the NCCL watchdog. Otherwise world
 * itself: MPI, which stages device buffers through host memory (NCCL takes
 * one rank per GPU, so ranks sharing a GPU stay on MPI). Collective over
 * world; desc says which, for the log. Free the result with
 * loom_device_world_free. */
loom_comm *loom_device_world(loom_comm *world, const loom_ops *ops, char *desc, size_t len);
void loom_device_world_free(loom_comm *device_world, loom_comm *world);

/* The dense peak a run's MFU is a share of, per device (rank) in GFLOP/s,
 * and what it is, for the log: on a GPU its datasheet bf16 figure
 * (loom_cuda_bf16_peak_tflops; a GPU loom does not know: its cuBLAS bf16
 * GEMM, measured); on the CPU the GEMM peak of the run's dtype, measured on
 * this rank now (so every rank measures at once, on the cores they share). */
double loom_device_peak_gflops(const loom_ops *ops, bool bf16, char *what, size_t n);

/* What measuring a device needs to know of it (`loom sim calibrate`): on a
 * GPU its name, memory, datasheet bf16 peak (0 unknown), whether it has fp8
 * tensor cores (sm_89 on), whether it is the emulated one, and the switch of
 * its fp32 GEMMs onto TF32; on the CPU gpu is false and the rest empty. */
typedef struct {
  bool gpu, emulated, fp8;
  char name[256];
  int64_t memory_bytes;
  double peak_bf16_tflops;
  void (*set_tf32)(const loom_ops *ops, bool on);
} loom_device_facts;
void loom_device_facts_of(const loom_ops *ops, loom_device_facts *f);

/* The GPU (CUDA ordinal) setup chose for this rank, or -1 on the CPU. NVML
 * numbers devices by PCI order, CUDA fastest first unless
 * CUDA_DEVICE_ORDER=PCI_BUS_ID: set that where a node mixes GPU models. */
int loom_device_gpu(void);

#endif
