// The emulated GPU's cuBLAS: the entry points loom calls, queued on the
// handle's stream as cuBLAS queues its kernels. Column-major, op(A) of
// m x k and op(B) of k x n into C of m x n; alpha and beta are host values
// read at the call (CUBLAS_POINTER_MODE_HOST, the default), a grouped
// GEMM's pointer arrays are device memory read when it runs. Each element
// is one fp32 dot product in k order; bf16 operands widen exactly; under
// CUBLAS_TF32_TENSOR_OP_MATH fp32 operands are rounded to TF32's 10-bit
// mantissa first, as the tensor cores take them. The argument checks are
// cuBLAS's, with its status: a dimension below zero, a leading dimension
// below the rows it holds, a null pointer where there is work.
#include <cublas_v2.h>
#include <stdio.h>
#include <string.h>
#include <vector>
#include "emu.h"

struct cublasContext {
  cudaStream_t stream = nullptr;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

namespace loom_emu {
namespace {

float tf32(float x) { // round to nearest even at mantissa bit 13, as the tensor cores read fp32
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0xfffu + (u >> 13 & 1)) & ~0x1fffu;
  memcpy(&x, &u, 4);
  return x;
}

// One GEMM's operands as the device sees them.
struct Gemm {
  cublasOperation_t ta, tb;
  int m, n, k;
  const void *a, *b;
  cudaDataType at, bt;
  int lda, ldb;
  float alpha, beta;
  float *c;
  int ldc;
  bool tf32;
};

float element(const void *base, cudaDataType t, size_t i, bool round) {
  const float x = t == CUDA_R_16BF ? bf16_value(((const uint16_t *)base)[i]) : ((const float *)base)[i];
  return round ? tf32(x) : x;
}

// C = alpha op(A) op(B) + beta C; beta 0 ignores what C held (NaN included), as cuBLAS does.
void run(const Gemm &g) {
  std::vector<float> a((size_t)g.m * g.k), b((size_t)g.n * g.k); // rows of op(A), columns of op(B)
  for (int i = 0; i < g.m; i++)
    for (int p = 0; p < g.k; p++)
      a[(size_t)i * g.k + p] =
          element(g.a, g.at, g.ta == CUBLAS_OP_N ? (size_t)p * g.lda + i : (size_t)i * g.lda + p, g.tf32);
  for (int j = 0; j < g.n; j++)
    for (int p = 0; p < g.k; p++)
      b[(size_t)j * g.k + p] =
          element(g.b, g.bt, g.tb == CUBLAS_OP_N ? (size_t)j * g.ldb + p : (size_t)p * g.ldb + j, g.tf32);
  for (int j = 0; j < g.n; j++)
    for (int i = 0; i < g.m; i++) {
      const float *x = a.data() + (size_t)i * g.k, *y = b.data() + (size_t)j * g.k; // (k may be 0)
      float acc = 0.0f;
      for (int p = 0; p < g.k; p++) acc += x[p] * y[p];
      float &c = g.c[(size_t)j * g.ldc + i];
      c = g.beta == 0.0f ? g.alpha * acc : g.alpha * acc + g.beta * c;
    }
}

int at_least_one(int x) { return x > 1 ? x : 1; }

// cuBLAS's checks of one GEMM's arguments; what is wrong, or nullptr.
const char *invalid(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *a, int lda,
                    const void *b, int ldb, const void *c, int ldc) {
  if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T)) return "an unknown operation";
  if (m < 0 || n < 0 || k < 0) return "a negative dimension";
  if (lda < at_least_one(ta == CUBLAS_OP_N ? m : k)) return "lda below the rows of A";
  if (ldb < at_least_one(tb == CUBLAS_OP_N ? k : n)) return "ldb below the rows of B";
  if (ldc < at_least_one(m)) return "ldc below m";
  if (m && n && !c) return "a null C";
  if (m && n && k && (!a || !b)) return "a null A or B";
  return nullptr;
}

cublasStatus_t refused(const char *call, const char *why, int m, int n, int k, int lda, int ldb, int ldc) {
  note("%s: CUBLAS_STATUS_INVALID_VALUE: %s (m %d, n %d, k %d, lda %d, ldb %d, ldc %d)", call,
         why, m, n, k, lda, ldb, ldc);
  return CUBLAS_STATUS_INVALID_VALUE;
}

// Whether a device operand of `elems` elements of `size` bytes at p lies in device memory the GEMM may read.
bool readable(const void *p, size_t elems, size_t size) {
  return !elems || (space_of(p) != SPACE_HOST && inside_allocation(p, elems * size));
}

size_t extent(cublasOperation_t t, int rows_n, int cols_n, int ld) { // elements a column-major operand spans
  const int cols = t == CUBLAS_OP_N ? cols_n : rows_n, rows = t == CUBLAS_OP_N ? rows_n : cols_n;
  return rows && cols ? (size_t)(cols - 1) * ld + rows : 0;
}

cublasStatus_t queue(cublasHandle_t h, const char *call, Gemm g) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (const char *why = invalid(g.ta, g.tb, g.m, g.n, g.k, g.a, g.lda, g.b, g.ldb, g.c, g.ldc))
    return refused(call, why, g.m, g.n, g.k, g.lda, g.ldb, g.ldc);
  if (!g.m || !g.n) return CUBLAS_STATUS_SUCCESS;
  const size_t as = g.at == CUDA_R_16BF ? 2 : 4, bs = g.bt == CUDA_R_16BF ? 2 : 4;
  if (!readable(g.a, g.k ? extent(g.ta, g.m, g.k, g.lda) : 0, as) || !readable(g.b, g.k ? extent(g.tb, g.k, g.n, g.ldb) : 0, bs) ||
      !readable(g.c, extent(CUBLAS_OP_N, g.m, g.n, g.ldc), 4)) {
    note("%s: an operand (m %d, n %d, k %d, lda %d, ldb %d, ldc %d) is not device memory, or "
                                    "runs past its allocation",
           call, g.m, g.n, g.k, g.lda, g.ldb, g.ldc);
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  enqueue(h->stream, call, [g] {
    run(g);
    return true;
  });
  return sticky() ? CUBLAS_STATUS_EXECUTION_FAILED : CUBLAS_STATUS_SUCCESS;
}

} // namespace
} // namespace loom_emu

using namespace loom_emu;

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode != CUBLAS_DEFAULT_MATH && mode != CUBLAS_TENSOR_OP_MATH && mode != CUBLAS_PEDANTIC_MATH &&
      mode != CUBLAS_TF32_TENSOR_OP_MATH)
    return CUBLAS_STATUS_INVALID_VALUE;
  handle->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                              const float *alpha, const float *a, int lda, const float *b, int ldb, const float *beta,
                              float *c, int ldc) {
  LOOM_EMU_LOCK;
  if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  return queue(h, "cublasSgemm", Gemm{ta, tb, m, n, k, a, b, CUDA_R_32F, CUDA_R_32F, lda, ldb, *alpha, *beta, c, ldc,
                                      h && h->math == CUBLAS_TF32_TENSOR_OP_MATH});
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                         int k, const float *alpha, const float *a, int lda, long long stride_a,
                                         const float *b, int ldb, long long stride_b, const float *beta, float *c,
                                         int ldc, long long stride_c, int batch) {
  LOOM_EMU_LOCK;
  if (!alpha || !beta || batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
  for (int i = 0; i < batch; i++) {
    const cublasStatus_t s =
        queue(h, "cublasSgemmStridedBatched",
              Gemm{ta, tb, m, n, k, a + i * stride_a, b + i * stride_b, CUDA_R_32F, CUDA_R_32F, lda, ldb, *alpha, *beta,
                   c + i * stride_c, ldc, h && h->math == CUBLAS_TF32_TENSOR_OP_MATH});
    if (s != CUBLAS_STATUS_SUCCESS) return s;
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *a, cudaDataType a_type, int lda, const void *b,
                            cudaDataType b_type, int ldb, const void *beta, void *c, cudaDataType c_type, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  LOOM_EMU_LOCK;
  if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  if ((a_type != CUDA_R_32F && a_type != CUDA_R_16BF) || (b_type != CUDA_R_32F && b_type != CUDA_R_16BF) ||
      c_type != CUDA_R_32F || (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_TF32))
    return CUBLAS_STATUS_NOT_SUPPORTED; // what loom asks for is all the emulator computes
  const bool round = a_type == CUDA_R_32F && (compute == CUBLAS_COMPUTE_32F_FAST_TF32 || (h && h->math == CUBLAS_TF32_TENSOR_OP_MATH));
  return queue(h, "cublasGemmEx", Gemm{ta, tb, m, n, k, a, b, a_type, b_type, lda, ldb, *(const float *)alpha,
                                       *(const float *)beta, (float *)c, ldc, round});
}

cublasStatus_t cublasGemmGroupedBatchedEx(cublasHandle_t h, const cublasOperation_t ta[], const cublasOperation_t tb[],
                                          const int m[], const int n[], const int k[], const void *alpha,
                                          const void *const a[], cudaDataType a_type, const int lda[],
                                          const void *const b[], cudaDataType b_type, const int ldb[], const void *beta,
                                          void *const c[], cudaDataType c_type, const int ldc[], int group_count,
                                          const int group_size[], cublasComputeType_t compute) {
  LOOM_EMU_LOCK;
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (group_count < 0 || (group_count && (!ta || !tb || !m || !n || !k || !alpha || !beta || !lda || !ldb || !ldc ||
                                          !group_size || !a || !b || !c)))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (a_type != CUDA_R_32F || b_type != CUDA_R_32F || c_type != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  // The problems' host parameters, read now; their pointers, in device memory, read when the stream gets there.
  struct Problem {
    Gemm g;
    size_t first; // index of its first matrix in the pointer arrays
  };
  std::vector<Problem> problems;
  size_t total = 0;
  const float *alphas = (const float *)alpha, *betas = (const float *)beta;
  for (int i = 0; i < group_count; i++) {
    if (group_size[i] < 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (const char *why = invalid(ta[i], tb[i], m[i], n[i], k[i], "", lda[i], "", ldb[i], "", ldc[i]))
      return refused("cublasGemmGroupedBatchedEx", why, m[i], n[i], k[i], lda[i], ldb[i], ldc[i]);
    for (int j = 0; j < group_size[i]; j++)
      problems.push_back({Gemm{ta[i], tb[i], m[i], n[i], k[i], nullptr, nullptr, CUDA_R_32F, CUDA_R_32F, lda[i], ldb[i],
                               alphas[i], betas[i], nullptr, ldc[i], h->math == CUBLAS_TF32_TENSOR_OP_MATH},
                          total + (size_t)j});
    total += (size_t)group_size[i];
  }
  if (total && (!readable(a, total, sizeof(void *)) || !readable(b, total, sizeof(void *)) ||
                !readable(c, total, sizeof(void *)))) {
    note("cublasGemmGroupedBatchedEx: the pointer arrays must be device memory holding %zu "
                                    "pointers each",
           total);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  enqueue(h->stream, "cublasGemmGroupedBatchedEx", [problems, a, b, c] {
    for (Problem p : problems) {
      p.g.a = a[p.first], p.g.b = b[p.first], p.g.c = (float *)c[p.first];
      if (!p.g.m || !p.g.n) continue;
      const size_t ea = p.g.k ? extent(p.g.ta, p.g.m, p.g.k, p.g.lda) : 0, eb = p.g.k ? extent(p.g.tb, p.g.k, p.g.n, p.g.ldb) : 0;
      if (!readable(p.g.a, ea, 4) || !readable(p.g.b, eb, 4) || !readable(p.g.c, extent(CUBLAS_OP_N, p.g.m, p.g.n, p.g.ldc), 4)) {
        fault(cudaErrorIllegalAddress, "cublasGemmGroupedBatchedEx: matrix %zu's operands are not device memory, or run "
                                       "past their allocations",
              p.first);
        return true;
      }
      run(p.g);
    }
    return true;
  });
  return sticky() ? CUBLAS_STATUS_EXECUTION_FAILED : CUBLAS_STATUS_SUCCESS;
}

} // extern "C"
