/* Backend parity, in the manner of ggml's test-backend-ops: every op of the
 * CUDA backend against the reference backend on the same inputs (fixed
 * seeds, odd shapes), outputs compared by NMSE with a threshold per kind,
 * device buffers followed by sentinels that must survive; dropout masks and
 * argmax indices must match exactly. Also the bf16 casts and GEMM, and TF32.
 * Exits 77 (skipped) on a machine without a CUDA device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cuda/cuda_backend.h"
#include "test_util.h"

enum { SENTINELS = 16 };
#define SENTINEL 1234.5f
#define FP32_NMSE 1e-9 /* summation order, device expf/tanhf, atomics */
#define TF32_NMSE 1e-5
#define BF16_NMSE 1e-4

/* A host array (what the reference backend sees) and its device copy, with sentinels after it. */
typedef struct {
  float *host, *dev;
  size_t n;
} mirror;

static uint64_t g_stream = 1;

static mirror make(size_t n, float lo, float hi) {
  mirror m = {malloc((n ? n : 1) * sizeof(float)), loom_cuda_malloc((n + SENTINELS) * sizeof(float)), n};
  tu_fill(m.host, n, g_stream++, lo, hi);
  float *staged = malloc((n + SENTINELS) * sizeof(float));
  memcpy(staged, m.host, n * sizeof(float));
  for (int i = 0; i < SENTINELS; i++) staged[n + i] = SENTINEL;
  loom_cuda_to_device(m.dev, staged, (n + SENTINELS) * sizeof(float));
  free(staged);
  return m;
}

static void drop(mirror *m) {
  free(m->host);
  loom_cuda_free(m->dev);
}

static int *make_ints(const int *host, size_t n) {
  int *d = loom_cuda_malloc(n * sizeof(int));
  loom_cuda_to_device(d, host, n * sizeof(int));
  return d;
}

static int g_failures;

/* The device result against the reference one: NMSE within tol, sentinels intact. */
static void expect(const char *op, const mirror *m, double tol) {
  float *got = malloc((m->n + SENTINELS) * sizeof(float));
  loom_cuda_sync();
  loom_cuda_to_host(got, m->dev, (m->n + SENTINELS) * sizeof(float));
  const double e = tu_nmse(got, m->host, m->n);
  int sentinels_ok = 1;
  for (int i = 0; i < SENTINELS; i++) sentinels_ok &= got[m->n + i] == SENTINEL;
  const int ok = e <= tol && sentinels_ok && tu_all_finite(got, m->n);
  printf("  %-44s %s  nmse %.2e (max %.0e)%s\n", op, ok ? "OK  " : "FAIL", e, tol, sentinels_ok ? "" : ", sentinel overwritten");
  g_failures += !ok;
  free(got);
}

static void expect_ints(const char *op, const int *dev, const int *want, size_t n) {
  int *got = malloc(n * sizeof(int));
  loom_cuda_to_host(got, dev, n * sizeof(int));
  const int ok = memcmp(got, want, n * sizeof(int)) == 0;
  printf("  %-44s %s  (exact)\n", op, ok ? "OK  " : "FAIL");
  g_failures += !ok;
  free(got);
}

static void matmuls(const loom_ops *cu, const loom_ops *ref) {
  const int N = 37, C = 61, OC = 53;
  mirror inp = make((size_t)N * C, -1, 1), w = make((size_t)OC * C, -1, 1), b = make(OC, -1, 1), out = make((size_t)N * OC, 0, 0);
  ref->matmul_forward(out.host, inp.host, w.host, b.host, N, C, OC);
  cu->matmul_forward(out.dev, inp.dev, w.dev, b.dev, N, C, OC);
  expect("matmul_forward(N=37,C=61,OC=53,bias)", &out, FP32_NMSE);
  mirror dout = make((size_t)N * OC, -1, 1), dinp = make((size_t)N * C, -1, 1), dw = make((size_t)OC * C, -1, 1),
         db = make(OC, -1, 1);
  ref->matmul_backward(dinp.host, dw.host, db.host, dout.host, inp.host, w.host, N, C, OC);
  cu->matmul_backward(dinp.dev, dw.dev, db.dev, dout.dev, inp.dev, w.dev, N, C, OC);
  expect("matmul_backward dinp (accumulates)", &dinp, FP32_NMSE);
  expect("matmul_backward dweight", &dw, FP32_NMSE);
  expect("matmul_backward dbias", &db, FP32_NMSE);
  /* TF32 tensor cores: 10-bit mantissas in, fp32 accumulation. */
  loom_cuda_set_tf32(true);
  cu->matmul_forward(out.dev, inp.dev, w.dev, NULL, N, C, OC);
  ref->matmul_forward(out.host, inp.host, w.host, NULL, N, C, OC);
  expect("matmul_forward (TF32)", &out, TF32_NMSE);
  loom_cuda_set_tf32(false);
  /* bf16 inputs, fp32 accumulation: the reference multiplies the bf16-rounded values. */
  uint16_t *inp16 = loom_cuda_malloc((size_t)N * C * 2), *w16 = loom_cuda_malloc((size_t)OC * C * 2);
  loom_cuda_f32_to_bf16(inp16, inp.dev, (size_t)N * C);
  loom_cuda_f32_to_bf16(w16, w.dev, (size_t)OC * C);
  loom_cuda_matmul_bf16(out.dev, inp16, w16, b.dev, N, C, OC);
  ref->matmul_forward(out.host, inp.host, w.host, b.host, N, C, OC);
  expect("matmul_bf16 (vs fp32 reference)", &out, BF16_NMSE);
  mirror back = make((size_t)N * C, 0, 0);
  loom_cuda_bf16_to_f32(back.dev, inp16, (size_t)N * C);
  memcpy(back.host, inp.host, (size_t)N * C * sizeof(float));
  expect("f32 -> bf16 -> f32 round trip", &back, 1e-5);
  loom_cuda_free(inp16);
  loom_cuda_free(w16);
  mirror *all[] = {&inp, &w, &b, &out, &dout, &dinp, &dw, &db, &back};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) drop(all[i]);
}

static void norms_and_elementwise(const loom_ops *cu, const loom_ops *ref) {
  const int N = 29, C = 67;
  const size_t n = (size_t)N * C;
  mirror x = make(n, -2, 2), w = make(C, 0.5f, 1.5f), b = make(C, -1, 1), out = make(n, 0, 0), mean = make(N, 0, 0),
         rstd = make(N, 0, 0);
  ref->layernorm_forward(out.host, mean.host, rstd.host, x.host, w.host, b.host, N, C, 1e-5f);
  cu->layernorm_forward(out.dev, mean.dev, rstd.dev, x.dev, w.dev, b.dev, N, C, 1e-5f);
  expect("layernorm_forward out", &out, FP32_NMSE);
  expect("layernorm_forward mean", &mean, FP32_NMSE);
  expect("layernorm_forward rstd", &rstd, FP32_NMSE);
  mirror dy = make(n, -1, 1), dx = make(n, -1, 1), dw = make(C, -1, 1), db = make(C, -1, 1);
  ref->layernorm_backward(dx.host, dw.host, db.host, dy.host, x.host, w.host, mean.host, rstd.host, N, C);
  cu->layernorm_backward(dx.dev, dw.dev, db.dev, dy.dev, x.dev, w.dev, mean.dev, rstd.dev, N, C);
  expect("layernorm_backward dinp", &dx, FP32_NMSE);
  expect("layernorm_backward dweight", &dw, FP32_NMSE);
  expect("layernorm_backward dbias", &db, FP32_NMSE);
  ref->gelu_forward(out.host, x.host, n);
  cu->gelu_forward(out.dev, x.dev, n);
  expect("gelu_forward", &out, FP32_NMSE);
  ref->gelu_backward(dx.host, dy.host, x.host, n);
  cu->gelu_backward(dx.dev, dy.dev, x.dev, n);
  expect("gelu_backward", &dx, FP32_NMSE);
  ref->add(out.host, x.host, dy.host, n);
  cu->add(out.dev, x.dev, dy.dev, n);
  expect("add", &out, 0.0);
  ref->accumulate(out.host, dy.host, n);
  cu->accumulate(out.dev, dy.dev, n);
  expect("accumulate", &out, 0.0);
  ref->scale(out.host, 0.37f, n);
  cu->scale(out.dev, 0.37f, n);
  expect("scale", &out, 0.0);
  const double want = ref->sumsq(x.host, n), got = cu->sumsq(x.dev, n);
  const int ok = fabs(got - want) <= 1e-9 * want;
  printf("  %-44s %s  %.9g vs %.9g\n", "sumsq", ok ? "OK  " : "FAIL", got, want);
  g_failures += !ok;
  /* Dropout: the same keyed mask, bit for bit (zeros where the reference has them). */
  const loom_dropout d = {.p = 0.3f, .seed = 7, .stream = 99, .sample_offset = 3, .seq_offset = 2, .seq_total = 40};
  memcpy(out.host, x.host, n * sizeof(float));
  loom_cuda_to_device(out.dev, x.host, n * sizeof(float));
  ref->dropout_forward(out.host, N, 1, C, &d);
  cu->dropout_forward(out.dev, N, 1, C, &d);
  expect("dropout_forward (keyed mask)", &out, 0.0);
  ref->bias_forward(out.host, b.host, N, C);
  cu->bias_forward(out.dev, b.dev, N, C);
  expect("bias_forward", &out, 0.0);
  ref->bias_backward(db.host, dy.host, N, C);
  cu->bias_backward(db.dev, dy.dev, N, C);
  expect("bias_backward", &db, FP32_NMSE);
  mirror *all[] = {&x, &w, &b, &out, &mean, &rstd, &dy, &dx, &dw, &db};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) drop(all[i]);
}

static void attention(const loom_ops *cu, const loom_ops *ref, float p) {
  const loom_attn_shape s = {.T = 17, .B = 2, .heads = 3, .head_dim = 8, .head_offset = 1, .total_heads = 6};
  const loom_dropout d = {.p = p, .seed = 11, .stream = 5, .sample_offset = 4};
  const size_t width = (size_t)s.heads * s.head_dim, rows = (size_t)s.T * s.B, tt = (size_t)s.B * s.heads * s.T * s.T;
  mirror qkv = make(rows * 3 * width, -1, 1), out = make(rows * width, 0, 0), att = make(tt, 0, 0);
  ref->attention_forward(out.host, att.host, qkv.host, &s, &d);
  cu->attention_forward(out.dev, att.dev, qkv.dev, &s, &d);
  char name[64];
  snprintf(name, sizeof name, "attention_forward out (dropout %.1f)", p);
  expect(name, &out, FP32_NMSE);
  snprintf(name, sizeof name, "attention_forward probabilities (dropout %.1f)", p);
  expect(name, &att, FP32_NMSE);
  mirror dout = make(rows * width, -1, 1), dqkv = make(rows * 3 * width, -1, 1), datt = make(tt, 0, 0);
  ref->attention_backward(dqkv.host, datt.host, dout.host, qkv.host, att.host, &s, &d);
  cu->attention_backward(dqkv.dev, datt.dev, dout.dev, qkv.dev, att.dev, &s, &d);
  snprintf(name, sizeof name, "attention_backward dqkv (dropout %.1f)", p);
  expect(name, &dqkv, FP32_NMSE);
  mirror *all[] = {&qkv, &out, &att, &dout, &dqkv, &datt};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) drop(all[i]);
}

static void embeddings_and_loss(const loom_ops *cu, const loom_ops *ref) {
  const int T = 7, B = 3, C = 19, rows = 23, vocab_start = 10, N = T * B, V = 20, width = 24;
  int tokens[21], targets[21];
  for (int i = 0; i < N; i++) {
    tokens[i] = (i * 7) % 45;                  /* some outside [10, 33) */
    targets[i] = i % 5 == 4 ? -1 : (i * 3) % 40; /* masked, other ranks' and own columns */
  }
  int *dtok = make_ints(tokens, N), *dtgt = make_ints(targets, N);
  mirror wte = make((size_t)rows * C, -1, 1), wpe = make((size_t)(T + 3) * C, -1, 1), out = make((size_t)N * C, 0, 0);
  ref->embedding_forward(out.host, tokens, wte.host, vocab_start, rows, T, B, C);
  cu->embedding_forward(out.dev, dtok, wte.dev, vocab_start, rows, T, B, C);
  expect("embedding_forward (vocab range 10..33)", &out, 0.0);
  ref->position_forward(out.host, wpe.host, T, B, C, 2);
  cu->position_forward(out.dev, wpe.dev, T, B, C, 2);
  expect("position_forward (offset 2)", &out, 0.0);
  ref->embedding_backward(wte.host, out.host, tokens, vocab_start, rows, T, B, C);
  cu->embedding_backward(wte.dev, out.dev, dtok, vocab_start, rows, T, B, C);
  expect("embedding_backward", &wte, FP32_NMSE);
  ref->position_backward(wpe.host, out.host, T, B, C, 2);
  cu->position_backward(wpe.dev, out.dev, T, B, C, 2);
  expect("position_backward", &wpe, FP32_NMSE);
  mirror logits = make((size_t)N * width, -3, 3), lse = make(N, 0, 0), picked = make(N, 0, 0), dlogits = make((size_t)N * width, 0, 0);
  ref->logsumexp(lse.host, logits.host, N, V, width);
  cu->logsumexp(lse.dev, logits.dev, N, V, width);
  expect("logsumexp (V=20 of width 24)", &lse, FP32_NMSE);
  ref->pick_targets(picked.host, logits.host, targets, vocab_start, N, V, width);
  cu->pick_targets(picked.dev, logits.dev, dtgt, vocab_start, N, V, width);
  expect("pick_targets", &picked, 0.0);
  ref->crossentropy_backward(dlogits.host, logits.host, lse.host, targets, vocab_start, 0.25f, N, V, width);
  cu->crossentropy_backward(dlogits.dev, logits.dev, lse.dev, dtgt, vocab_start, 0.25f, N, V, width);
  expect("crossentropy_backward", &dlogits, FP32_NMSE);
  mirror val = make(N, 0, 0);
  int idx[21];
  int *didx = make_ints(idx, N);
  ref->argmax(val.host, idx, logits.host, N, V, width);
  cu->argmax(val.dev, didx, logits.dev, N, V, width);
  expect("argmax value", &val, 0.0);
  expect_ints("argmax index", didx, idx, N);
  mirror *all[] = {&wte, &wpe, &out, &logits, &lse, &picked, &dlogits, &val};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) drop(all[i]);
  loom_cuda_free(dtok);
  loom_cuda_free(dtgt);
  loom_cuda_free(didx);
}

static void optimizer(const loom_ops *cu, const loom_ops *ref) {
  const size_t n = 1000;
  mirror p = make(n, -1, 1), g = make(n, -1, 1), m = make(n, -0.1f, 0.1f), v = make(n, 0, 0.01f);
  for (int step = 1; step <= 3; step++) {
    const loom_adamw_args a = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = step};
    ref->adamw(p.host, g.host, m.host, v.host, n, &a);
    cu->adamw(p.dev, g.dev, m.dev, v.dev, n, &a);
  }
  expect("adamw params (3 steps)", &p, FP32_NMSE);
  expect("adamw m", &m, FP32_NMSE);
  expect("adamw v", &v, FP32_NMSE);
  mirror *all[] = {&p, &g, &m, &v};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) drop(all[i]);
}

int main(void) {
  if (!loom_cuda_available()) {
    printf("SKIP: no CUDA device here; the CUDA backend was built but cannot run\n");
    return 77;
  }
  const loom_ops *cu = loom_ops_cuda(), *ref = loom_ops_ref();
  printf("backend parity: cuda (%s) against ref\n", loom_cuda_device_name());
  matmuls(cu, ref);
  norms_and_elementwise(cu, ref);
  attention(cu, ref, 0.0f);
  attention(cu, ref, 0.3f);
  embeddings_and_loss(cu, ref);
  optimizer(cu, ref);
  printf("%s: %d failure(s)\n", g_failures ? "FAIL" : "ok", g_failures);
  return g_failures ? 1 : 0;
}
