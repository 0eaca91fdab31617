/* The CPU backend's FP8 GEMM (ops.h's fp8_gemm). */
#ifndef LOOM_CPU_FP8_H
#define LOOM_CPU_FP8_H

#include "backend/ops.h"

void loom_cpu_fp8_gemm(const loom_ops *be, float *c, bool accumulate, const loom_fp8_matrix *a, const loom_fp8_matrix *b,
                       int M, int N, int K);

#endif
