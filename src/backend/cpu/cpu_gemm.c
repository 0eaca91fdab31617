/* The CPU backend's GEMM libraries behind one call. */
#include <cblas.h>
#include <stdlib.h>
#include <strings.h>
#include "backend/cpu/cpu_gemm.h"
#include "core/check.h"
#ifdef LOOM_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

bool loom_cpu_gemm_available(loom_gemm_library lib) {
#ifdef LOOM_HAVE_ONEDNN
  return lib == LOOM_GEMM_OPENBLAS || lib == LOOM_GEMM_ONEDNN;
#else
  return lib == LOOM_GEMM_OPENBLAS;
#endif
}

static int g_forced = -1; /* a library LOOM_CPU_GEMM chose, or -1 */

loom_gemm_library loom_cpu_gemm_library(void) {
  if (g_forced >= 0) return (loom_gemm_library)g_forced;
  return loom_cpu_gemm_available(LOOM_GEMM_ONEDNN) ? LOOM_GEMM_ONEDNN : LOOM_GEMM_OPENBLAS;
}

const char *loom_cpu_gemm_name(loom_gemm_library lib) { return lib == LOOM_GEMM_ONEDNN ? "oneDNN" : "OpenBLAS"; }

loom_status loom_cpu_gemm_choose_from_env(loom_error *err) {
  const char *want = getenv(LOOM_CPU_GEMM_ENV);
  if (!want || !*want) return LOOM_OK;
  for (int lib = 0; lib < LOOM_GEMM_LIBRARIES; lib++) {
    if (strcasecmp(want, loom_cpu_gemm_name((loom_gemm_library)lib)) != 0) continue;
    if (!loom_cpu_gemm_available((loom_gemm_library)lib))
      return loom_fail(err, LOOM_ERR_USAGE, "%s=%s: this loom was built without %s", LOOM_CPU_GEMM_ENV, want, want);
    g_forced = lib;
    return LOOM_OK;
  }
  return loom_fail(err, LOOM_ERR_USAGE, "%s must be openblas or onednn, got '%s'", LOOM_CPU_GEMM_ENV, want);
}

bool loom_cpu_gemm_empty(int M, int N, int K, float beta, float *C, int ldc) {
  if (M > 0 && N > 0 && K > 0) return false;
  for (int i = 0; K <= 0 && beta != 1.0f && i < M; i++) /* C = beta C: no products to add */
    for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
  return true;
}

void loom_cpu_sgemm_with(loom_gemm_library lib, bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                         int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  if (loom_cpu_gemm_empty(M, N, K, beta, C, ldc)) return;
#ifdef LOOM_HAVE_ONEDNN
  if (lib == LOOM_GEMM_ONEDNN) {
    const dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    LOOM_CHECK(st == dnnl_success, "oneDNN sgemm failed");
    return;
  }
#endif
  LOOM_CHECK(lib == LOOM_GEMM_OPENBLAS, "this loom was built without oneDNN");
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}

void loom_cpu_linear_gemms(int N, int C, int OC, loom_gemm_shape out[LOOM_LINEAR_GEMMS]) {
  out[LOOM_LINEAR_FORWARD] = (loom_gemm_shape){.ta = false, .tb = true, .M = N, .N = OC, .K = C, .beta = 0.0f};
  out[LOOM_LINEAR_INPUT_GRAD] = (loom_gemm_shape){.ta = false, .tb = false, .M = N, .N = C, .K = OC, .beta = 1.0f};
  out[LOOM_LINEAR_WEIGHT_GRAD] = (loom_gemm_shape){.ta = true, .tb = false, .M = OC, .N = C, .K = N, .beta = 1.0f};
}

void loom_cpu_gemm_run(loom_gemm_library lib, const loom_gemm_shape *s, const float *A, const float *B, float *C) {
  loom_cpu_sgemm_with(lib, s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, s->ta ? s->M : s->K, B, s->tb ? s->K : s->N, s->beta, C,
                      s->N);
}
