/* The CPU backend's FP8 GEMM: the definition (ops.h's fp8_gemm) through the
 * GEMM library. Each code widens to its fp32 value exactly, and a product
 * of two FP8 values (at most 4 significant bits each) is exact in fp32, so
 * an sgemm over one block of columns is the block's fp32 sum of products in
 * the library's order; the blocks' scales then apply in order, as the
 * reference's loops apply them. It makes the recipes' numerics testable on
 * the CPU; it is no faster than a bf16 GEMM, and is not meant to be. */
#include <stdlib.h>
#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_fp8.h"
#include "backend/fp8_math.h"
#include "core/check.h"

/* The values of rows x K codes, through a table of the format's 256. */
static float *widen(const uint8_t *codes, size_t n, loom_fp8_format f) {
  float *out = malloc((n ? n : 1) * sizeof *out), value[256];
  LOOM_CHECK(out, "out of host memory widening fp8 codes");
  for (int c = 0; c < 256; c++) value[c] = loom_fp8_decode((uint8_t)c, f);
#pragma omp parallel for schedule(static) if (n > 16384)
  for (size_t i = 0; i < n; i++) out[i] = value[codes[i]];
  return out;
}

void loom_cpu_fp8_gemm(const loom_ops *be, float *c, bool accumulate, const loom_fp8_matrix *a, const loom_fp8_matrix *b,
                       int M, int N, int K) {
  (void)be;
  if (M == 0 || N == 0) return;
  const int bk = a->block_k, kb = loom_fp8_k_blocks(K, bk);
  float *A = widen(a->codes, (size_t)M * K, (loom_fp8_format)a->format);
  float *B = widen(b->codes, (size_t)N * K, (loom_fp8_format)b->format);
  float *part = malloc((size_t)M * N * sizeof *part);
  LOOM_CHECK(part, "out of host memory for an fp8 GEMM's partial sums");
  if (!accumulate)
    for (size_t i = 0; i < (size_t)M * N; i++) c[i] = 0.0f;
  for (int j = 0; j < kb; j++) {
    const int k0 = j * bk, len = K - k0 < bk ? K - k0 : bk;
    loom_cpu_sgemm_with(loom_cpu_gemm_library(), false, true, M, N, len, 1.0f, A + k0, K, B + k0, K, 0.0f, part, N);
#pragma omp parallel for schedule(static) if ((size_t)M * N > 16384)
    for (int m = 0; m < M; m++) {
      const float sa = a->scale_inv[(size_t)(m / a->block_rows) * kb + j];
      for (int n = 0; n < N; n++)
        c[(size_t)m * N + n] += part[(size_t)m * N + n] * (sa * b->scale_inv[(size_t)(n / b->block_rows) * kb + j]);
    }
  }
  free(A), free(B), free(part);
}
