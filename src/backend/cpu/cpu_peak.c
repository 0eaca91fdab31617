/* sgemm peak measurement and thread control for the CPU backend. */
#include <unistd.h>
#include <errno.h>
#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include "backend/cpu/cpu_gemm.h"
#include "backend/ops.h"
#include "backend/cpu/cpu_peak.h"
#include "core/check.h"
#include "core/rng.h"
#include "core/timer.h"


/* Best GFLOP/s of shape s through lib on operands a, b, c, over repeats lasting at least min_seconds. */
static double library_gflops(loom_gemm_library lib, const loom_gemm_shape *s, const float *a, const float *b, float *c,
                             double min_seconds) {
  const double flops = 2.0 * s->M * (double)s->N * s->K;
  loom_cpu_gemm_run(lib, s, a, b, c); /* warm-up (and oneDNN's JIT) */
  double best = 0.0;
  const double start = loom_now_s();
  for (int rep = 0; rep < 3 || loom_now_s() - start < min_seconds; rep++) {
    const double t0 = loom_now_s();
    loom_cpu_gemm_run(lib, s, a, b, c);
    const double gflops = flops / (loom_now_s() - t0) * 1e-9;
    if (gflops > best) best = gflops;
  }
  return best;
}

double loom_cpu_gemm_shape_gflops(loom_gemm_library lib, const loom_gemm_shape *s, double min_seconds) {
  const size_t na = (size_t)s->M * s->K, nb = (size_t)s->K * s->N, nc = (size_t)s->M * s->N;
  float *a = loom_xmalloc((na + nb + nc) * sizeof(float), "GEMM timing"), *b = a + na, *c = b + nb;
  loom_rng_fill_uniform(a, na + nb + nc, 1, 0xBE, 0); /* beta 1 accumulates into c: keep it finite */
  const double g = library_gflops(lib, s, a, b, c, min_seconds);
  free(a);
  return g;
}

double loom_cpu_sgemm_peak(int n, double min_seconds, loom_gemm_library *fastest) {
  const loom_gemm_shape square = {.ta = false, .tb = true, .M = n, .N = n, .K = n, .beta = 0.0f};
  double best = 0.0;
  for (int lib = 0; lib < LOOM_GEMM_LIBRARIES; lib++) {
    if (!loom_cpu_gemm_available((loom_gemm_library)lib)) continue;
    const double g = loom_cpu_gemm_shape_gflops((loom_gemm_library)lib, &square, min_seconds);
    if (g > best) {
      best = g;
      if (fastest) *fastest = (loom_gemm_library)lib;
    }
  }
  return best;
}

double loom_cpu_sgemm_gflops(int n, double min_seconds) { return loom_cpu_sgemm_peak(n, min_seconds, NULL); }

double loom_cpu_bf16_gemm_gflops(int n, double min_seconds) {
  const loom_ops *ops = loom_ops_cpu();
  const size_t nn = (size_t)n * n;
  float *c = loom_xmalloc(nn * sizeof(float), "bf16 GEMM peak");
  uint16_t *ab = loom_xmalloc(2 * nn * sizeof(uint16_t), "bf16 GEMM peak");
  loom_rng_fill_uniform(c, nn, 1, 0xBE, 0);
  ops->to_bf16(ops, ab, c, nn);
  ops->to_bf16(ops, ab + nn, c, nn);
  ops->matmul_forward_bf16(ops, c, ab, ab + nn, NULL, n, n, n); /* warm-up */
  double best = 0.0;
  const double start = loom_now_s();
  for (int rep = 0; rep < 3 || loom_now_s() - start < min_seconds; rep++) {
    const double t0 = loom_now_s();
    ops->matmul_forward_bf16(ops, c, ab, ab + nn, NULL, n, n, n);
    const double gflops = 2.0 * n * (double)nn / (loom_now_s() - t0) * 1e-9;
    if (gflops > best) best = gflops;
  }
  free(c);
  free(ab);
  return best;
}

loom_status loom_cpu_check_thread_env(loom_error *err) {
  static const char *const VARS[] = {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_THREAD_LIMIT"};
  for (size_t i = 0; i < sizeof VARS / sizeof VARS[0]; i++) {
    const char *v = getenv(VARS[i]);
    if (!v || !*v) continue;
    /* OMP_NUM_THREADS may list a count per nesting level: "4,2". */
    for (const char *p = v;;) {
      char *end;
      errno = 0;
      const long n = strtol(p, &end, 10);
      if (end == p || errno || n < 1 || n > LOOM_MAX_THREADS || (*end && *end != ','))
        return loom_fail(err, LOOM_ERR_USAGE, "%s=%s: thread counts must be whole numbers in [1, %d] (this machine has %ld cores)",
                         VARS[i], v, LOOM_MAX_THREADS, sysconf(_SC_NPROCESSORS_ONLN));
      if (!*end) break;
      p = end + 1;
    }
  }
  return LOOM_OK;
}

void loom_cpu_set_threads(int n) {
  if (n <= 0) return;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int loom_cpu_threads(void) { return omp_get_max_threads(); }

int loom_cpu_pin_threads(const loom_cpu_mask *mask) {
  int failed = 0;
  /* Each thread of the pool (OpenBLAS's too: they are the same) sets its own. */
#pragma omp parallel reduction(+ : failed)
  failed += loom_cpu_set_affinity(mask) != 0;
  return failed ? -1 : 0;
}
