/* The CPU backend's GEMM: oneDNN's sgemm where loom was built with oneDNN
 * (made for these workloads, with AVX-512 and AMX kernels), else OpenBLAS.
 * One library for every shape, chosen at build time, so results do not
 * depend on timing (a choice per shape by timing would let a resumed run's
 * losses differ from the uninterrupted run's). OpenBLAS's speed here depends
 * on OPENBLAS_CORETYPE, which some environments pin to Haswell: pinned, it
 * ran GPT-2-small's shapes at about 80 GFLOP/s to oneDNN's 115-128; unpinned
 * on the same AVX2 machine, a little faster than oneDNN at most of them
 * (`loom bench step --verbose`; docs/performance.md). */
#ifndef LOOM_CPU_GEMM_H
#define LOOM_CPU_GEMM_H

#include <stdbool.h>
#include "core/status.h"

typedef enum { LOOM_GEMM_OPENBLAS = 0, LOOM_GEMM_ONEDNN = 1, LOOM_GEMM_LIBRARIES } loom_gemm_library;

/* Row-major C[M,N] = alpha op(A) op(B) + beta C, op transposing when ta / tb. */
void loom_cpu_sgemm_with(loom_gemm_library lib, bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                         int lda, const float *B, int ldb, float beta, float *C, int ldc);
/* One GEMM on packed row-major operands: C[M,N] = op(A) op(B) + beta C,
 * A [M,K] ([K,M] when ta), B [K,N] ([N,K] when tb). */
typedef struct {
  bool ta, tb;
  int M, N, K;
  float beta;
} loom_gemm_shape;
/* An empty product (M, N or K is 0), which oneDNN refuses: C = beta C where
 * K is 0, nothing else; true if the shape was one (and is done). */
bool loom_cpu_gemm_empty(int M, int N, int K, float beta, float *C, int ldc);
enum { LOOM_LINEAR_FORWARD, LOOM_LINEAR_INPUT_GRAD, LOOM_LINEAR_WEIGHT_GRAD, LOOM_LINEAR_GEMMS };
/* The GEMMs of a linear layer y[N,OC] = x[N,C] W[OC,C]^T: the forward, the
 * input grad (accumulated) and the weight grad (accumulated). The one
 * source of the CPU backend's matmul calls, and of what `loom bench step
 * --verbose` times. */
void loom_cpu_linear_gemms(int N, int C, int OC, loom_gemm_shape out[LOOM_LINEAR_GEMMS]);
/* Runs s through lib. */
void loom_cpu_gemm_run(loom_gemm_library lib, const loom_gemm_shape *s, const float *A, const float *B, float *C);
/* LOOM_CPU_GEMM=openblas|onednn (either case) makes every GEMM of this
 * process use that library, so a check can force each (tests, sweeps);
 * unset, the build's choice stands. A bad or missing one is refused. */
#define LOOM_CPU_GEMM_ENV "LOOM_CPU_GEMM"
loom_status loom_cpu_gemm_choose_from_env(loom_error *err);
/* The library the backend uses, and whether a library is built in. */
loom_gemm_library loom_cpu_gemm_library(void);
bool loom_cpu_gemm_available(loom_gemm_library lib);
const char *loom_cpu_gemm_name(loom_gemm_library lib);

#endif
