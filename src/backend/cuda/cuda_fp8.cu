// The FP8 ops on the GPU (ops.h's fp8_amax, fp8_quantize, fp8_gemm), by
// fp8_math.h's one definition of the formats and scales. The GEMM here is
// the definition's loops, one thread per output (each block of columns
// summed in order, its scales applied as the reference applies them): it
// is what the emulated GPU checks against the CPU, and on a GPU a correct
// fallback, not a fast one; cuBLASLt's FP8 matmuls are not wired yet.
#include "backend/cuda/cuda_ops.cuh"
extern "C" {
#include "backend/fp8_math.h"
}

namespace loom_cuda {

// A max that keeps NaN (fmaxf would drop it).
struct NanMax {
  __device__ float operator()(float a, float b) const { return isnan(a) || a > b ? a : b; }
};

__device__ inline float operand_at(const uint16_t *bits, const float *f32, size_t i) {
  return bits ? loom_bf16_value(bits[i]) : f32[i];
}

__global__ void fp8_amax_kernel(float *partials, const uint16_t *bits, const float *f32, size_t n) {
  float m = 0.0f;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    m = NanMax()(m, fabsf(operand_at(bits, f32, i)));
  m = block_reduce(m, NanMax(), 0.0f);
  if (threadIdx.x == 0) partials[blockIdx.x] = m;
}

float cuda_fp8_amax(const loom_ops *be, loom_bf16_operand x, size_t n) {
  Backend &g = ctx(be);
  if (!n) return 0.0f;
  const unsigned blocks = sumsq_blocks(n);
  float *parts = scratch(g, SUMSQ_BLOCKS);
  LAUNCH(fp8_amax_kernel, blocks, THREADS, 0, g.stream, parts, x.bf16, x.f32, n);
  launched("fp8_amax");
  float host[SUMSQ_BLOCKS];
  copy_to_host(g, host, parts, blocks * sizeof(float), "fp8_amax");
  float m = 0.0f;
  for (unsigned b = 0; b < blocks; b++) m = isnan(host[b]) || host[b] > m ? host[b] : m;
  return m;
}

struct QuantArgs {
  const uint16_t *bits;
  const float *f32;
  int C, rows, K; // x's row length; the output's rows and K
  bool transpose;
  loom_fp8_quant q;
};

// Element (r, k) of the output's layout.
__device__ inline float quant_at(const QuantArgs &a, int r, int k) {
  return operand_at(a.bits, a.f32, a.transpose ? (size_t)k * a.C + r : (size_t)r * a.C + k);
}

__global__ void fp8_cast_kernel(uint8_t *codes, QuantArgs a) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < (size_t)a.rows * a.K)
    codes[i] = loom_fp8_encode(quant_at(a, (int)(i / a.K), (int)(i % a.K)) * a.q.scale, (loom_fp8_format)a.q.format);
}

// One block of threads per block of codes: its amax, its scale, its casts.
__global__ void fp8_block_kernel(uint8_t *codes, float *scale_inv, QuantArgs a) {
  const int br = a.q.block_rows, bk = a.q.block_k, kb = loom_fp8_k_blocks(a.K, bk);
  const int r0 = blockIdx.y * br, k0 = blockIdx.x * bk;
  const int h = min(br, a.rows - r0), w = min(bk, a.K - k0);
  const loom_fp8_format f = (loom_fp8_format)a.q.format;
  float m = 0.0f;
  for (int i = threadIdx.x; i < h * w; i += blockDim.x) m = NanMax()(m, fabsf(quant_at(a, r0 + i / w, k0 + i % w)));
  const float amax = block_reduce(m, NanMax(), 0.0f);
  float scale, inv;
  if (a.q.mx) {
    const uint8_t e = loom_mx_scale(amax, f);
    inv = loom_e8m0_decode(e), scale = e == LOOM_E8M0_NAN ? NAN : loom_e8m0_decode((uint8_t)(254 - e));
  } else {
    scale = loom_fp8_scale(amax, f, 0, 1.0f), inv = 1.0f / scale;
  }
  if (threadIdx.x == 0) scale_inv[(size_t)blockIdx.y * kb + blockIdx.x] = inv;
  for (int i = threadIdx.x; i < h * w; i += blockDim.x) {
    const int r = r0 + i / w, k = k0 + i % w;
    codes[(size_t)r * a.K + k] = loom_fp8_encode(quant_at(a, r, k) * scale, f);
  }
}

__global__ void fp8_scale_kernel(float *scale_inv, float scale) { scale_inv[0] = 1.0f / scale; }

void cuda_fp8_quantize(const loom_ops *be, uint8_t *codes, float *scale_inv, loom_bf16_operand x, int R, int C,
                       bool transpose, const loom_fp8_quant *q) {
  Backend &g = ctx(be);
  const QuantArgs a = {x.bf16, x.f32, C, transpose ? C : R, transpose ? R : C, transpose, *q};
  if (q->scale > 0.0f) {
    LAUNCH(fp8_scale_kernel, 1, 1, 0, g.stream, scale_inv, q->scale);
    LAUNCH(fp8_cast_kernel, blocks_for((size_t)a.rows * a.K), THREADS, 0, g.stream, codes, a);
  } else {
    const dim3 grid((unsigned)loom_fp8_k_blocks(a.K, q->block_k), (unsigned)loom_fp8_k_blocks(a.rows, q->block_rows));
    LAUNCH(fp8_block_kernel, grid, THREADS, 0, g.stream, codes, scale_inv, a);
  }
  launched("fp8_quantize");
}

__global__ void fp8_gemm_kernel(float *c, bool accumulate, loom_fp8_matrix a, loom_fp8_matrix b, int M, int N, int K) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)M * N) return;
  const int m = (int)(i / N), n = (int)(i % N), bk = a.block_k, kb = loom_fp8_k_blocks(K, bk);
  const loom_fp8_format fa = (loom_fp8_format)a.format, fb = (loom_fp8_format)b.format;
  float out = accumulate ? c[i] : 0.0f;
  for (int j = 0; j < kb; j++) {
    float sum = 0.0f;
    for (int k = j * bk; k < K && k < (j + 1) * bk; k++)
      sum += loom_fp8_decode(a.codes[(size_t)m * K + k], fa) * loom_fp8_decode(b.codes[(size_t)n * K + k], fb);
    out += sum * (a.scale_inv[(size_t)(m / a.block_rows) * kb + j] * b.scale_inv[(size_t)(n / b.block_rows) * kb + j]);
  }
  c[i] = out;
}

void cuda_fp8_gemm(const loom_ops *be, float *c, bool accumulate, const loom_fp8_matrix *a, const loom_fp8_matrix *b,
                   int M, int N, int K) {
  Backend &g = ctx(be);
  LAUNCH(fp8_gemm_kernel, blocks_for((size_t)M * N), THREADS, 0, g.stream, c, accumulate, *a, *b, M, N, K);
  launched("fp8_gemm");
}

} // namespace loom_cuda
