/* Measures this machine's sgemm throughput, the peak that loom's speed is
 * reported against ("% of GEMM peak"), in the same run: the best of every
 * GEMM library built in. */
#ifndef LOOM_CPU_PEAK_H
#define LOOM_CPU_PEAK_H

#include "core/status.h"
#include "backend/cpu/cpu_bf16_gemm.h"
#include "backend/cpu/cpu_gemm.h"
#include "core/sysinfo.h"

/* Best GFLOP/s of n x n x n sgemm over repeats lasting at least min_seconds
 * per library, and the library that reached it (fastest may be NULL). */
double loom_cpu_sgemm_peak(int n, double min_seconds, loom_gemm_library *fastest);
double loom_cpu_sgemm_gflops(int n, double min_seconds);
/* Best GFLOP/s of one GEMM shape through lib, over repeats lasting at least min_seconds. */
double loom_cpu_gemm_shape_gflops(loom_gemm_library lib, const loom_gemm_shape *s, double min_seconds);
/* The same through a bf16 GEMM path (bf16 operands, fp32 accumulation). */
double loom_cpu_bf16_gemm_shape_gflops(loom_bf16_gemm_path path, const loom_gemm_shape *s, double min_seconds);
/* The CPU backend's bf16 GEMM at n x n x n, through the path its bf16 GEMMs take. */
double loom_cpu_bf16_gemm_gflops(int n, double min_seconds);
/* The most CPU threads a rank may run: --threads' bound and the
 * environment's (OpenMP and OpenBLAS fail or crash creating 50,000). */
#define LOOM_MAX_THREADS 4096
/* Refuses OMP_NUM_THREADS, OPENBLAS_NUM_THREADS or OMP_THREAD_LIMIT outside
 * [1, LOOM_MAX_THREADS] (or not a count), before any thread pool starts. */
loom_status loom_cpu_check_thread_env(loom_error *err);
/* Sets the threads OpenMP loops and OpenBLAS use; n <= 0 leaves the defaults. */
void loom_cpu_set_threads(int n);
int loom_cpu_threads(void);
/* Lets every thread of the OpenMP pool (which OpenBLAS shares) run on the
 * CPUs of mask, as threads made before a change of affinity keep the old
 * one; returns 0, or -1 when the kernel refuses. */
int loom_cpu_pin_threads(const loom_cpu_mask *mask);

#endif
