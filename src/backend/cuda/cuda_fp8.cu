// The FP8 ops on the GPU (ops.h's fp8_amax, fp8_quantize, fp8_gemm), by
// fp8_math.h's one definition of the formats and scales. A GEMM under
// per-tensor scales (tensorwise and delayed scaling) runs on cuBLASLt's FP8
// matmul where the device has FP8 tensor cores (sm_89 on) and the shapes
// meet its rules (K a multiple of 16, N of 4, every operand 16-byte
// aligned, not both operands E5M2), with
// the scales as its A and B scale pointers and split accumulation (fast
// accumulation off); every other one (blockwise's and MXFP8's block scales,
// other shapes) runs the definition's loops, one thread per output (each
// block of columns summed in order, its scales applied as the reference
// applies them): correct, not fast. The emulated GPU checks both against
// the CPU.
#include "backend/cuda/cuda_ops.cuh"
extern "C" {
#include "backend/fp8_math.h"
}

namespace loom_cuda {

// A max that keeps NaN (fp8_math.h's join).
struct NanMax {
  __device__ float operator()(float a, float b) const { return loom_fp8_amax_join(a, b); }
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
  for (unsigned b = 0; b < blocks; b++) m = loom_fp8_amax_join(m, host[b]);
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
  loom_fp8_block_scale(amax, f, a.q.mx, &scale, &inv);
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

cudaDataType lt_type(int format) { return format == LOOM_FP8_E5M2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3; }

// c[M,N] row-major is column-major N x M: c^T = b a^T, so cuBLASLt's A is our b (K x N column-major, transposed:
// "T") and its B our a (K x M, not transposed: "N"), its A scale b's and its B scale a's. True if it ran.
bool lt_gemm(Backend &g, float *c, bool accumulate, const loom_fp8_matrix *a, const loom_fp8_matrix *b, int M, int N, int K) {
  const BlasLt &t = g.lib.lt;
  const bool whole = a->block_rows >= M && a->block_k >= K && b->block_rows >= N && b->block_k >= K;
  const auto aligned = [](const void *p) { return ((uintptr_t)p & 15) == 0; }; // cuBLASLt's FP8 rule for every operand
  if (!g.lt || !whole || M == 0 || N == 0 || K == 0 || K % 16 || N % 4 || !aligned(a->codes) || !aligned(b->codes) ||
      !aligned(c) || (a->format == LOOM_FP8_E5M2 && b->format == LOOM_FP8_E5M2))
    return false;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  const int32_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const int8_t fast = 0;
  const float *sa = b->scale_inv, *sb = a->scale_inv;
  const uint64_t workspace = 0;
  bool ok = t.desc_create(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
            t.desc_set(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == CUBLAS_STATUS_SUCCESS &&
            t.desc_set(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == CUBLAS_STATUS_SUCCESS &&
            t.desc_set(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa) == CUBLAS_STATUS_SUCCESS &&
            t.desc_set(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb) == CUBLAS_STATUS_SUCCESS &&
            t.desc_set(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast) == CUBLAS_STATUS_SUCCESS &&
            t.layout_create(&la, lt_type(b->format), K, N, K) == CUBLAS_STATUS_SUCCESS &&
            t.layout_create(&lb, lt_type(a->format), K, M, K) == CUBLAS_STATUS_SUCCESS &&
            t.layout_create(&lc, CUDA_R_32F, N, M, N) == CUBLAS_STATUS_SUCCESS &&
            t.pref_create(&pref) == CUBLAS_STATUS_SUCCESS &&
            t.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace) == CUBLAS_STATUS_SUCCESS;
  cublasLtMatmulHeuristicResult_t found;
  int count = 0;
  ok = ok && t.heuristic(g.lt, desc, la, lb, lc, lc, pref, 1, &found, &count) == CUBLAS_STATUS_SUCCESS && count > 0;
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  if (ok)
    check_blas(t.matmul(g.lt, desc, &one, b->codes, la, a->codes, lb, &beta, c, lc, c, lc, &found.algo, nullptr, 0, g.stream),
               "cublasLtMatmul (fp8_gemm)");
  if (pref) t.pref_destroy(pref);
  if (lc) t.layout_destroy(lc);
  if (lb) t.layout_destroy(lb);
  if (la) t.layout_destroy(la);
  if (desc) t.desc_destroy(desc);
  g.lt_matmuls += ok;
  return ok;
}

void cuda_fp8_gemm(const loom_ops *be, float *c, bool accumulate, const loom_fp8_matrix *a, const loom_fp8_matrix *b,
                   int M, int N, int K) {
  Backend &g = ctx(be);
  if (lt_gemm(g, c, accumulate, a, b, M, N, K)) return;
  LAUNCH(fp8_gemm_kernel, blocks_for((size_t)M * N), THREADS, 0, g.stream, c, accumulate, *a, *b, M, N, K);
  launched("fp8_gemm");
}

} // namespace loom_cuda
