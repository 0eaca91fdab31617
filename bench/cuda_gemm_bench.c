/* cuBLAS bf16 GEMM throughput on this device against its dense bf16 peak,
 * measured in one run: the ceiling any loom step's MFU is read against.
 *   loom_cuda_gemm_bench [SIZE ...]      (default 4096 8192) */
#include <stdio.h>
#include <stdlib.h>
#include "backend/cuda/cuda_backend.h"

int main(int argc, char **argv) {
  if (!loom_cuda_available()) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  loom_cuda_select_device(0);
  const loom_ops *cuda = loom_cuda_open(false);
  const double peak = loom_cuda_bf16_peak_tflops(cuda);
  char name[256];
  loom_cuda_device_name(cuda, name, sizeof name);
  printf("device: %s | dense bf16 peak used: %s\n", name, peak > 0 ? "" : "unknown to loom");
  if (peak > 0) printf("  (%.0f TFLOP/s, NVIDIA's datasheet figure for this GPU)\n", peak);
  const int defaults[] = {4096, 8192};
  const int n = argc > 1 ? argc - 1 : 2;
  for (int i = 0; i < n; i++) {
    const int s = argc > 1 ? atoi(argv[i + 1]) : defaults[i];
    const double tflops = loom_cuda_bf16_gemm_tflops(cuda, s, s, s, 10);
    printf("bf16 GEMM %d^3 (fp32 accumulate): %.1f TFLOP/s", s, tflops);
    if (peak > 0) printf(" = %.1f%% of peak", 100.0 * tflops / peak);
    printf("\n");
  }
  loom_cuda_close(cuda);
  return 0;
}
