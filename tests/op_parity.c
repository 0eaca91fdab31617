/* The parity cases, written once for every backend. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/fp8_math.h"
#include "backend/op_math.h"
#include "op_parity.h"
#include "tensor_parallel/fp8_linear.h"
#include "test_util.h"

enum { SENTINELS = 16 };
#define SENTINEL 1234.5f

/* A host array (what the reference backend sees) and the backend's copy, with sentinels after it. */
typedef struct {
  const op_backend *b;
  float *host, *dev;
  size_t n;
} mirror;

static uint64_t g_stream = 1;

static mirror make(const op_backend *b, size_t n, float lo, float hi) {
  mirror m = {b, malloc((n + 1) * sizeof(float)), b->ops->mem->zalloc(b->ops->mem, (n + SENTINELS) * sizeof(float), "test"), n};
  tu_fill(m.host, n, g_stream++, lo, hi);
  float *staged = malloc((n + SENTINELS) * sizeof(float));
  memcpy(staged, m.host, n * sizeof(float));
  for (int i = 0; i < SENTINELS; i++) staged[n + i] = SENTINEL;
  b->ops->mem->from_host(b->ops->mem, m.dev, staged, (n + SENTINELS) * sizeof(float));
  free(staged);
  return m;
}

static void drop(mirror *m) {
  free(m->host);
  m->b->ops->mem->release(m->b->ops->mem, m->dev);
}

static void drop_all(mirror **all, size_t n) {
  for (size_t i = 0; i < n; i++) drop(all[i]);
}

static int *make_ints(const op_backend *b, const int *host, size_t n) {
  int *d = b->ops->mem->zalloc(b->ops->mem, n * sizeof(int), "test");
  b->ops->mem->from_host(b->ops->mem, d, host, n * sizeof(int));
  return d;
}

static void failed(op_report *r, const char *fmt, const char *op, double a, double b) {
  if (r->failures++ == 0) snprintf(r->first, sizeof r->first, fmt, op, a, b);
}

/* The backend's result against the reference one: NMSE within tol, sentinels intact, all finite. */
static void expect(op_report *r, const char *op, const mirror *m, double tol) {
  float *got = malloc((m->n + SENTINELS) * sizeof(float));
  m->b->ops->mem->to_host(m->b->ops->mem, got, m->dev, (m->n + SENTINELS) * sizeof(float));
  const double e = m->n ? tu_nmse(got, m->host, m->n) : 0.0; /* an empty output: only its sentinels (nothing written) */
  int sentinels_ok = 1;
  for (int i = 0; i < SENTINELS; i++) sentinels_ok &= got[m->n + i] == SENTINEL;
  r->checks++;
  if (!sentinels_ok) failed(r, "%s wrote past its end (%g, %g)", op, 0, 0);
  else if (!tu_all_finite(got, m->n)) failed(r, "%s produced NaN or Inf (%g, %g)", op, 0, 0);
  else if (!(e <= tol)) failed(r, "%s: NMSE %.3g against the reference, over %.1g", op, e, tol);
  free(got);
}

static void expect_ints(op_report *r, const op_backend *b, const char *op, const int *dev, const int *want, size_t n) {
  int *got = malloc(n * sizeof(int));
  b->ops->mem->to_host(b->ops->mem, got, dev, n * sizeof(int));
  r->checks++;
  if (memcmp(got, want, n * sizeof(int)) != 0) failed(r, "%s: indices differ from the reference (%g, %g)", op, 0, 0);
  free(got);
}

/* ---- the cases ---- */

static void matmul(const op_backend *b, op_report *r) {
  const loom_ops *ref = loom_ops_ref(), *op = b->ops;
  const int N = 37, C = 61, OC = 53;
  mirror inp = make(b, (size_t)N * C, -1, 1), w = make(b, (size_t)OC * C, -1, 1), bias = make(b, OC, -1, 1),
         out = make(b, (size_t)N * OC, 0, 0);
  ref->matmul_forward(ref, out.host, inp.host, w.host, bias.host, N, C, OC);
  op->matmul_forward(op, out.dev, inp.dev, w.dev, bias.dev, N, C, OC);
  expect(r, "matmul_forward (bias)", &out, b->fp32_nmse);
  ref->matmul_forward(ref, out.host, inp.host, w.host, NULL, N, C, OC);
  op->matmul_forward(op, out.dev, inp.dev, w.dev, NULL, N, C, OC);
  expect(r, "matmul_forward (no bias)", &out, b->fp32_nmse);
  /* Backward adds into grads that start nonzero. */
  mirror dout = make(b, (size_t)N * OC, -1, 1), dinp = make(b, (size_t)N * C, -1, 1), dw = make(b, (size_t)OC * C, -1, 1),
         db = make(b, OC, -1, 1);
  ref->matmul_backward(ref, dinp.host, dw.host, db.host, dout.host, inp.host, w.host, N, C, OC);
  op->matmul_backward(op, dinp.dev, dw.dev, db.dev, dout.dev, inp.dev, w.dev, N, C, OC);
  expect(r, "matmul_backward dinp", &dinp, b->fp32_nmse);
  expect(r, "matmul_backward dweight", &dw, b->fp32_nmse);
  expect(r, "matmul_backward dbias", &db, b->fp32_nmse);
  mirror *all[] = {&inp, &w, &bias, &out, &dout, &dinp, &dw, &db};
  drop_all(all, sizeof all / sizeof *all);
}

static void layernorm(const op_backend *b, op_report *r) {
  const loom_ops *ref = loom_ops_ref(), *op = b->ops;
  const int N = 29, C = 67;
  const size_t n = (size_t)N * C;
  mirror x = make(b, n, -2, 2), w = make(b, C, 0.5f, 1.5f), bias = make(b, C, -1, 1), out = make(b, n, 0, 0),
         mean = make(b, N, 0, 0), rstd = make(b, N, 0, 0);
  ref->layernorm_forward(ref, out.host, mean.host, rstd.host, x.host, w.host, bias.host, N, C, 1e-5f);
  op->layernorm_forward(op, out.dev, mean.dev, rstd.dev, x.dev, w.dev, bias.dev, N, C, 1e-5f);
  expect(r, "layernorm_forward out", &out, b->fp32_nmse);
  expect(r, "layernorm_forward mean", &mean, b->fp32_nmse);
  expect(r, "layernorm_forward rstd", &rstd, b->fp32_nmse);
  mirror dy = make(b, n, -1, 1), dx = make(b, n, -1, 1), dw = make(b, C, -1, 1), db = make(b, C, -1, 1);
  ref->layernorm_backward(ref, dx.host, dw.host, db.host, dy.host, x.host, w.host, mean.host, rstd.host, N, C);
  op->layernorm_backward(op, dx.dev, dw.dev, db.dev, dy.dev, x.dev, w.dev, mean.dev, rstd.dev, N, C);
  expect(r, "layernorm_backward dinp", &dx, b->fp32_nmse);
  expect(r, "layernorm_backward dweight", &dw, b->fp32_nmse);
  expect(r, "layernorm_backward dbias", &db, b->fp32_nmse);
  mirror *all[] = {&x, &w, &bias, &out, &mean, &rstd, &dy, &dx, &dw, &db};
  drop_all(all, sizeof all / sizeof *all);
}

static void rmsnorm(const op_backend *b, op_report *r) {
  const loom_ops *ref = loom_ops_ref(), *op = b->ops;
  const int N = 29, C = 67;
  const size_t n = (size_t)N * C;
  mirror x = make(b, n, -2, 2), w = make(b, C, 0.5f, 1.5f), out = make(b, n, 0, 0), rstd = make(b, N, 0, 0);
  ref->rmsnorm_forward(ref, out.host, rstd.host, x.host, w.host, N, C, 1e-5f);
  op->rmsnorm_forward(op, out.dev, rstd.dev, x.dev, w.dev, N, C, 1e-5f);
  expect(r, "rmsnorm_forward out", &out, b->fp32_nmse);
  expect(r, "rmsnorm_forward rstd", &rstd, b->fp32_nmse);
  mirror dy = make(b, n, -1, 1), dx = make(b, n, -1, 1), dw = make(b, C, -1, 1);
  ref->rmsnorm_backward(ref, dx.host, dw.host, dy.host, x.host, w.host, rstd.host, N, C);
  op->rmsnorm_backward(op, dx.dev, dw.dev, dy.dev, x.dev, w.dev, rstd.dev, N, C);
  expect(r, "rmsnorm_backward dinp", &dx, b->fp32_nmse);
  expect(r, "rmsnorm_backward dweight", &dw, b->fp32_nmse);
  mirror *all[] = {&x, &w, &out, &rstd, &dy, &dx, &dw};
  drop_all(all, sizeof all / sizeof *all);
}

static void swiglu(const op_backend *b, op_report *r) {
  const loom_ops *ref = loom_ops_ref(), *op = b->ops;
  const int N = 37, F = 611; /* past the CPU backend's threshold for threads */
  const size_t n = (size_t)N * F;
  mirror x = make(b, 2 * n, -6, 6), out = make(b, n, 0, 0), dy = make(b, n, -1, 1), dx = make(b, 2 * n, -1, 1);
  /* SwiGLU, then GPT-OSS's unit: alpha 1.702, clamp 0.7 (inside the inputs' range, so both clamps bite), offset 1 */
  const loom_glu units[2] = {{0}, {.alpha = 1.702f, .clamp = 0.7f, .offset = 1.0f}};
  for (int u = 0; u < 2; u++) {
    ref->swiglu_forward(ref, out.host, x.host, N, F, units[u]);
    op->swiglu_forward(op, out.dev, x.dev, N, F, units[u]);
    expect(r, u ? "swiglu_forward, GPT-OSS's clamped unit" : "swiglu_forward", &out, b->fp32_nmse);
    ref->swiglu_backward(ref, dx.host, dy.host, x.host, N, F, units[u]);
    op->swiglu_backward(op, dx.dev, dy.dev, x.dev, N, F, units[u]);
    expect(r, u ? "swiglu_backward, GPT-OSS's clamped unit" : "swiglu_backward", &dx, b->fp32_nmse);
  }
  mirror *all[] = {&x, &out, &dy, &dx};
  drop_all(all, sizeof all / sizeof *all);
}

/* q and k of 6 + 2 heads turned in a qkv row of 6 + 2 * 2 heads (grouped-query), v left alone; positions from 40. */
/* RoPE forward then backward under one scaling, each against the reference. */
static void rope_turns(const op_backend *b, op_report *r, mirror *x, int T, int B, int stride, int heads, int D,
                       loom_rope forward, loom_rope backward, const char *forward_name, const char *backward_name) {
  const loom_ops *ref = loom_ops_ref(), *op = b->ops;
  ref->rope_forward(ref, x->host, T, B, stride, heads, D, 40, forward);
  op->rope_forward(op, x->dev, T, B, stride, heads, D, 40, forward);
  expect(r, forward_name, x, b->fp32_nmse);
  ref->rope_backward(ref, x->host, T, B, stride, heads, D, 40, backward);
  op->rope_backward(op, x->dev, T, B, stride, heads, D, 40, backward);
  expect(r, backward_name, x, b->fp32_nmse);
}

static void rope(const op_backend *b, op_report *r) {
  const int T = 33, B = 3, D = 16, heads = 6 + 2, stride = (6 + 2 * 2) * D;
  mirror x = make(b, (size_t)T * B * stride, -2, 2);
  const loom_rope plain = {.theta = 10000.0f}, llama31 = {.theta = 500000.0f, .factor = 8.0f, .low_freq_factor = 1.0f,
                                                         .high_freq_factor = 4.0f, .original_max_position = 64};
  rope_turns(b, r, &x, T, B, stride, heads, D, plain, (loom_rope){.theta = 500000.0f}, "rope_forward", "rope_backward");
  /* Scaled as Llama 3.1 (its 8192 original positions shrunk to 64, so a 16-wide head has all three bands). */
  rope_turns(b, r, &x, T, B, stride, heads, D, llama31, llama31, "rope_forward, llama3 scaling", "rope_backward, llama3 scaling");
  /* YaRN as GPT-OSS's (its 4096 original positions shrunk to 64: the ramp spans a 16-wide head's dims), with its
   * attention factor. */
  const loom_rope yarn = {.theta = 150000.0f, .factor = 32.0f, .original_max_position = 64, .yarn = 1, .beta_fast = 32.0f,
                          .beta_slow = 1.0f, .attention_factor = 1.3466f};
  rope_turns(b, r, &x, T, B, stride, heads, D, yarn, yarn, "rope_forward, yarn scaling", "rope_backward, yarn scaling");
  drop(&x);
}

static void gelu(const op_backend *b, op_report *r) {
  const loom_ops *ref = loom_ops_ref(), *op = b->ops;
  const size_t n = 40001; /* past the CPU backend's threshold for threads */
  mirror x = make(b, n, -6, 6), out = make(b, n, 0, 0), dy = make(b, n, -1, 1), dx = make(b, n, -1, 1);
  ref->gelu_forward(ref, out.host, x.host, n);
  op->gelu_forward(op, out.dev, x.dev, n);
  expect(r, "gelu_forward", &out, b->fp32_nmse);
  ref->gelu_backward(ref, dx.host, dy.host, x.host, n);
  op->gelu_backward(op, dx.dev, dy.dev, x.dev, n);
  expect(r, "gelu_backward", &dx, b->fp32_nmse);
  mirror *all[] = {&x, &out, &dy, &dx};
  drop_all(all, sizeof all / sizeof *all);
}

static void elementwise(const op_backend *b, op_report *r) {
  const loom_ops *ref = loom_ops_ref(), *op = b->ops;
  const size_t n = 40001; /* past the CPU backend's threshold for threads */
  mirror x = make(b, n, -2, 2), y = make(b, n, -1, 1), out = make(b, n, 0, 0);
  ref->add(ref, out.host, x.host, y.host, n);
  op->add(op, out.dev, x.dev, y.dev, n);
  expect(r, "add", &out, 0.0);
  ref->accumulate(ref, out.host, y.host, n);
  op->accumulate(op, out.dev, y.dev, n);
  expect(r, "accumulate", &out, 0.0);
  const double want = ref->sumsq(ref, x.host, n), got = op->sumsq(op, x.dev, n);
  r->checks++;
  if (!(fabs(got - want) <= 1e-9 * want)) failed(r, "%s: %.12g against the reference's %.12g", "sumsq", got, want);
  /* The batch: each array as sumsq sums it, an empty one included. */
  const float *xs[3] = {x.dev, y.dev, out.dev};
  const size_t ns[3] = {n, 0, 1001};
  double sums[3] = {-1, -1, -1};
  op->sumsq_batch(op, xs, ns, 3, sums);
  for (int i = 0; i < 3; i++) {
    r->checks++;
    const double one = op->sumsq(op, xs[i], ns[i]);
    if (!(sums[i] == one)) failed(r, "%s: %.12g where sumsq gives %.12g", "sumsq_batch", sums[i], one);
  }
  mirror *all[] = {&x, &y, &out};
  drop_all(all, sizeof all / sizeof *all);
}

/* Every transpose pair with alpha and beta; beta 0 must ignore NaN in c. */
static void gemm(const op_backend *b, op_report *r) {
  const loom_ops *ref = loom_ops_ref(), *op = b->ops;
  const int M = 23, N = 41, K = 37;
  for (int t = 0; t < 4; t++) {
    const bool ta = t & 1, tb = t & 2;
    const float beta = t == 3 ? 0.0f : 0.5f;
    mirror a = make(b, (size_t)M * K, -1, 1), bm = make(b, (size_t)K * N, -1, 1), c = make(b, (size_t)M * N, -1, 1);
    if (beta == 0.0f) {
      for (size_t i = 0; i < c.n; i++) c.host[i] = NAN;
      op->mem->from_host(op->mem, c.dev, c.host, c.n * sizeof(float));
    }
    ref->gemm(ref, ta, tb, M, N, K, -0.75f, a.host, bm.host, beta, c.host);
    op->gemm(op, ta, tb, M, N, K, -0.75f, a.dev, bm.dev, beta, c.dev);
    const char *names[] = {"gemm NN", "gemm TN", "gemm NT", "gemm TT, beta 0 over NaN"};
    expect(r, names[t], &c, b->fp32_nmse);
    mirror *all[] = {&a, &bm, &c};
    drop_all(all, sizeof all / sizeof *all);
  }
}

/* Random columns and one zero column: the reference's result has orthonormal
 * columns (checked here, so the reference itself is held to it) and the
 * zero column stays zero. */
static void orthonormalize(const op_backend *b, op_report *r) {
  const loom_ops *ref = loom_ops_ref(), *op = b->ops;
  const int n = 301, k = 6, zero = 3;
  mirror x = make(b, (size_t)n * k, -1, 1);
  for (int i = 0; i < n; i++) x.host[(size_t)i * k + zero] = 0.0f;
  op->mem->from_host(op->mem, x.dev, x.host, x.n * sizeof(float));
  ref->orthonormalize(ref, x.host, n, k);
  op->orthonormalize(op, x.dev, n, k);
  double worst = 0.0;
  for (int p = 0; p < k; p++)
    for (int q = 0; q < k; q++) {
      double dot = 0.0;
      for (int i = 0; i < n; i++) dot += (double)x.host[(size_t)i * k + p] * x.host[(size_t)i * k + q];
      const double want = p == q && p != zero ? 1.0 : 0.0;
      if (fabs(dot - want) > worst) worst = fabs(dot - want);
    }
  r->checks++;
  if (!(worst <= 1e-5)) failed(r, "%s: the reference's columns are off orthonormal by %g (%g)", "orthonormalize", worst, 0);
  expect(r, "orthonormalize", &x, b->fp32_nmse);
  drop(&x);
}

/* The signs bit for bit (a zero counts as positive), the mean within
 * summation order, and unpacking adds weight * mean * sign. */
static void sign_compression(const op_backend *b, op_report *r) {
  const loom_ops *ref = loom_ops_ref(), *op = b->ops;
  const size_t n = 40001, words = loom_sign_message_words(n);
  mirror x = make(b, n, -1, 1), y = make(b, n, -1, 1);
  x.host[7] = 0.0f;
  op->mem->from_host(op->mem, x.dev, x.host, n * sizeof(float));
  uint32_t *want = malloc(words * sizeof *want), *got = malloc(words * sizeof *got);
  uint32_t *dev = op->mem->zalloc(op->mem, words * sizeof *dev, "test");
  ref->sign_pack(ref, want, x.host, n);
  op->sign_pack(op, dev, x.dev, n);
  op->mem->to_host(op->mem, got, dev, words * sizeof *got);
  float mw, mg;
  memcpy(&mw, &want[0], sizeof mw);
  memcpy(&mg, &got[0], sizeof mg);
  r->checks += 2;
  if (memcmp(want + 1, got + 1, (words - 1) * sizeof *got) != 0) failed(r, "%s: the sign bits differ (%g, %g)", "sign_pack", 0, 0);
  if (!(fabs(mg - mw) <= 1e-6 * fabs(mw) && mw > 0.4f && mw < 0.6f))
    failed(r, "%s: mean magnitude %g against the reference's %g", "sign_pack", mg, mw);
  ref->sign_unpack_add(ref, y.host, want, n, -0.5f);
  op->sign_unpack_add(op, y.dev, dev, n, -0.5f);
  expect(r, "sign_unpack_add", &y, b->fp32_nmse);
  op->mem->release(op->mem, dev);
  free(want);
  free(got);
  mirror *all[] = {&x, &y};
  drop_all(all, sizeof all / sizeof *all);
}

/* The experts' linears over their rows: four experts, one with none,
 * against the reference; and the empty expert's weight grad untouched. */
static void grouped_matmul(const op_backend *b, op_report *r) {
  const loom_ops *ref = loom_ops_ref(), *op = b->ops;
  enum { E = 4, C = 17, OC = 11 };
  const int counts[E] = {3, 0, 5, 2}, M = 10;
  mirror inp = make(b, (size_t)M * C, -1, 1), w = make(b, (size_t)E * OC * C, -1, 1), out = make(b, (size_t)M * OC, 0, 0);
  mirror dout = make(b, (size_t)M * OC, -1, 1), dinp = make(b, (size_t)M * C, -1, 1), dw = make(b, (size_t)E * OC * C, -1, 1);
  ref->grouped_matmul_forward(ref, out.host, inp.host, w.host, counts, E, C, OC);
  op->grouped_matmul_forward(op, out.dev, inp.dev, w.dev, counts, E, C, OC);
  expect(r, "grouped_matmul_forward", &out, b->fp32_nmse);
  /* The reference's grouping itself: each expert's rows times its own matrix, written out here. */
  float alone[M * OC];
  for (int e = 0, row = 0; e < E; row += counts[e], e++)
    if (counts[e]) ref->matmul_forward(ref, alone + row * OC, inp.host + row * C, w.host + e * OC * C, NULL, counts[e], C, OC);
  r->checks++;
  if (memcmp(alone, out.host, sizeof alone) != 0) failed(r, "%s: not each expert's rows times its matrix (%g, %g)",
                                                         "grouped_matmul_forward", alone[0], out.host[0]);
  const float empty_before = dw.host[(size_t)OC * C]; /* expert 1's first weight grad */
  ref->grouped_matmul_backward(ref, dinp.host, dw.host, dout.host, inp.host, w.host, counts, E, C, OC);
  op->grouped_matmul_backward(op, dinp.dev, dw.dev, dout.dev, inp.dev, w.dev, counts, E, C, OC);
  expect(r, "grouped_matmul_backward dinp", &dinp, b->fp32_nmse);
  expect(r, "grouped_matmul_backward dweight", &dw, b->fp32_nmse);
  r->checks++;
  if (dw.host[(size_t)OC * C] != empty_before) failed(r, "%s: the empty expert's grad moved (%g, %g)", "grouped_matmul_backward",
                                                      dw.host[(size_t)OC * C], empty_before);
  mirror *all[] = {&inp, &w, &out, &dout, &dinp, &dw};
  drop_all(all, sizeof all / sizeof *all);
}

/* Mixture-of-experts rows: 7 tokens to 2 experts each, gathered into a
 * shuffled expert order, combined back with weights (two slots dropped),
 * and the combine's backward, against the reference. */
static void moe_rows(const op_backend *b, op_report *r) {
  const loom_ops *ref = loom_ops_ref(), *op = b->ops;
  enum { N = 7, K = 2, C = 37, M = N * K };
  int rows[M], slots[M];
  for (int i = 0; i < M; i++) rows[i] = (i * 5 + 3) % N;             /* each token twice, in a shuffled order */
  for (int i = 0; i < M; i++) slots[i] = (i * 9 + 4) % M;            /* a permutation of the M rows */
  slots[3] = slots[10] = -1;                                          /* two tokens dropped by their expert */
  int *drows = make_ints(b, rows, M), *dslots = make_ints(b, slots, M);
  mirror x = make(b, (size_t)N * C, -1, 1), g = make(b, (size_t)M * C, 0, 0), w = make(b, M, 0, 1);
  mirror y = make(b, (size_t)N * C, 0, 0), dy = make(b, (size_t)N * C, -1, 1), dx = make(b, (size_t)M * C, 0, 0),
         dw = make(b, M, 0, 0), back = make(b, (size_t)N * C, 0, 0);
  ref->rows_gather(ref, g.host, x.host, rows, M, C);
  op->rows_gather(op, g.dev, x.dev, drows, M, C);
  expect(r, "rows_gather", &g, 0.0);
  ref->rows_combine(ref, y.host, g.host, slots, w.host, N, K, C);
  op->rows_combine(op, y.dev, g.dev, dslots, w.dev, N, K, C);
  expect(r, "rows_combine", &y, b->fp32_nmse);
  ref->rows_combine(ref, back.host, g.host, slots, NULL, N, K, C);
  op->rows_combine(op, back.dev, g.dev, dslots, NULL, N, K, C);
  expect(r, "rows_combine (unweighted)", &back, b->fp32_nmse);
  ref->rows_combine_backward(ref, dx.host, dw.host, dy.host, g.host, slots, w.host, N, K, C);
  op->rows_combine_backward(op, dx.dev, dw.dev, dy.dev, g.dev, dslots, w.dev, N, K, C);
  expect(r, "rows_combine_backward (dx)", &dx, b->fp32_nmse);
  expect(r, "rows_combine_backward (dw)", &dw, b->fp32_nmse);
  mirror *all[] = {&x, &g, &w, &y, &dy, &dx, &dw, &back};
  drop_all(all, sizeof all / sizeof *all);
  op->mem->release(op->mem, drows);
  op->mem->release(op->mem, dslots);
}

/* The same keyed mask, bit for bit: zeros where the reference has them. */
static void dropout(const op_backend *b, op_report *r) {
  const loom_ops *ref = loom_ops_ref(), *op = b->ops;
  const int T = 29, B = 2, C = 33;
  const size_t n = (size_t)T * B * C;
  const loom_dropout d = {.p = 0.3f, .seed = 7, .stream = 99, .sample_offset = 3, .seq_offset = 2, .seq_total = 40};
  mirror x = make(b, n, -2, 2), dx = make(b, n, -1, 1);
  ref->dropout_forward(ref, x.host, T, B, C, &d);
  op->dropout_forward(op, x.dev, T, B, C, &d);
  expect(r, "dropout_forward (keyed mask)", &x, b->fp32_nmse); /* a mask that differs anywhere is far past it */
  ref->dropout_backward(ref, dx.host, T, B, C, &d);
  op->dropout_backward(op, dx.dev, T, B, C, &d);
  expect(r, "dropout_backward (keyed mask)", &dx, b->fp32_nmse);
  mirror *all[] = {&x, &dx};
  drop_all(all, sizeof all / sizeof *all);
}

static void bias(const op_backend *b, op_report *r) {
  const loom_ops *ref = loom_ops_ref(), *op = b->ops;
  const int N = 70, OC = 130; /* not multiples of the CPU backend's 64-column blocks */
  mirror out = make(b, (size_t)N * OC, -1, 1), bias = make(b, OC, -1, 1), dy = make(b, (size_t)N * OC, -1, 1),
         db = make(b, OC, -1, 1);
  ref->bias_forward(ref, out.host, bias.host, N, OC);
  op->bias_forward(op, out.dev, bias.dev, N, OC);
  expect(r, "bias_forward", &out, 0.0);
  ref->bias_backward(ref, db.host, dy.host, N, OC);
  op->bias_backward(op, db.dev, dy.dev, N, OC);
  expect(r, "bias_backward", &db, b->fp32_nmse);
  mirror *all[] = {&out, &bias, &dy, &db};
  drop_all(all, sizeof all / sizeof *all);
}

/* Head widths: every head 8 wide under the default scale, or multi-head
 * latent attention's q and k wider than v (and the other way round, and
 * past a warp's 32 lanes) under a scale of its own. */
typedef struct {
  int head_dim, v_head_dim;
  float softmax_scale;
} head_dims;
static const head_dims EQUAL_HEADS = {8, 0, 0.0f}, MLA_HEADS = {12, 8, 0.37f}, WIDE_V_HEADS = {8, 12, 0.0f},
                       WIDE_HEADS = {48, 40, 0.11f};

/* An attention's shape over two micro-batches, a sliding window of `window` keys back (0: none). */
static loom_attn_shape attn_case(int T, int heads, int kv_heads, int window, head_dims dims) {
  return (loom_attn_shape){.T = T, .B = 2, .heads = heads, .kv_heads = kv_heads, .head_dim = dims.head_dim,
                           .v_head_dim = dims.v_head_dim, .softmax_scale = dims.softmax_scale, .head_offset = 1,
                           .total_heads = 2 * heads, .window = window};
}

/* Multi-head (3 heads), or grouped-query (6 query heads over 2 key/value
 * heads); under a sliding window of `window` keys back (0: none). */
static void attention_of(const op_backend *b, op_report *r, float p, int heads, int kv_heads, int window, int T,
                         head_dims dims) {
  const loom_ops *ref = loom_ops_ref(), *op = b->ops;
  const loom_attn_shape s = attn_case(T, heads, kv_heads, window, dims);
  const loom_dropout d = {.p = p, .seed = 11, .stream = 5, .sample_offset = 4};
  const size_t width = loom_attn_out_width(&s), w3 = loom_attn_qkv_width(&s), rows = (size_t)s.T * s.B,
               lses = (size_t)s.B * s.heads * s.T;
  mirror qkv = make(b, rows * w3, -1, 1), out = make(b, rows * width, 0, 0), lse = make(b, lses, 0, 0);
  ref->attention_forward(ref, out.host, lse.host, qkv.host, &s, &d);
  op->attention_forward(op, out.dev, lse.dev, qkv.dev, &s, &d);
  expect(r, "attention_forward out", &out, b->fp32_nmse);
  expect(r, "attention_forward log-sum-exps", &lse, b->fp32_nmse);
  mirror dout = make(b, rows * width, -1, 1), dqkv = make(b, rows * w3, -1, 1);
  ref->attention_backward(ref, dqkv.host, dout.host, out.host, qkv.host, lse.host, &s, &d);
  op->attention_backward(op, dqkv.dev, dout.dev, out.dev, qkv.dev, lse.dev, &s, &d);
  expect(r, "attention_backward dqkv", &dqkv, b->fp32_nmse);
  mirror *all[] = {&qkv, &out, &lse, &dout, &dqkv};
  drop_all(all, sizeof all / sizeof *all);
}

static void attention_at(const op_backend *b, op_report *r, float p, int heads, int kv_heads, int window) {
  attention_of(b, r, p, heads, kv_heads, window, 17, EQUAL_HEADS);
}

static void attention(const op_backend *b, op_report *r) {
  attention_at(b, r, 0.0f, 3, 3, 0);
  attention_at(b, r, 0.0f, 6, 2, 0);
  attention_at(b, r, 0.0f, 4, 1, 0);
}
static void attention_dropout(const op_backend *b, op_report *r) {
  attention_at(b, r, 0.3f, 3, 3, 0);
  attention_at(b, r, 0.3f, 6, 2, 0);
}
/* Sliding windows: 4 keys back (shorter than a tile of the fused kernels' 32 rows), 40 (past T: every key), and
 * under dropout; over 80 rows, windows of 20 and 40, whose later query tiles start past key tile 0 and whose early
 * key tiles end before the last query tile. */
static void attention_windows(const op_backend *b, op_report *r) {
  attention_at(b, r, 0.0f, 6, 2, 4);
  attention_at(b, r, 0.0f, 3, 3, 40);
  attention_at(b, r, 0.3f, 4, 1, 4);
  attention_of(b, r, 0.0f, 2, 1, 20, 80, EQUAL_HEADS);
  attention_of(b, r, 0.3f, 2, 2, 40, 80, EQUAL_HEADS);
}
/* Multi-head latent attention's shapes: q and k wider than v under a scale of their own, with dropout and a
 * window; v wider; both past a warp (48 and 40) over 80 rows. */
static void attention_head_dims(const op_backend *b, op_report *r) {
  attention_of(b, r, 0.0f, 3, 3, 0, 17, MLA_HEADS);
  attention_of(b, r, 0.3f, 6, 2, 4, 17, MLA_HEADS);
  attention_of(b, r, 0.0f, 4, 1, 0, 17, WIDE_V_HEADS);
  attention_of(b, r, 0.0f, 2, 2, 20, 80, WIDE_HEADS);
}

/* Context-parallel attention's blocks: 6 query rows (two chunks of a
 * longer sequence) against two blocks of 4 keys, the second merged into
 * the first; three rows see none of the first block's keys. */
static void attention_blocks_of(const op_backend *b, op_report *r, float p, int heads, int kv_heads, int window,
                                head_dims dims) {
  const loom_ops *ref = loom_ops_ref(), *op = b->ops;
  enum { TQ = 6, TK = 4 };
  const loom_attn_shape s = attn_case(16, heads, kv_heads, window, dims);
  const loom_dropout d = {.p = p, .seed = 11, .stream = 5, .sample_offset = 4};
  const int q_pos[TQ] = {4, 5, 6, 9, 10, 11}, k_pos[2][TK] = {{7, 8, 14, 15}, {0, 1, 2, 3}};
  const size_t width = loom_attn_out_width(&s), w3 = loom_attn_qkv_width(&s), kvw = loom_attn_kv_width(&s);
  mirror q = make(b, (size_t)TQ * s.B * w3, -1, 1), out = make(b, (size_t)TQ * s.B * width, 0, 0);
  mirror lse = make(b, (size_t)s.B * s.heads * TQ, 0, 0), dout = make(b, (size_t)TQ * s.B * width, -1, 1);
  mirror dq = make(b, (size_t)TQ * s.B * w3, -1, 1), kv[2], dkv[2];
  for (int k = 0; k < 2; k++) kv[k] = make(b, (size_t)TK * s.B * kvw, -1, 1), dkv[k] = make(b, (size_t)TK * s.B * kvw, -1, 1);
  for (int k = 0; k < 2; k++) {
    ref->attention_block_forward(ref, out.host, lse.host, q.host, kv[k].host, TQ, TK, q_pos, k_pos[k], &s, &d, k == 0);
    op->attention_block_forward(op, out.dev, lse.dev, q.dev, kv[k].dev, TQ, TK, q_pos, k_pos[k], &s, &d, k == 0);
  }
  expect(r, "attention_block_forward out", &out, b->fp32_nmse);
  expect(r, "attention_block_forward log-sum-exps", &lse, b->fp32_nmse);
  for (int k = 0; k < 2; k++) {
    ref->attention_block_backward(ref, dq.host, dkv[k].host, dout.host, out.host, q.host, kv[k].host, TQ, TK, q_pos, k_pos[k],
                                  lse.host, &s, &d);
    op->attention_block_backward(op, dq.dev, dkv[k].dev, dout.dev, out.dev, q.dev, kv[k].dev, TQ, TK, q_pos, k_pos[k], lse.dev,
                                 &s, &d);
  }
  expect(r, "attention_block_backward dq", &dq, b->fp32_nmse);
  expect(r, "attention_block_backward dkv (first block)", &dkv[0], b->fp32_nmse);
  expect(r, "attention_block_backward dkv (second block)", &dkv[1], b->fp32_nmse);
  mirror *all[] = {&q, &out, &lse, &dout, &dq, &kv[0], &kv[1], &dkv[0], &dkv[1]};
  drop_all(all, sizeof all / sizeof *all);
}

static void attention_blocks_at(const op_backend *b, op_report *r, float p, int heads, int kv_heads, int window) {
  attention_blocks_of(b, r, p, heads, kv_heads, window, EQUAL_HEADS);
}

static void attention_blocks(const op_backend *b, op_report *r) {
  attention_blocks_at(b, r, 0.0f, 3, 3, 0);
  attention_blocks_at(b, r, 0.0f, 6, 2, 0);
  attention_blocks_at(b, r, 0.3f, 4, 1, 0);
  /* A window of 3 keys back, smaller than a block of 4: rows see stretches of a block (the row at 6 only key 3),
   * the rows at 9 to 11 none of the second block's keys (0..3) */
  attention_blocks_at(b, r, 0.0f, 6, 2, 3);
  attention_blocks_at(b, r, 0.3f, 4, 1, 3);
  /* multi-head latent attention's head widths */
  attention_blocks_of(b, r, 0.0f, 3, 3, 0, MLA_HEADS);
  attention_blocks_of(b, r, 0.3f, 6, 2, 3, MLA_HEADS);
  attention_blocks_of(b, r, 0.0f, 4, 1, 0, WIDE_HEADS);
}

/* Attention sinks over a whole attention (learnable logits, and NULL:
 * Megatron's off-by-one), then the attention's backward through them;
 * and over a ring block whose rows 0 and 3 see none of its keys (their
 * lse -inf: the sink's logit alone, the output 0). */
static void attention_sinks_at(const op_backend *b, op_report *r, bool learnable, head_dims dims) {
  const loom_ops *ref = loom_ops_ref(), *op = b->ops;
  const loom_attn_shape s = attn_case(17, 6, 2, 0, dims);
  const size_t width = loom_attn_out_width(&s), w3 = loom_attn_qkv_width(&s), rows = (size_t)s.T * s.B,
               lses = (size_t)s.B * s.heads * s.T;
  mirror qkv = make(b, rows * w3, -1, 1), out = make(b, rows * width, 0, 0), lse = make(b, lses, 0, 0);
  mirror sinks = make(b, (size_t)s.heads, -2, 2), dsinks = make(b, (size_t)s.heads, -1, 1);
  ref->attention_forward(ref, out.host, lse.host, qkv.host, &s, NULL);
  op->attention_forward(op, out.dev, lse.dev, qkv.dev, &s, NULL);
  ref->attention_sink_forward(ref, out.host, lse.host, learnable ? sinks.host : NULL, &s);
  op->attention_sink_forward(op, out.dev, lse.dev, learnable ? sinks.dev : NULL, &s);
  expect(r, learnable ? "attention_sink_forward out" : "attention_sink_forward out (off by one)", &out, b->fp32_nmse);
  expect(r, learnable ? "attention_sink_forward log-sum-exps" : "attention_sink_forward log-sum-exps (off by one)", &lse,
         b->fp32_nmse);
  mirror dout = make(b, rows * width, -1, 1), dqkv = make(b, rows * w3, -1, 1);
  ref->attention_sink_backward(ref, dsinks.host, dout.host, out.host, lse.host, learnable ? sinks.host : NULL, &s);
  op->attention_sink_backward(op, dsinks.dev, dout.dev, out.dev, lse.dev, learnable ? sinks.dev : NULL, &s);
  expect(r, "attention_sink_backward dsinks", &dsinks, b->fp32_nmse);
  ref->attention_backward(ref, dqkv.host, dout.host, out.host, qkv.host, lse.host, &s, NULL);
  op->attention_backward(op, dqkv.dev, dout.dev, out.dev, qkv.dev, lse.dev, &s, NULL);
  expect(r, "attention_backward dqkv after sinks", &dqkv, b->fp32_nmse);
  enum { TQ = 6, TK = 4 };
  const int q_pos[TQ] = {4, 8, 9, 5, 12, 13}, k_pos[TK] = {6, 7, 8, 9};
  mirror q = make(b, (size_t)TQ * s.B * w3, -1, 1), kv = make(b, (size_t)TK * s.B * loom_attn_kv_width(&s), -1, 1);
  mirror bout = make(b, (size_t)TQ * s.B * width, 0, 0), blse = make(b, (size_t)s.B * s.heads * TQ, 0, 0);
  loom_attn_shape block = s;
  block.T = TQ;
  ref->attention_block_forward(ref, bout.host, blse.host, q.host, kv.host, TQ, TK, q_pos, k_pos, &s, NULL, true);
  op->attention_block_forward(op, bout.dev, blse.dev, q.dev, kv.dev, TQ, TK, q_pos, k_pos, &s, NULL, true);
  ref->attention_sink_forward(ref, bout.host, blse.host, learnable ? sinks.host : NULL, &block);
  op->attention_sink_forward(op, bout.dev, blse.dev, learnable ? sinks.dev : NULL, &block);
  expect(r, "attention_sink_forward out (rows that see no key)", &bout, b->fp32_nmse);
  expect(r, "attention_sink_forward log-sum-exps (rows that see no key)", &blse, b->fp32_nmse);
  mirror *all[] = {&qkv, &out, &lse, &sinks, &dsinks, &dout, &dqkv, &q, &kv, &bout, &blse};
  drop_all(all, sizeof all / sizeof *all);
}

static void attention_sinks(const op_backend *b, op_report *r) {
  attention_sinks_at(b, r, true, EQUAL_HEADS);
  attention_sinks_at(b, r, false, EQUAL_HEADS);
  attention_sinks_at(b, r, true, MLA_HEADS);
}

static void embedding(const op_backend *b, op_report *r) {
  const loom_ops *ref = loom_ops_ref(), *op = b->ops;
  enum { T = 7, B = 3, C = 19, N = T * B };
  const int rows = 23, vocab_start = 10;
  int tokens[N];
  for (int i = 0; i < N; i++) tokens[i] = (i * 7) % 45; /* some outside [10, 33): another rank's rows */
  int *dtok = make_ints(b, tokens, N);
  mirror wte = make(b, (size_t)rows * C, -1, 1), wpe = make(b, (size_t)(T + 3) * C, -1, 1), out = make(b, (size_t)N * C, 0, 0);
  ref->embedding_forward(ref, out.host, tokens, wte.host, vocab_start, rows, T, B, C);
  op->embedding_forward(op, out.dev, dtok, wte.dev, vocab_start, rows, T, B, C);
  expect(r, "embedding_forward (vocab rows 10..33)", &out, 0.0);
  /* From a bf16 table: the same lookup of the bf16 values, exactly. */
  uint16_t *bits = malloc((size_t)rows * C * sizeof *bits);
  ref->to_bf16(ref, bits, wte.host, (size_t)rows * C);
  uint16_t *dbits = op->mem->zalloc(op->mem, (size_t)rows * C * sizeof *bits, "test");
  op->mem->from_host(op->mem, dbits, bits, (size_t)rows * C * sizeof *bits);
  ref->embedding_forward_bf16(ref, out.host, tokens, bits, vocab_start, rows, T, B, C);
  op->embedding_forward_bf16(op, out.dev, dtok, dbits, vocab_start, rows, T, B, C);
  expect(r, "embedding_forward_bf16", &out, 0.0);
  free(bits);
  op->mem->release(op->mem, dbits);
  ref->position_forward(ref, out.host, wpe.host, T, B, C, 2);
  op->position_forward(op, out.dev, wpe.dev, T, B, C, 2);
  expect(r, "position_forward (offset 2)", &out, 0.0);
  ref->embedding_backward(ref, wte.host, out.host, tokens, vocab_start, rows, T, B, C);
  op->embedding_backward(op, wte.dev, out.dev, dtok, vocab_start, rows, T, B, C);
  expect(r, "embedding_backward", &wte, b->fp32_nmse);
  ref->position_backward(ref, wpe.host, out.host, T, B, C, 2);
  op->position_backward(op, wpe.dev, out.dev, T, B, C, 2);
  expect(r, "position_backward", &wpe, b->fp32_nmse);
  mirror *all[] = {&wte, &wpe, &out};
  drop_all(all, sizeof all / sizeof *all);
  b->ops->mem->release(b->ops->mem, dtok);
}

static void loss(const op_backend *b, op_report *r) {
  const loom_ops *ref = loom_ops_ref(), *op = b->ops;
  enum { N = 21 };
  const int vocab_start = 10, V = 20, width = 24;
  int targets[N], idx[N];
  for (int i = 0; i < N; i++) targets[i] = i % 5 == 4 ? -1 : (i * 3) % 40; /* masked, other ranks' and own columns */
  int *dtgt = make_ints(b, targets, N), *didx = make_ints(b, targets, N);
  mirror logits = make(b, (size_t)N * width, -3, 3), lse = make(b, N, 0, 0), picked = make(b, N, 0, 0),
         dlogits = make(b, (size_t)N * width, 0, 0), val = make(b, N, 0, 0);
  ref->logsumexp(ref, lse.host, logits.host, N, V, width);
  op->logsumexp(op, lse.dev, logits.dev, N, V, width);
  expect(r, "logsumexp (V 20 of width 24)", &lse, b->fp32_nmse);
  ref->pick_targets(ref, picked.host, logits.host, targets, vocab_start, N, V, width);
  op->pick_targets(op, picked.dev, logits.dev, dtgt, vocab_start, N, V, width);
  expect(r, "pick_targets", &picked, 0.0);
  ref->crossentropy_backward(ref, dlogits.host, logits.host, lse.host, targets, vocab_start, 0.25f, N, V, width);
  op->crossentropy_backward(op, dlogits.dev, logits.dev, lse.dev, dtgt, vocab_start, 0.25f, N, V, width);
  expect(r, "crossentropy_backward", &dlogits, b->fp32_nmse);
  ref->argmax(ref, val.host, idx, logits.host, N, V, width);
  op->argmax(op, val.dev, didx, logits.dev, N, V, width);
  expect(r, "argmax value", &val, 0.0);
  expect_ints(r, b, "argmax index", didx, idx, N);
  mirror losses = make(b, N, 0, 0), shifted = make(b, N, -2, 2), shift = make(b, N, -1, 1);
  ref->crossentropy_losses(ref, losses.host, lse.host, picked.host, targets, N);
  op->crossentropy_losses(op, losses.dev, lse.dev, picked.dev, dtgt, N);
  expect(r, "crossentropy_losses", &losses, b->fp32_nmse);
  ref->exp_shifted(ref, shifted.host, shift.host, N);
  op->exp_shifted(op, shifted.dev, shift.dev, N);
  expect(r, "exp_shifted", &shifted, b->fp32_nmse);
  ref->log_shifted(ref, shifted.host, shift.host, N);
  op->log_shifted(op, shifted.dev, shift.dev, N);
  expect(r, "log_shifted", &shifted, b->fp32_nmse);
  mirror *all[] = {&logits, &lse, &picked, &dlogits, &val, &losses, &shifted, &shift};
  drop_all(all, sizeof all / sizeof *all);
  b->ops->mem->release(b->ops->mem, dtgt);
  b->ops->mem->release(b->ops->mem, didx);
}

/* bf16: casts exact to the bit (one rounding function on every backend), and
 * the bf16 GEMM equal to the fp32 one on the bf16 values up to summation order. */
static void bf16(const op_backend *b, op_report *r) {
  const loom_ops *ref = loom_ops_ref(), *op = b->ops;
  const int N = 37, C = 61, OC = 53;
  const size_t ni = (size_t)N * C, nw = (size_t)OC * C;
  mirror inp = make(b, ni, -3, 3), w = make(b, nw, -1, 1), bias = make(b, OC, -1, 1), out = make(b, (size_t)N * OC, 0, 0),
         back = make(b, ni, 0, 0);
  uint16_t *want = malloc((ni + nw) * sizeof(uint16_t)), *got = malloc((ni + nw) * sizeof(uint16_t));
  uint16_t *d16 = b->ops->mem->zalloc(b->ops->mem, (ni + nw) * sizeof(uint16_t), "test");
  ref->to_bf16(ref, want, inp.host, ni);
  ref->to_bf16(ref, want + ni, w.host, nw);
  op->to_bf16(op, d16, inp.dev, ni);
  op->to_bf16(op, d16 + ni, w.dev, nw);
  b->ops->mem->to_host(b->ops->mem, got, d16, (ni + nw) * sizeof(uint16_t));
  r->checks++;
  if (memcmp(got, want, (ni + nw) * sizeof(uint16_t)) != 0) failed(r, "%s: bf16 bits differ from the reference (%g, %g)", "to_bf16", 0, 0);
  ref->from_bf16(ref, back.host, want, ni);
  op->from_bf16(op, back.dev, d16, ni);
  expect(r, "from_bf16", &back, 0.0);
  ref->round_bf16(ref, inp.host, ni);
  op->round_bf16(op, inp.dev, ni);
  expect(r, "round_bf16", &inp, 0.0);
  /* The bf16 linears: inp now holds bf16 values, the weight is bf16 bits;
   * backward from a dout of bf16 values, accumulating into every grad. */
  ref->matmul_forward_bf16(ref, out.host, loom_bf16_values(inp.host), want + ni, bias.host, N, C, OC);
  op->matmul_forward_bf16(op, out.dev, loom_bf16_values(inp.dev), d16 + ni, bias.dev, N, C, OC);
  expect(r, "matmul_forward_bf16", &out, b->fp32_nmse);
  /* The same from the activations' bits, on both sides. */
  ref->matmul_forward_bf16(ref, out.host, loom_bf16_bits(want), want + ni, bias.host, N, C, OC);
  op->matmul_forward_bf16(op, out.dev, loom_bf16_bits(d16), d16 + ni, bias.dev, N, C, OC);
  expect(r, "matmul_forward_bf16 from bits", &out, b->fp32_nmse);
  mirror dout = make(b, (size_t)N * OC, -1, 1), dinp = make(b, ni, -1, 1), dw = make(b, nw, -1, 1),
         db = make(b, OC, -1, 1);
  ref->round_bf16(ref, dout.host, dout.n);
  op->round_bf16(op, dout.dev, dout.n);
  ref->matmul_backward_bf16(ref, dinp.host, dw.host, db.host, loom_bf16_values(dout.host), loom_bf16_values(inp.host),
                            want + ni, N, C, OC);
  op->matmul_backward_bf16(op, dinp.dev, dw.dev, db.dev, loom_bf16_values(dout.dev), loom_bf16_values(inp.dev), d16 + ni,
                           N, C, OC);
  expect(r, "matmul_backward_bf16 dinp", &dinp, b->fp32_nmse);
  expect(r, "matmul_backward_bf16 dweight", &dw, b->fp32_nmse);
  expect(r, "matmul_backward_bf16 dbias", &db, b->fp32_nmse);
  /* From bits: dout's and inp's (the bias grad sums dout's bits). */
  uint16_t *dy16 = malloc(dout.n * sizeof(uint16_t)), *ddy16 = b->ops->mem->zalloc(b->ops->mem, dout.n * sizeof(uint16_t), "test");
  ref->to_bf16(ref, dy16, dout.host, dout.n);
  op->to_bf16(op, ddy16, dout.dev, dout.n);
  ref->matmul_backward_bf16(ref, dinp.host, dw.host, db.host, loom_bf16_bits(dy16), loom_bf16_bits(want), want + ni, N, C,
                            OC);
  op->matmul_backward_bf16(op, dinp.dev, dw.dev, db.dev, loom_bf16_bits(ddy16), loom_bf16_bits(d16), d16 + ni, N, C, OC);
  expect(r, "matmul_backward_bf16 dinp from bits", &dinp, b->fp32_nmse);
  expect(r, "matmul_backward_bf16 dweight from bits", &dw, b->fp32_nmse);
  expect(r, "matmul_backward_bf16 dbias from bits", &db, b->fp32_nmse);
  /* The weight half alone (a split backward), with no weight. */
  ref->matmul_backward_bf16(ref, NULL, dw.host, NULL, loom_bf16_values(dout.host), loom_bf16_values(inp.host), NULL, N, C,
                            OC);
  op->matmul_backward_bf16(op, NULL, dw.dev, NULL, loom_bf16_values(dout.dev), loom_bf16_values(inp.dev), NULL, N, C, OC);
  expect(r, "matmul_backward_bf16 weight grad alone", &dw, b->fp32_nmse);
  mirror *all[] = {&inp, &w, &bias, &out, &back, &dout, &dinp, &dw, &db};
  drop_all(all, sizeof all / sizeof *all);
  b->ops->mem->release(b->ops->mem, d16);
  b->ops->mem->release(b->ops->mem, ddy16);
  free(dy16);
  free(want);
  free(got);
}

/* One FP8 operand cast on the backend and on the reference: the same codes
 * and scales (the cast is exact), kept on both sides. */
typedef struct {
  uint8_t *dev_codes, *host_codes;
  float *dev_scales, *host_scales;
  loom_fp8_matrix dev, host;
} fp8_operand;

static fp8_operand fp8_cast(const op_backend *b, op_report *r, const char *what, const loom_fp8_config *c,
                            loom_fp8_operand role, const mirror *x, int R, int C, bool transpose) {
  const loom_ops *ref = loom_ops_ref(), *op = b->ops;
  const int rows = transpose ? C : R, K = transpose ? R : C;
  /* a whole-tensor scale: tensorwise's from the amax (both backends' amax must agree), delayed's a stale one
   * (1.5 times the fitting one: the values above amax / 1.5, a third of them, saturate) */
  float scale = 0.0f;
  const float amax = ref->fp8_amax(ref, loom_bf16_values(x->host), x->n);
  r->checks++;
  if (op->fp8_amax(op, loom_bf16_values(x->dev), x->n) != amax) failed(r, "%s: fp8_amax differs (%g, %g)", what, 0, 0);
  if (c->recipe == LOOM_FP8_RECIPE_TENSORWISE) scale = loom_fp8_scale(amax, loom_fp8_format_of(c, role), 0, 1.0f);
  if (c->recipe == LOOM_FP8_RECIPE_DELAYED) scale = 1.5f * loom_fp8_scale(amax, loom_fp8_format_of(c, role), 0, 1.0f);
  const loom_fp8_quant q = loom_fp8_quant_of(c, role, scale);
  const size_t n = (size_t)rows * K, ns = loom_fp8_scale_count(&q, rows, K);
  fp8_operand o = {.dev_codes = op->mem->zalloc(op->mem, n, "test"), .host_codes = malloc(n),
                   .dev_scales = op->mem->zalloc(op->mem, ns * sizeof(float), "test"), .host_scales = malloc(ns * sizeof(float))};
  ref->fp8_quantize(ref, o.host_codes, o.host_scales, loom_bf16_values(x->host), R, C, transpose, &q);
  op->fp8_quantize(op, o.dev_codes, o.dev_scales, loom_bf16_values(x->dev), R, C, transpose, &q);
  uint8_t *codes = malloc(n);
  float *scales = malloc(ns * sizeof(float));
  op->mem->to_host(op->mem, codes, o.dev_codes, n);
  op->mem->to_host(op->mem, scales, o.dev_scales, ns * sizeof(float));
  r->checks++;
  if (memcmp(codes, o.host_codes, n) || memcmp(scales, o.host_scales, ns * sizeof(float)))
    failed(r, "%s: fp8_quantize's codes or scales differ from the reference's (%g, %g)", what, 0, 0);
  size_t saturated = 0, nonzero = 0; /* something to compare: most codes nonzero, only the stale scale saturating many */
  for (size_t i = 0; i < n; i++)
    saturated += (codes[i] & 0x7f) == loom_fp8_max_code((loom_fp8_format)q.format), nonzero += (codes[i] & 0x7f) != 0;
  r->checks++;
  if (nonzero < n / 2 || (c->recipe == LOOM_FP8_RECIPE_DELAYED) != (saturated > n / 5))
    failed(r, "%s: the cast's codes are not what its scale makes (%g nonzero, %g saturated)", what, (double)nonzero,
           (double)saturated);
  free(codes), free(scales);
  o.dev = loom_fp8_matrix_of(&q, o.dev_codes, o.dev_scales, rows, K);
  o.host = loom_fp8_matrix_of(&q, o.host_codes, o.host_scales, rows, K);
  return o;
}

static void fp8_drop(const op_backend *b, fp8_operand *o) {
  b->ops->mem->release(b->ops->mem, o->dev_codes), b->ops->mem->release(b->ops->mem, o->dev_scales);
  free(o->host_codes), free(o->host_scales);
}

/* c (accumulated onto c0) against the definition in fp64 from the same codes and scales: each element within
 * fp32's summation bound, (terms in a block + blocks + 2) ulps of the sum of the magnitudes. */
static void fp8_expect(const op_backend *b, op_report *r, const char *what, const float *c_dev, const float *c0,
                       const fp8_operand *A, const fp8_operand *B, int M, int N, int K) {
  float *got = malloc((size_t)M * N * sizeof(float));
  b->ops->mem->to_host(b->ops->mem, got, c_dev, (size_t)M * N * sizeof(float));
  const loom_fp8_matrix *a = &A->host, *bm = &B->host;
  const int bk = a->block_k, kb = loom_fp8_k_blocks(K, bk);
  double worst = 0.0, largest = 0.0;
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      double want = c0[(size_t)m * N + n], mag = fabs(want);
      for (int j = 0; j < kb; j++) {
        const double s = (double)a->scale_inv[(size_t)(m / a->block_rows) * kb + j] *
                         (double)bm->scale_inv[(size_t)(n / bm->block_rows) * kb + j];
        for (int k = j * bk; k < K && k < (j + 1) * bk; k++) {
          const double p = (double)loom_fp8_decode(a->codes[(size_t)m * K + k], (loom_fp8_format)a->format) *
                           (double)loom_fp8_decode(bm->codes[(size_t)n * K + k], (loom_fp8_format)bm->format) * s;
          want += p, mag += fabs(p);
        }
      }
      const double bound = (double)(bk + kb + 2) * ldexp(1.0, -24) * mag, err = fabs(got[(size_t)m * N + n] - want);
      worst = err / (bound > 0 ? bound : 1) > worst ? err / (bound > 0 ? bound : 1) : worst;
      largest = fabs(want) > largest ? fabs(want) : largest;
    }
  r->checks++;
  if (!(worst <= 1.0) || !(largest > 0.0))
    failed(r, "%s: fp8_gemm off its fp64 definition by %.3g of the fp32 bound (largest %g)", what, worst, largest);
  free(got);
}

/* Each recipe's three GEMMs (forward x W^T, input grad dy W, weight grad dy^T x), E4M3 and hybrid, K spanning
 * whole and partial 128- and 32-blocks, on the backend and on the reference, each against fp64. */
static void fp8_at(const op_backend *b, op_report *r, int N, int C, int OC) {
  const loom_ops *ref = loom_ops_ref();
  mirror x = make(b, (size_t)N * C, -3, 3), w = make(b, (size_t)OC * C, -0.1f, 0.1f), dy = make(b, (size_t)N * OC, -1e-3f, 1e-3f);
  mirror *rounded[] = {&x, &w, &dy}; /* the operands a bf16 run gives an FP8 cast: bf16 values */
  for (int i = 0; i < 3; i++) ref->round_bf16(ref, rounded[i]->host, rounded[i]->n), b->ops->round_bf16(b->ops, rounded[i]->dev, rounded[i]->n);
  static const char *const RECIPES[] = {"delayed", "tensorwise", "blockwise", "mxfp8"};
  for (int recipe = 0; recipe < 4; recipe++)
    for (int hybrid = 0; hybrid < 2; hybrid++) {
      const loom_fp8_config c = {.on = true, .hybrid = hybrid, .recipe = (loom_fp8_recipe)recipe, .history = 1};
      char what[96];
      struct {
        const char *name;
        const mirror *a, *bb;
        int aR, aC, bR, bC;
        bool at, bt;
        loom_fp8_operand ar, br;
        int M, Nn, K;
      } L[3] = {{"forward", &x, &w, N, C, OC, C, false, false, LOOM_FP8_INPUT, LOOM_FP8_WEIGHT, N, OC, C},
                {"input grad", &dy, &w, N, OC, OC, C, false, true, LOOM_FP8_GRAD, LOOM_FP8_WEIGHT, N, C, OC},
                {"weight grad", &dy, &x, N, OC, N, C, true, true, LOOM_FP8_GRAD, LOOM_FP8_INPUT, OC, C, N}};
      for (int l = 0; l < 3; l++) {
        snprintf(what, sizeof what, "fp8 %s%s %s", RECIPES[recipe], hybrid ? " hybrid" : "", L[l].name);
        fp8_operand A = fp8_cast(b, r, what, &c, L[l].ar, L[l].a, L[l].aR, L[l].aC, L[l].at);
        fp8_operand B = fp8_cast(b, r, what, &c, L[l].br, L[l].bb, L[l].bR, L[l].bC, L[l].bt);
        const size_t n = (size_t)L[l].M * L[l].Nn;
        mirror out = make(b, n, -1, 1); /* accumulated onto */
        float *c0 = malloc(n * sizeof(float));
        memcpy(c0, out.host, n * sizeof(float));
        ref->fp8_gemm(ref, out.host, true, &A.host, &B.host, L[l].M, L[l].Nn, L[l].K);
        b->ops->fp8_gemm(b->ops, out.dev, true, &A.dev, &B.dev, L[l].M, L[l].Nn, L[l].K);
        fp8_expect(b, r, what, out.dev, c0, &A, &B, L[l].M, L[l].Nn, L[l].K);
        float *href = ref->mem->zalloc(ref->mem, n * sizeof(float), "test"); /* the reference's own loops, written fresh */
        ref->fp8_gemm(ref, href, false, &A.host, &B.host, L[l].M, L[l].Nn, L[l].K);
        memset(c0, 0, n * sizeof(float));
        fp8_expect(&(op_backend){"ref", ref, 0}, r, what, href, c0, &A, &B, L[l].M, L[l].Nn, L[l].K);
        ref->mem->release(ref->mem, href);
        expect(r, what, &out, b->fp32_nmse); /* and against the reference's loops: sentinels intact, values finite */
        free(c0);
        drop(&out);
        fp8_drop(b, &A), fp8_drop(b, &B);
      }
    }
  mirror *all[] = {&x, &w, &dy};
  drop_all(all, 3);
}

/* Each recipe's three GEMMs at odd shapes, and at shapes whose dimensions are multiples of 16 (what cuBLASLt's FP8
 * matmul takes: the CUDA backend runs the per-tensor ones there), K spanning partial 128- and 32-blocks in both. */
static void fp8(const op_backend *b, op_report *r) {
  fp8_at(b, r, 40, 200, 72);
  fp8_at(b, r, 48, 144, 32);
}

static void adamw(const op_backend *b, op_report *r) {
  const loom_ops *ref = loom_ops_ref(), *op = b->ops;
  const size_t n = 20001;
  mirror p = make(b, n, -1, 1), g = make(b, n, -1, 1), m = make(b, n, -0.1f, 0.1f), v = make(b, n, 0, 0.01f);
  uint16_t *want16 = malloc(n * sizeof(uint16_t)), *dev16 = op->mem->zalloc(op->mem, n * sizeof(uint16_t), "test");
  for (int step = 1; step <= 3; step++) {
    /* Step 2 clips: its grads count at 0.3 of their value, inside the update. */
    const loom_adamw_args a = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                               .grad_scale = step == 2 ? 0.3f : 1.0f, .step = step};
    /* The last step also writes the bf16 copy, as a bf16 run's does. */
    ref->adamw(ref, p.host, g.host, m.host, v.host, step == 3 ? want16 : NULL, n, &a);
    op->adamw(op, p.dev, g.dev, m.dev, v.dev, step == 3 ? dev16 : NULL, n, &a);
  }
  expect(r, "adamw params (3 steps)", &p, b->fp32_nmse);
  /* The copy is the bf16 rounding of the params it wrote: exactly where they agree bit for bit. */
  float *params = malloc(n * sizeof(float));
  uint16_t *got16 = malloc(n * sizeof(uint16_t));
  op->mem->to_host(op->mem, params, p.dev, n * sizeof(float));
  op->mem->to_host(op->mem, got16, dev16, n * sizeof(uint16_t));
  size_t off = 0;
  for (size_t i = 0; i < n; i++) off += got16[i] != loom_bf16_round(params[i]);
  r->checks++;
  if (off) failed(r, "%s: %g of %g values are not its params rounded", "adamw's bf16 copy", (double)off, (double)n);
  free(params);
  free(got16);
  expect(r, "adamw m", &m, b->fp32_nmse);
  expect(r, "adamw v", &v, b->fp32_nmse);
  mirror *all[] = {&p, &g, &m, &v};
  drop_all(all, sizeof all / sizeof *all);
  free(want16);
  op->mem->release(op->mem, dev16);
}

/* Every op on an empty shape (no rows, tokens or elements) is a no-op on
 * every backend, as on the reference: nothing written (the weights' grads
 * keep their values, the sentinels after an empty output survive), and a
 * GPU launches no grid of no blocks, which CUDA refuses. And a row with no
 * value above -inf (NaN and -inf only) gives argmax element 0, as the
 * reference does, never a read past the row. */
static void empty_shapes(const op_backend *b, op_report *r) {
  const loom_ops *ref = loom_ops_ref(), *op = b->ops;
  enum { C = 8, OC = 6, V = 5 };
  const loom_ops *both[2] = {ref, op};
  mirror none = make(b, 0, 0, 0), w = make(b, (size_t)OC * C, -1, 1), dw = make(b, (size_t)OC * C, -1, 1),
         vec = make(b, OC, -1, 1), dvec = make(b, OC, -1, 1), wte = make(b, (size_t)V * C, -1, 1);
  int *dtok = make_ints(b, (const int[]){0}, 1);
  uint16_t *w16 = op->mem->zalloc(op->mem, (size_t)OC * C * sizeof(uint16_t), "test");
  uint16_t *h16 = calloc((size_t)OC * C, sizeof(uint16_t));
  const loom_dropout d = {.p = 0.3f, .seed = 7, .stream = 99, .seq_total = 4};
  const loom_attn_shape shape = {.T = 0, .B = 2, .heads = 2, .kv_heads = 1, .head_dim = 4, .total_heads = 2};
  const loom_adamw_args args = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .grad_scale = 1.0f, .step = 1};
  for (int k = 0; k < 2; k++) {
    const loom_ops *o = both[k];
    const bool dev = k == 1;
    float *x = dev ? none.dev : none.host, *pw = dev ? w.dev : w.host, *pdw = dev ? dw.dev : dw.host;
    float *pv = dev ? vec.dev : vec.host, *pdv = dev ? dvec.dev : dvec.host, *pwte = dev ? wte.dev : wte.host;
    const int *tok = dev ? dtok : (const int[]){0};
    const uint16_t *bits = dev ? w16 : h16;
    o->matmul_forward(o, x, x, pw, pv, 0, C, OC);
    o->matmul_backward(o, x, pdw, pdv, x, x, pw, 0, C, OC);
    o->matmul_forward_bf16(o, x, loom_bf16_values(x), bits, pv, 0, C, OC);
    o->matmul_backward_bf16(o, x, pdw, pdv, loom_bf16_values(x), loom_bf16_values(x), bits, 0, C, OC);
    o->layernorm_forward(o, x, x, x, x, pv, pv, 0, OC, 1e-5f);
    o->layernorm_backward(o, x, pdv, pdv, x, x, pv, x, x, 0, OC);
    o->rmsnorm_forward(o, x, x, x, pv, 0, OC, 1e-5f);
    o->rmsnorm_backward(o, x, pdv, x, x, pv, x, 0, OC);
    o->swiglu_forward(o, x, x, 0, 3, (loom_glu){0});
    o->swiglu_backward(o, x, x, x, 0, 3, (loom_glu){0});
    o->rope_forward(o, x, 0, 2, 8, 2, 4, 0, (loom_rope){.theta = 10000.0f});
    o->rope_backward(o, x, 0, 2, 8, 2, 4, 0, (loom_rope){.theta = 10000.0f});
    o->gelu_forward(o, x, x, 0);
    o->gelu_backward(o, x, x, x, 0);
    o->attention_forward(o, x, x, x, &shape, NULL);
    o->attention_backward(o, x, x, x, x, x, &shape, NULL);
    o->embedding_forward(o, x, tok, pwte, 0, V, 0, 2, C);
    o->embedding_backward(o, pwte, x, tok, 0, V, 0, 2, C);
    o->position_forward(o, x, pwte, 0, 2, C, 0);
    o->position_backward(o, pwte, x, 0, 2, C, 0);
    o->bias_forward(o, x, pv, 0, OC);
    o->bias_backward(o, pdv, x, 0, OC);
    o->logsumexp(o, x, x, 0, V, V);
    o->pick_targets(o, x, x, tok, 0, 0, V, V);
    o->crossentropy_backward(o, x, x, x, tok, 0, 1.0f, 0, V, V);
    o->crossentropy_losses(o, x, x, x, tok, 0);
    o->exp_shifted(o, x, x, 0);
    o->log_shifted(o, x, x, 0);
    o->argmax(o, x, dev ? dtok : (int[]){0}, x, 0, V, V);
    o->add(o, x, x, x, 0);
    o->accumulate(o, x, x, 0);
    r->checks++;
    if (o->sumsq(o, x, 0) != 0.0) failed(r, "%s: sumsq of nothing is %g, not %g", o->name, o->sumsq(o, x, 0), 0);
    o->dropout_forward(o, x, 0, 2, C, &d);
    o->dropout_backward(o, x, 0, 2, C, &d);
    o->to_bf16(o, (uint16_t *)x, x, 0);
    o->from_bf16(o, x, (const uint16_t *)x, 0);
    o->round_bf16(o, x, 0);
    o->adamw(o, x, x, x, x, NULL, 0, &args);
  }
  expect(r, "ops on empty shapes: what follows an empty output", &none, 0.0);
  expect(r, "ops on empty shapes: the weight grads", &dw, 0.0);
  expect(r, "ops on empty shapes: the vector grads", &dvec, 0.0);
  expect(r, "ops on empty shapes: the embedding table", &wte, 0.0);
  /* argmax over NaN and -inf only. */
  mirror row = make(b, V, 0, 0), val = make(b, 1, 0, 0);
  const float nan_row[V] = {NAN, -INFINITY, NAN, -INFINITY, NAN};
  memcpy(row.host, nan_row, sizeof nan_row);
  op->mem->from_host(op->mem, row.dev, nan_row, sizeof nan_row);
  int want = -2, *didx = make_ints(b, (const int[]){-2}, 1);
  ref->argmax(ref, val.host, &want, row.host, 1, V, V);
  op->argmax(op, val.dev, didx, row.dev, 1, V, V);
  expect_ints(r, b, "argmax of a row of NaN and -inf", didx, &want, 1);
  mirror *all[] = {&none, &w, &dw, &vec, &dvec, &wte, &row, &val};
  drop_all(all, sizeof all / sizeof *all);
  op->mem->release(op->mem, dtok);
  op->mem->release(op->mem, didx);
  op->mem->release(op->mem, w16);
  free(h16);
}

#define AT(op) offsetof(loom_ops, op)
_Static_assert(offsetof(loom_ops, matmul_forward) == sizeof(const char *) + sizeof(const loom_allocator *) + sizeof(void *),
               "the op table is its name, memory and state, then its functions");

const op_case OP_CASES[] = {
    {"matmul", matmul, {AT(matmul_forward), AT(matmul_backward)}, 2},
    {"layernorm", layernorm, {AT(layernorm_forward), AT(layernorm_backward)}, 2},
    {"rmsnorm", rmsnorm, {AT(rmsnorm_forward), AT(rmsnorm_backward)}, 2},
    {"swiglu", swiglu, {AT(swiglu_forward), AT(swiglu_backward)}, 2},
    {"rope", rope, {AT(rope_forward), AT(rope_backward)}, 2},
    {"gelu", gelu, {AT(gelu_forward), AT(gelu_backward)}, 2},
    {"elementwise", elementwise, {AT(add), AT(accumulate), AT(sumsq), AT(sumsq_batch)}, 4},
    {"gemm", gemm, {AT(gemm)}, 1},
    {"orthonormalize", orthonormalize, {AT(orthonormalize)}, 1},
    {"sign compression", sign_compression, {AT(sign_pack), AT(sign_unpack_add)}, 2},
    {"moe rows", moe_rows, {AT(rows_gather), AT(rows_combine), AT(rows_combine_backward)}, 3},
    {"grouped matmul", grouped_matmul, {AT(grouped_matmul_forward), AT(grouped_matmul_backward)}, 2},
    {"dropout", dropout, {AT(dropout_forward), AT(dropout_backward)}, 2},
    {"bias", bias, {AT(bias_forward), AT(bias_backward)}, 2},
    {"attention", attention, {AT(attention_forward), AT(attention_backward)}, 2},
    {"attention with dropout", attention_dropout, {AT(attention_forward), AT(attention_backward)}, 2},
    {"attention with sliding windows", attention_windows, {AT(attention_forward), AT(attention_backward)}, 2},
    {"attention with head dims of its own (MLA)", attention_head_dims, {AT(attention_forward), AT(attention_backward)}, 2},
    {"attention blocks", attention_blocks, {AT(attention_block_forward), AT(attention_block_backward)}, 2},
    {"attention sinks", attention_sinks, {AT(attention_sink_forward), AT(attention_sink_backward)}, 2},
    {"embedding and positions", embedding,
     {AT(embedding_forward), AT(embedding_backward), AT(position_forward), AT(position_backward), AT(embedding_forward_bf16)}, 5},
    {"vocab-parallel loss pieces", loss,
     {AT(logsumexp), AT(pick_targets), AT(crossentropy_backward), AT(argmax), AT(crossentropy_losses), AT(exp_shifted),
      AT(log_shifted)}, 7},
    {"bf16 casts and linears", bf16, {AT(to_bf16), AT(from_bf16), AT(round_bf16), AT(matmul_forward_bf16), AT(matmul_backward_bf16)}, 5},
    {"fp8 casts and GEMMs", fp8, {AT(fp8_amax), AT(fp8_quantize), AT(fp8_gemm)}, 3},
    {"adamw", adamw, {AT(adamw)}, 1},
    {"empty shapes", empty_shapes, {AT(matmul_forward), AT(attention_forward), AT(argmax)}, 3},
};
const int OP_CASE_COUNT = (int)(sizeof OP_CASES / sizeof OP_CASES[0]);

/* The op table's function entries, in order: every one is a function pointer after `name`. */
typedef void (*op_fn)(void);
int op_table_entries(void) { return (int)((sizeof(loom_ops) - offsetof(loom_ops, matmul_forward)) / sizeof(op_fn)); }
size_t op_table_offset(int k) { return offsetof(loom_ops, matmul_forward) + (size_t)k * sizeof(op_fn); }
op_fn op_table_entry(const loom_ops *ops, int k) {
  op_fn f;
  memcpy(&f, (const char *)ops + op_table_offset(k), sizeof f);
  return f;
}

op_backend op_backend_cpu(void) {
  /* fp32 summation order only: blocked sgemm and vectorised loops against naive ones. */
  return (op_backend){"cpu", loom_ops_cpu(), 1e-10};
}

op_backend op_backend_guarded(void) { return (op_backend){"guarded", loom_ops_guarded(), 1e-10}; }
