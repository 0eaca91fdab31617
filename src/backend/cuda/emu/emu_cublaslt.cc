// The emulated GPU's cuBLASLt: FP8 matmuls as an H100 runs them, queued on
// the call's stream. D = alpha x scale_A x scale_B x op(A) op(B) + beta C,
// column-major, each element one fp32 dot product in k order of the FP8
// values (widened exactly), the scales read from device memory when the
// matmul runs (as cuBLASLt reads its scale pointers). What an H100 refuses,
// the heuristic and the matmul refuse with CUBLAS_STATUS_NOT_SUPPORTED: FP8
// operands not "TN" (A transposed, B not), both E5M2, a leading dimension or
// pointer not 16-byte aligned, C or D not fp32 in this subset, compute or
// scale type not 32F.
#include <cublasLt.h>
#include <math.h>
#include <string.h>
#include <vector>
#include "emu.h"

struct cublasLtContext {
  int unused;
};
struct loom_emu_lt_desc {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  const float *a_scale = nullptr, *b_scale = nullptr;
  int8_t fast_accum = 0;
};
struct loom_emu_lt_layout {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
};
struct loom_emu_lt_pref {
  uint64_t workspace = 0;
};

namespace loom_emu {
namespace {

bool fp8(cudaDataType t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }
size_t bytes_of(cudaDataType t) { return fp8(t) ? 1 : t == CUDA_R_16BF ? 2 : 4; }

// An FP8 code's value, from the OCP formats' fields (E4M3: bias 7, S.1111.111 NaN; E5M2: bias 15, IEEE's specials).
float fp8_value(uint8_t c, cudaDataType t) {
  const bool e4 = t == CUDA_R_8F_E4M3;
  const int mbits = e4 ? 3 : 2, bias = e4 ? 7 : 15, emax = e4 ? 15 : 31;
  const int e = (c & 0x7f) >> mbits, m = c & ((1 << mbits) - 1);
  const float sign = c & 0x80 ? -1.0f : 1.0f;
  if (e4 && (c & 0x7f) == 0x7f) return NAN;
  if (!e4 && e == emax) return m ? NAN : sign * INFINITY;
  return sign * ldexpf(e ? (float)((1 << mbits) + m) : (float)m, (e ? e : 1) - bias - mbits);
}

// What an H100 refuses of this matmul, or nullptr.
const char *unsupported(const loom_emu_lt_desc *d, const loom_emu_lt_layout *a, const loom_emu_lt_layout *b,
                        const loom_emu_lt_layout *c, const loom_emu_lt_layout *dd) {
  if (!d || !a || !b || !c || !dd) return "a null descriptor";
  if (d->compute != CUBLAS_COMPUTE_32F || d->scale != CUDA_R_32F) return "compute or scale type not 32F";
  if (!fp8(a->type) || !fp8(b->type)) return "A or B not FP8 (this subset's matmuls are FP8's)";
  if (a->type == CUDA_R_8F_E5M2 && b->type == CUDA_R_8F_E5M2) return "A and B both E5M2";
  if (d->ta != CUBLAS_OP_T || d->tb != CUBLAS_OP_N) return "FP8 operands not TN (A transposed, B not)";
  if (c->type != CUDA_R_32F || dd->type != CUDA_R_32F) return "C or D not fp32";
  const loom_emu_lt_layout *all[] = {a, b, c, dd};
  for (const loom_emu_lt_layout *l : all) {
    if (l->ld < (int64_t)(l->rows ? l->rows : 1)) return "a leading dimension below its rows";
    if ((l->ld * (int64_t)bytes_of(l->type)) % 16) return "a leading dimension not 16-byte aligned";
  }
  if (a->rows != b->rows || a->cols != c->rows || b->cols != c->cols || c->rows != dd->rows || c->cols != dd->cols)
    return "shapes that do not chain (op(A) m x k, B k x n, C and D m x n)";
  return nullptr;
}

cublasStatus_t refuse(const char *call, const char *why) {
  note("%s: CUBLAS_STATUS_NOT_SUPPORTED: %s", call, why);
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

bool aligned(const void *p) { return ((uintptr_t)p & 15) == 0; }

} // namespace
} // namespace loom_emu

using namespace loom_emu;

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute, cudaDataType_t scale) {
  if (!desc) return CUBLAS_STATUS_INVALID_VALUE;
  *desc = new loom_emu_lt_desc;
  (*desc)->compute = compute, (*desc)->scale = scale;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size) {
  if (!desc || !buf) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) { // each attribute's size as cuBLASLt stores it
  case CUBLASLT_MATMUL_DESC_TRANSA:
  case CUBLASLT_MATMUL_DESC_TRANSB:
    if (size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
    (attr == CUBLASLT_MATMUL_DESC_TRANSA ? desc->ta : desc->tb) = (cublasOperation_t) * (const int32_t *)buf;
    return CUBLAS_STATUS_SUCCESS;
  case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER:
  case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER:
    if (size != sizeof(void *)) return CUBLAS_STATUS_INVALID_VALUE;
    (attr == CUBLASLT_MATMUL_DESC_A_SCALE_POINTER ? desc->a_scale : desc->b_scale) = *(const float *const *)buf;
    return CUBLAS_STATUS_SUCCESS;
  case CUBLASLT_MATMUL_DESC_FAST_ACCUM:
    if (size != sizeof(int8_t)) return CUBLAS_STATUS_INVALID_VALUE;
    desc->fast_accum = *(const int8_t *)buf;
    return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
  if (!layout) return CUBLAS_STATUS_INVALID_VALUE;
  *layout = new loom_emu_lt_layout{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
  if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
  *pref = new loom_emu_lt_pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t size) {
  if (!pref || !buf || attr != CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES || size != sizeof(uint64_t))
    return CUBLAS_STATUS_INVALID_VALUE;
  pref->workspace = *(const uint64_t *)buf;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int *returned) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (requested <= 0 || !results || !returned || !pref) return CUBLAS_STATUS_INVALID_VALUE;
  *returned = 0;
  if (const char *why = unsupported(desc, a, b, c, d)) return refuse("cublasLtMatmulAlgoGetHeuristic", why);
  memset(&results[0], 0, sizeof results[0]);
  results[0].state = CUBLAS_STATUS_SUCCESS, results[0].wavesCount = 1.0f; // one algorithm, needing no workspace
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t a, const void *B, cublasLtMatrixLayout_t b, const void *beta,
                              const void *C, cublasLtMatrixLayout_t c, void *D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (const char *why = unsupported(desc, a, b, c, d)) return refuse("cublasLtMatmul", why);
  if (!alpha || !beta || !A || !B || !C || !D) return CUBLAS_STATUS_INVALID_VALUE;
  if (!aligned(A) || !aligned(B) || !aligned(C) || !aligned(D)) return refuse("cublasLtMatmul", "an operand not 16-byte aligned");
  const int m = (int)a->cols, n = (int)b->cols, k = (int)a->rows; // op(A) = A^T: m x k
  auto spans = [](const loom_emu_lt_layout *l) { return l->cols ? (size_t)(l->cols - 1) * l->ld + l->rows : 0; };
  if (!(space_of(A) != SPACE_HOST && inside_allocation(A, spans(a))) || !(space_of(B) != SPACE_HOST && inside_allocation(B, spans(b))) ||
      !(space_of(D) != SPACE_HOST && inside_allocation(D, spans(d) * 4)) || !(space_of(C) != SPACE_HOST && inside_allocation(C, spans(c) * 4)) ||
      (desc->a_scale && !inside_allocation(desc->a_scale, 4)) || (desc->b_scale && !inside_allocation(desc->b_scale, 4))) {
    note("cublasLtMatmul: an operand (m %d, n %d, k %d) or scale is not device memory, or runs past its allocation", m, n, k);
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  const loom_emu_lt_desc g = *desc;
  const loom_emu_lt_layout la = *a, lb = *b, lc = *c, ld = *d;
  const float al = *(const float *)alpha, be = *(const float *)beta;
  enqueue(stream, "cublasLtMatmul", [=] {
    const float scale = al * (g.a_scale ? *g.a_scale : 1.0f) * (g.b_scale ? *g.b_scale : 1.0f);
    const uint8_t *x = (const uint8_t *)A, *y = (const uint8_t *)B;
    std::vector<float> out((size_t)m * n);
    for (int j = 0; j < n; j++)
      for (int i = 0; i < m; i++) {
        float acc = 0.0f; // op(A)[i, p] = A[p, i]: column i of A, contiguous in k
        for (int p = 0; p < k; p++)
          acc += fp8_value(x[(size_t)i * la.ld + p], la.type) * fp8_value(y[(size_t)j * lb.ld + p], lb.type);
        const float cij = ((const float *)C)[(size_t)j * lc.ld + i];
        out[(size_t)j * m + i] = be == 0.0f ? scale * acc : scale * acc + be * cij;
      }
    for (int j = 0; j < n; j++)
      for (int i = 0; i < m; i++) ((float *)D)[(size_t)j * ld.ld + i] = out[(size_t)j * m + i];
    return true;
  });
  (void)algo, (void)workspace, (void)workspace_bytes;
  return sticky() ? CUBLAS_STATUS_EXECUTION_FAILED : CUBLAS_STATUS_SUCCESS;
}

} // extern "C"
