/* The FP8 ops on host memory: the amax and the cast every host backend
 * shares, and the GEMM's definition written as loops (the reference's). */
#include <stdlib.h>
#include "backend/fp8_math.h"
#include "backend/op_math.h"
#include "backend/ops.h"

/* Element i of a bf16 operand, as fp32. */
static inline float operand_at(loom_bf16_operand x, size_t i) { return x.bf16 ? loom_bf16_value(x.bf16[i]) : x.f32[i]; }

float loom_host_fp8_amax(const loom_ops *be, loom_bf16_operand x, size_t n) {
  (void)be;
  float amax = 0.0f;
  for (size_t i = 0; i < n && !isnan(amax); i++) amax = loom_fp8_amax_join(amax, fabsf(operand_at(x, i)));
  return amax;
}

void loom_host_fp8_quantize(const loom_ops *be, uint8_t *codes, float *scale_inv, loom_bf16_operand x, int R, int C,
                            bool transpose, const loom_fp8_quant *q) {
  (void)be;
  const loom_fp8_format f = (loom_fp8_format)q->format;
  const int rows = transpose ? C : R, K = transpose ? R : C; /* the output's layout */
  /* element (r, k) of the output: x[r, k], or x[k, r] transposed */
#define AT(r, k) operand_at(x, transpose ? (size_t)(k) * C + (size_t)(r) : (size_t)(r) * C + (size_t)(k))
  if (q->scale > 0.0f) { /* one scale for the whole tensor */
    scale_inv[0] = 1.0f / q->scale;
#pragma omp parallel for schedule(static) if ((size_t)rows * K > 16384)
    for (int r = 0; r < rows; r++)
      for (int k = 0; k < K; k++) codes[(size_t)r * K + k] = loom_fp8_encode(AT(r, k) * q->scale, f);
    return;
  }
  const int br = q->block_rows, bk = q->block_k, kb = loom_fp8_k_blocks(K, bk), rb = loom_fp8_k_blocks(rows, br);
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)rows * K > 16384)
  for (int i = 0; i < rb; i++)
    for (int j = 0; j < kb; j++) {
      const int r0 = i * br, k0 = j * bk;
      const int r1 = r0 + br < rows ? r0 + br : rows, k1 = k0 + bk < K ? k0 + bk : K;
      float amax = 0.0f;
      for (int r = r0; r < r1; r++)
        for (int k = k0; k < k1; k++) amax = loom_fp8_amax_join(amax, fabsf(AT(r, k)));
      float scale, inv;
      loom_fp8_block_scale(amax, f, q->mx, &scale, &inv);
      scale_inv[(size_t)i * kb + j] = inv;
      for (int r = r0; r < r1; r++)
        for (int k = k0; k < k1; k++) codes[(size_t)r * K + k] = loom_fp8_encode(AT(r, k) * scale, f);
    }
#undef AT
}

void loom_host_fp8_gemm(const loom_ops *be, float *c, bool accumulate, const loom_fp8_matrix *a, const loom_fp8_matrix *b,
                        int M, int N, int K) {
  (void)be;
  const int bk = a->block_k, kb = loom_fp8_k_blocks(K, bk);
  const loom_fp8_format fa = (loom_fp8_format)a->format, fb = (loom_fp8_format)b->format;
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      float out = accumulate ? c[(size_t)m * N + n] : 0.0f;
      for (int j = 0; j < kb; j++) {
        float sum = 0.0f;
        for (int k = j * bk; k < K && k < (j + 1) * bk; k++)
          sum += loom_fp8_decode(a->codes[(size_t)m * K + k], fa) * loom_fp8_decode(b->codes[(size_t)n * K + k], fb);
        const float s = a->scale_inv[(size_t)(m / a->block_rows) * kb + j] * b->scale_inv[(size_t)(n / b->block_rows) * kb + j];
        out += sum * s;
      }
      c[(size_t)m * N + n] = out;
    }
}
