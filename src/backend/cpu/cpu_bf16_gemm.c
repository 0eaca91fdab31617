/* bf16 GEMMs: oneDNN's matmul where the CPU has bf16 instructions, exact widening elsewhere. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "backend/cpu/cpu_bf16_gemm.h"
#include "backend/ops.h"
#include "core/check.h"
#ifdef LOOM_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

static const char *const PATH_NAMES[LOOM_BF16_GEMM_PATHS] = {"native", "widen"};

bool loom_cpu_bf16_native_available(void) {
#ifdef LOOM_HAVE_ONEDNN
  /* The ISA values are masks: AMX's holds AVX512-BF16's bits. */
  const unsigned isa = (unsigned)dnnl_get_effective_cpu_isa(), bf16 = (unsigned)dnnl_cpu_isa_avx512_core_bf16;
  return (isa & bf16) == bf16;
#else
  return false;
#endif
}

static int g_forced = -1; /* a path LOOM_CPU_BF16_GEMM or a test chose, or -1 */

loom_bf16_gemm_path loom_cpu_bf16_gemm_path(void) {
  if (g_forced >= 0) return (loom_bf16_gemm_path)g_forced;
  return loom_cpu_bf16_native_available() ? LOOM_BF16_GEMM_NATIVE : LOOM_BF16_GEMM_WIDEN;
}

const char *loom_cpu_bf16_gemm_path_name(loom_bf16_gemm_path path) { return PATH_NAMES[path]; }

bool loom_cpu_bf16_gemm_force(loom_bf16_gemm_path path) {
  if (path == LOOM_BF16_GEMM_NATIVE && !loom_cpu_bf16_native_available()) return false;
  g_forced = (int)path;
  return true;
}

loom_status loom_cpu_bf16_gemm_choose_from_env(loom_error *err) {
  const char *want = getenv(LOOM_CPU_BF16_GEMM_ENV);
  if (!want || !*want) return LOOM_OK;
  for (int path = 0; path < LOOM_BF16_GEMM_PATHS; path++) {
    if (strcasecmp(want, PATH_NAMES[path]) != 0) continue;
    if (!loom_cpu_bf16_gemm_force((loom_bf16_gemm_path)path))
      return loom_fail(err, LOOM_ERR_USAGE, "%s=%s: this CPU has no bf16 instructions oneDNN runs (or loom was built "
                       "without oneDNN)", LOOM_CPU_BF16_GEMM_ENV, want);
    return LOOM_OK;
  }
  return loom_fail(err, LOOM_ERR_USAGE, "%s must be native or widen, got '%s'", LOOM_CPU_BF16_GEMM_ENV, want);
}

/* ---- operand scratch ---- */

/* One growing buffer per operand and thread, kept between calls: a step
 * converts the same few shapes over and over, and a fresh allocation of
 * megabytes each time costs its page faults every time. Host scratch of the
 * CPU backend, as cuBLAS's workspace is the CUDA backend's. */
static _Thread_local struct {
  void *data;
  size_t bytes;
} g_scratch[3]; /* A, B, and an operand two GEMMs share (loom_cpu_bf16_gemm_operand) */

static void *scratch(int which, size_t bytes) {
  if (g_scratch[which].bytes < bytes) {
    free(g_scratch[which].data);
    g_scratch[which].data = loom_xmalloc(bytes, "bf16 GEMM operands");
    g_scratch[which].bytes = bytes;
  }
  return g_scratch[which].data;
}

/* The operand as a path reads it, bf16 bits (native) or fp32 values
 * (widening): itself, or converted into scratch `which` by the CPU
 * backend's exact casts (an fp32 operand holds bf16 values). */
static loom_bf16_operand converted(int which, loom_bf16_operand x, size_t n, bool to_bits) {
  const loom_ops *cpu = loom_ops_cpu();
  if (to_bits && !x.bf16) {
    uint16_t *bits = scratch(which, n * sizeof(uint16_t));
    cpu->to_bf16(cpu, bits, x.f32, n);
    return loom_bf16_bits(bits);
  }
  if (!to_bits && !x.f32) {
    float *wide = scratch(which, n * sizeof(float));
    cpu->from_bf16(cpu, wide, x.bf16, n);
    return loom_bf16_values(wide);
  }
  return x;
}

loom_bf16_operand loom_cpu_bf16_gemm_operand(loom_bf16_gemm_path path, loom_bf16_operand x, size_t n) {
  return converted(2, x, n, path == LOOM_BF16_GEMM_NATIVE);
}

/* ---- widening: the fp32 GEMM on the widened values ---- */

static void run_widened(const loom_gemm_shape *s, loom_bf16_operand A, loom_bf16_operand B, float *C) {
  loom_cpu_gemm_run(loom_cpu_gemm_library(), s, converted(0, A, (size_t)s->M * s->K, false).f32,
                    converted(1, B, (size_t)s->K * s->N, false).f32, C);
}

/* ---- native: oneDNN's matmul, one primitive per shape ---- */

#ifdef LOOM_HAVE_ONEDNN
#define DNNL_CHECK(call) LOOM_CHECK((call) == dnnl_success, "oneDNN: " #call)

typedef struct {
  bool used;
  loom_gemm_shape shape;
  dnnl_primitive_t prim;
  dnnl_memory_t a, b, c;
  char impl[64];
} matmul;

/* Shapes a run asks for: a model's handful of linears times three passes, and benches. */
enum { CACHED = 64 };
static matmul g_cache[CACHED];
static int g_next; /* where a new shape goes once the cache is full */
static dnnl_engine_t g_engine;
static dnnl_stream_t g_stream;

static bool same_shape(const loom_gemm_shape *x, const loom_gemm_shape *y) {
  return x->ta == y->ta && x->tb == y->tb && x->M == y->M && x->N == y->N && x->K == y->K && x->beta == y->beta;
}

static void drop(matmul *mm) {
  if (!mm->used) return;
  dnnl_primitive_destroy(mm->prim);
  dnnl_memory_destroy(mm->a);
  dnnl_memory_destroy(mm->b);
  dnnl_memory_destroy(mm->c);
  mm->used = false;
}

static matmul *primitive_for(const loom_gemm_shape *s) {
  for (int i = 0; i < CACHED; i++)
    if (g_cache[i].used && same_shape(&g_cache[i].shape, s)) return &g_cache[i];
  if (!g_engine) {
    DNNL_CHECK(dnnl_engine_create(&g_engine, dnnl_cpu, 0));
    DNNL_CHECK(dnnl_stream_create(&g_stream, g_engine, dnnl_stream_default_flags));
  }
  matmul *mm = &g_cache[g_next];
  g_next = (g_next + 1) % CACHED;
  drop(mm);
  /* Row-major A [M,K] (stored [K,M] when ta: oneDNN's "ba"), B [K,N] ([N,K] when tb), C [M,N]. */
  dnnl_memory_desc_t a, b, c;
  const dnnl_dims_t da = {s->M, s->K}, db = {s->K, s->N}, dc = {s->M, s->N};
  DNNL_CHECK(dnnl_memory_desc_init_by_tag(&a, 2, da, dnnl_bf16, s->ta ? dnnl_ba : dnnl_ab));
  DNNL_CHECK(dnnl_memory_desc_init_by_tag(&b, 2, db, dnnl_bf16, s->tb ? dnnl_ba : dnnl_ab));
  DNNL_CHECK(dnnl_memory_desc_init_by_tag(&c, 2, dc, dnnl_f32, dnnl_ab));
  dnnl_matmul_desc_t desc;
  DNNL_CHECK(dnnl_matmul_desc_init(&desc, &a, &b, NULL, &c));
  dnnl_primitive_attr_t attr;
  DNNL_CHECK(dnnl_primitive_attr_create(&attr));
  if (s->beta != 0.0f) { /* accumulate: C += A B, oneDNN's sum post-op */
    LOOM_CHECK(s->beta == 1.0f, "a bf16 GEMM's beta is 0 or 1");
    dnnl_post_ops_t po;
    DNNL_CHECK(dnnl_post_ops_create(&po));
    DNNL_CHECK(dnnl_post_ops_append_sum(po, 1.0f));
    DNNL_CHECK(dnnl_primitive_attr_set_post_ops(attr, po));
    dnnl_post_ops_destroy(po);
  }
  dnnl_primitive_desc_t pd;
  DNNL_CHECK(dnnl_primitive_desc_create(&pd, &desc, attr, g_engine, NULL));
  dnnl_primitive_attr_destroy(attr);
  const char *impl = "?";
  DNNL_CHECK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));
  snprintf(mm->impl, sizeof mm->impl, "%s", impl);
  DNNL_CHECK(dnnl_primitive_create(&mm->prim, pd));
  dnnl_primitive_desc_destroy(pd);
  DNNL_CHECK(dnnl_memory_create(&mm->a, &a, g_engine, DNNL_MEMORY_NONE));
  DNNL_CHECK(dnnl_memory_create(&mm->b, &b, g_engine, DNNL_MEMORY_NONE));
  DNNL_CHECK(dnnl_memory_create(&mm->c, &c, g_engine, DNNL_MEMORY_NONE));
  mm->shape = *s;
  mm->used = true;
  return mm;
}

static void run_native(const loom_gemm_shape *s, loom_bf16_operand A, loom_bf16_operand B, float *C) {
  matmul *mm = primitive_for(s);
  DNNL_CHECK(dnnl_memory_set_data_handle(mm->a, (void *)converted(0, A, (size_t)s->M * s->K, true).bf16));
  DNNL_CHECK(dnnl_memory_set_data_handle(mm->b, (void *)converted(1, B, (size_t)s->K * s->N, true).bf16));
  DNNL_CHECK(dnnl_memory_set_data_handle(mm->c, C));
  const dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, mm->a}, {DNNL_ARG_WEIGHTS, mm->b}, {DNNL_ARG_DST, mm->c}};
  DNNL_CHECK(dnnl_primitive_execute(mm->prim, g_stream, 3, args));
  DNNL_CHECK(dnnl_stream_wait(g_stream));
}
#endif

void loom_cpu_bf16_gemm_impl(const loom_gemm_shape *s, char *out, size_t len) {
#ifdef LOOM_HAVE_ONEDNN
  if (loom_cpu_bf16_native_available()) {
    snprintf(out, len, "%s", primitive_for(s)->impl);
    return;
  }
#endif
  snprintf(out, len, "not on this CPU");
}

void loom_cpu_bf16_gemm_describe(loom_bf16_gemm_path path, char *out, size_t len) {
  if (path == LOOM_BF16_GEMM_NATIVE && loom_cpu_bf16_native_available()) {
    const loom_gemm_shape probe = {.M = 64, .N = 64, .K = 64};
    char impl[64];
    loom_cpu_bf16_gemm_impl(&probe, impl, sizeof impl);
    snprintf(out, len, "oneDNN matmul %s", impl);
    return;
  }
  if (path == LOOM_BF16_GEMM_NATIVE) snprintf(out, len, "native: not on this CPU");
  else snprintf(out, len, "widened to fp32, %s sgemm", loom_cpu_gemm_name(loom_cpu_gemm_library()));
}

void loom_cpu_bf16_gemm_run(loom_bf16_gemm_path path, const loom_gemm_shape *s, loom_bf16_operand A,
                            loom_bf16_operand B, float *C) {
  if (loom_cpu_gemm_empty(s->M, s->N, s->K, s->beta, C, s->N)) return; /* its operands may be empty scratch, NULL */
  LOOM_CHECK(!A.bf16 != !A.f32 && !B.bf16 != !B.f32, "a bf16 GEMM operand is bf16 bits or fp32 values, one of them");
#ifdef LOOM_HAVE_ONEDNN
  if (path == LOOM_BF16_GEMM_NATIVE) {
    LOOM_CHECK(loom_cpu_bf16_native_available(), "the native bf16 GEMM runs on this CPU");
    run_native(s, A, B, C);
    return;
  }
#endif
  LOOM_CHECK(path == LOOM_BF16_GEMM_WIDEN, "the native bf16 GEMM needs oneDNN");
  run_widened(s, A, B, C);
}
