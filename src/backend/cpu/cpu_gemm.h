/* The CPU backend's GEMM: oneDNN's sgemm where loom was built with oneDNN
 * (measured faster than OpenBLAS's on this project's machines at the model's
 * shapes, and equal at 2048^3; see docs/performance.md), else OpenBLAS. One
 * library for every shape, chosen at build time, so results do not depend
 * on timing. */
#ifndef LOOM_CPU_GEMM_H
#define LOOM_CPU_GEMM_H

#include <stdbool.h>

typedef enum { LOOM_GEMM_OPENBLAS = 0, LOOM_GEMM_ONEDNN = 1, LOOM_GEMM_LIBRARIES } loom_gemm_library;

/* Row-major C[M,N] = op(A) op(B) + beta C, op transposing when ta / tb. */
void loom_cpu_sgemm_with(loom_gemm_library lib, bool ta, bool tb, int M, int N, int K, const float *A, int lda,
                         const float *B, int ldb, float beta, float *C, int ldc);
/* The same through the library the backend uses. */
void loom_cpu_sgemm(bool ta, bool tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb, float beta,
                    float *C, int ldc);
/* The library the backend uses, and whether a library is built in. */
loom_gemm_library loom_cpu_gemm_library(void);
bool loom_cpu_gemm_available(loom_gemm_library lib);
const char *loom_cpu_gemm_name(loom_gemm_library lib);

#endif
