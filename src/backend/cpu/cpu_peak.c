/* sgemm peak measurement and thread control for the CPU backend. */
#include <unistd.h>
#include <errno.h>
#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include "backend/cpu/cpu_bf16_gemm.h"
#include "backend/cpu/cpu_gemm.h"
#include "backend/ops.h"
#include "backend/cpu/cpu_peak.h"
#include "core/check.h"
#include "core/rng.h"
#include "core/timer.h"


/* One GEMM to time: shape s on operands a, b (fp32, or bf16 when bf16) and c. */
typedef struct {
  const loom_gemm_shape *s;
  bool bf16;
  int via; /* a loom_gemm_library, or a loom_bf16_gemm_path when bf16 */
  const void *a, *b;
  float *c;
} timed_gemm;

static void run_timed(const timed_gemm *t) {
  if (t->bf16) loom_cpu_bf16_gemm_run((loom_bf16_gemm_path)t->via, t->s, loom_bf16_bits(t->a), loom_bf16_bits(t->b), t->c);
  else loom_cpu_gemm_run((loom_gemm_library)t->via, t->s, t->a, t->b, t->c);
}

/* Best GFLOP/s of t over repeats lasting at least min_seconds, after a warm-up (and oneDNN's JIT). */
static double best_gflops(const timed_gemm *t, double min_seconds) {
  const double flops = 2.0 * t->s->M * (double)t->s->N * t->s->K;
  run_timed(t);
  double best = 0.0;
  const double start = loom_now_s();
  for (int rep = 0; rep < 3 || loom_now_s() - start < min_seconds; rep++) {
    const double t0 = loom_now_s();
    run_timed(t);
    const double gflops = flops / (loom_now_s() - t0) * 1e-9;
    if (gflops > best) best = gflops;
  }
  return best;
}

/* Times shape s with random operands (fp32, or rounded to bf16). */
static double shape_gflops(const loom_gemm_shape *s, bool bf16, int via, double min_seconds) {
  const size_t na = (size_t)s->M * s->K, nb = (size_t)s->K * s->N, nc = (size_t)s->M * s->N;
  float *a = loom_xmalloc((na + nb + nc) * sizeof(float), "GEMM timing"), *b = a + na, *c = b + nb;
  loom_rng_fill_uniform(a, na + nb + nc, 1, 0xBE, 0); /* beta 1 accumulates into c: keep it finite */
  uint16_t *a16 = NULL;
  if (bf16) {
    const loom_ops *cpu = loom_ops_cpu();
    a16 = loom_xmalloc((na + nb) * sizeof(uint16_t), "GEMM timing");
    cpu->to_bf16(cpu, a16, a, na + nb);
  }
  const timed_gemm t = {s, bf16, via, bf16 ? (const void *)a16 : a, bf16 ? (const void *)(a16 + na) : b, c};
  const double g = best_gflops(&t, min_seconds);
  free(a16);
  free(a);
  return g;
}

double loom_cpu_gemm_shape_gflops(loom_gemm_library lib, const loom_gemm_shape *s, double min_seconds) {
  return shape_gflops(s, false, (int)lib, min_seconds);
}

double loom_cpu_bf16_gemm_shape_gflops(loom_bf16_gemm_path path, const loom_gemm_shape *s, double min_seconds) {
  return shape_gflops(s, true, (int)path, min_seconds);
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
  const loom_gemm_shape square = {.ta = false, .tb = true, .M = n, .N = n, .K = n, .beta = 0.0f};
  return loom_cpu_bf16_gemm_shape_gflops(loom_cpu_bf16_gemm_path(), &square, min_seconds);
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
