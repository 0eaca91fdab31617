/* Choosing the compute backend for a run. */
#include <stdio.h>
#include <string.h>
#include "backend/cpu/cpu_bf16_gemm.h"
#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_peak.h"
#include "cli/device.h"
#include "cli/launch.h"
#include "core/tensor.h"
#ifdef LOOM_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#ifdef LOOM_HAVE_NCCL
#include <stdlib.h>
#include <unistd.h>
#include "comm/nccl/comm_nccl.h"
#include "comm/nccl/nccl_watchdog.h"
#include "core/check.h"
#include "core/crc32c.h"
#endif

const char *const LOOM_DEVICE_CHOICES[] = {"auto", "cpu", "cuda", "guarded", NULL};
const char LOOM_DEVICE_HELP[] = "compute backend: auto (cuda when a GPU is visible; never the emulated GPU), cpu, cuda or guarded";

static int g_gpu = -1; /* the CUDA ordinal setup chose, -1 on the CPU */
#ifdef LOOM_HAVE_CUDA
static const loom_ops *g_cuda_ops; /* its context, kept for the process's lifetime (and so not a leak) */
#endif

int loom_device_gpu(void) { return g_gpu; }

#ifdef LOOM_HAVE_CUDA
static bool on_cuda(const loom_ops *ops) { return g_gpu >= 0 && ops && ops->mem->device == LOOM_DEVICE_CUDA; }
#endif

loom_status loom_device_match_plan(const char *cmd, const loom_ops *ops, const loom_plan *plan, loom_error *err) {
#ifdef LOOM_HAVE_CUDA
  if (!on_cuda(ops)) return LOOM_OK;
  loom_cuda_set_bf16_gemms(ops, plan->precision == LOOM__PRECISION__PRECISION_BF16);
  const int sm = loom_cuda_compute_capability(ops);
  if (loom_plan_fp8(plan).on && loom_plan_fp8(plan).recipe == LOOM_FP8_RECIPE_MXFP8 && sm < 100) {
    char name[256];
    loom_cuda_device_name(ops, name, sizeof name);
    return loom_fail(err, LOOM_ERR_USAGE, "%s: --fp8-recipe mxfp8 needs MXFP8 tensor cores (Blackwell, sm_100 on); "
                     "this GPU, %s, is sm_%d: use --fp8-recipe blockwise or tensorwise", cmd, name, sm);
  }
#else
  (void)cmd, (void)ops, (void)plan, (void)err;
#endif
  return LOOM_OK;
}

double loom_device_peak_gflops(const loom_ops *ops, bool bf16, char *what, size_t n) {
#ifdef LOOM_HAVE_CUDA
  if (on_cuda(ops)) {
    char name[256];
    loom_cuda_device_name(ops, name, sizeof name);
    const double sheet = loom_cuda_bf16_peak_tflops(ops);
    if (sheet > 0.0) {
      snprintf(what, n, "%s's datasheet bf16 dense peak, %.0f TFLOP/s", name, sheet);
      return sheet * 1e3;
    }
    /* A small GEMM first: a device far below a GPU's speed (the emulated one) is measured at that size, not 8192. */
    const double probe = loom_cuda_bf16_gemm_tflops(ops, 256, 256, 256, 2);
    const double measured = probe < 1.0 ? probe : loom_cuda_bf16_gemm_tflops(ops, 8192, 8192, 8192, 5);
    snprintf(what, n, "%s's cuBLAS bf16 GEMM, measured %.*f TFLOP/s (no datasheet figure for it)", name,
             measured < 1.0 ? 4 : 1, measured);
    return measured * 1e3;
  }
#else
  (void)ops;
#endif
  const double peak = bf16 ? loom_cpu_bf16_gemm_gflops(1024, 0.3) : loom_cpu_sgemm_gflops(1024, 0.3);
  snprintf(what, n, "the %s GEMM peak measured on each rank, %.1f GFLOP/s here", bf16 ? "bf16" : "fp32", peak);
  return peak;
}

loom_status loom_device_setup(const char *cmd, const char *device, const loom_ops **ops, char *desc, size_t len,
                              loom_error *err) {
  if (loom_cpu_gemm_choose_from_env(err) != LOOM_OK || loom_cpu_bf16_gemm_choose_from_env(err) != LOOM_OK)
    return loom_error_prefix(err, LOOM_ERR_USAGE, cmd);
  if (strcmp(device, "guarded") == 0) { /* a check, not a speed: host code touching tensor memory faults */
    *ops = loom_ops_guarded();
    snprintf(desc, len, "guarded (the CPU kernels on memory host code cannot touch)");
    return LOOM_OK;
  }
  *ops = loom_ops_cpu();
  snprintf(desc, len, "cpu (%s GEMMs, bf16 GEMMs %s, OpenMP)", loom_cpu_gemm_name(loom_cpu_gemm_library()),
           loom_cpu_bf16_gemm_path_name(loom_cpu_bf16_gemm_path()));
#ifdef LOOM_HAVE_CUDA
  const bool gpu = loom_cuda_available();
  if (strcmp(device, "cuda") == 0 && !gpu) {
    char why[256];
    loom_cuda_unavailable_reason(why, sizeof why);
    return loom_fail(err, LOOM_ERR_USAGE, "%s: --device cuda: no usable GPU (%s)", cmd, why);
  }
  if (strcmp(device, "cpu") == 0 || !gpu || (strcmp(device, "auto") == 0 && loom_cuda_emulated())) return LOOM_OK;
  g_gpu = loom_cuda_select_device(loom_launch_local_rank());
  *ops = g_cuda_ops = loom_cuda_open(false); /* this process's context, for its lifetime */
  char name[256];
  loom_cuda_device_name(*ops, name, sizeof name);
  snprintf(desc, len, "cuda %d (%s), device memory, one compute stream", g_gpu, name);
#else
  if (strcmp(device, "cuda") == 0)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: --device cuda: this loom was built without CUDA (no nvcc when it was built)",
                     cmd);
#endif
  return LOOM_OK;
}

#ifdef LOOM_HAVE_NCCL
/* Whether two ranks of world drive the same GPU of the same host. Collective. */
static bool ranks_share_gpu(loom_comm *world) {
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  const int64_t mine[2] = {(int64_t)loom_crc32c(0, host, strlen(host)), g_gpu};
  const int n = loom_comm_size(world);
  int64_t *all = loom_xmalloc((size_t)n * 2 * sizeof(int64_t), "GPU map");
  loom_comm_allgather_typed(world, mine, all, 2, LOOM_DTYPE_I64);
  bool shared = false;
  for (int a = 0; a < n && !shared; a++)
    for (int b = a + 1; b < n && !shared; b++) shared = all[2 * a] == all[2 * b] && all[2 * a + 1] == all[2 * b + 1];
  free(all);
  return shared;
}
#endif

loom_comm *loom_device_world(loom_comm *world, const loom_ops *ops, char *desc, size_t len) {
  snprintf(desc, len, "%s", loom_comm_size(world) > 1 ? "MPI" : "none (one rank)");
#ifdef LOOM_HAVE_NCCL
  if (!on_cuda(ops) || loom_comm_size(world) == 1) return world;
  if (ranks_share_gpu(world)) {
    snprintf(desc, len, "MPI through host memory (ranks share a GPU; NCCL takes one rank per GPU)");
    return world;
  }
  loom_comm *nccl = loom_comm_nccl_create(world, loom_cuda_stream(ops));
  LOOM_CHECK(nccl, "could not make the NCCL communicator (its error is above)");
  loom_comm_use_memory(nccl, ops->mem);
  loom_cuda_set_host_wait(ops, loom_nccl_wait_stream);
  snprintf(desc, len, "NCCL (a communicator per group; pipeline transfers grouped; host values staged)");
  return nccl;
#else
  (void)ops;
  return world;
#endif
}

void loom_device_world_free(loom_comm *device_world, loom_comm *world) {
  if (device_world != world) loom_comm_free(device_world);
}

void loom_device_facts_of(const loom_ops *ops, loom_device_facts *f) {
  memset(f, 0, sizeof *f);
#ifdef LOOM_HAVE_CUDA
  if (!on_cuda(ops)) return;
  f->gpu = true;
  f->emulated = loom_cuda_emulated();
  loom_cuda_device_name(ops, f->name, sizeof f->name);
  f->memory_bytes = (int64_t)loom_cuda_memory_bytes(ops);
  f->peak_bf16_tflops = loom_cuda_bf16_peak_tflops(ops);
  f->fp8 = loom_cuda_compute_capability(ops) >= 89;
  f->set_tf32 = loom_cuda_set_tf32;
#else
  (void)ops;
#endif
}
