/* Every op of the CPU backend against the naive reference backend, and every
 * reference backward against central finite differences of its forward.
 *
 * Tolerances: fast vs reference, NMSE <= 1e-10 (fp32 summation order only);
 * finite differences use h = 1e-2 on L = sum(out * R) and must agree within
 * 2e-3 + 1e-2 * |fd| per element. Outputs carry sentinels past their end to
 * catch out-of-bounds writes, and every result is checked finite. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu_math.h"
#include "backend/ops.h"
#include "core/rng.h"
#include "test_util.h"

#define GUARD 16
#define SENTINEL 12345.0f
#define NMSE_MAX 1e-10

/* A buffer of n floats plus GUARD sentinels after it. */
static float *guarded(size_t n) {
  float *p = calloc(n + GUARD, sizeof(float));
  for (int i = 0; i < GUARD; i++) p[n + i] = SENTINEL;
  return p;
}
static void check_guard(const float *p, size_t n, const char *what) {
  for (int i = 0; i < GUARD; i++) ck_assert_msg(p[n + i] == SENTINEL, "%s wrote past its end", what);
  ck_assert_msg(tu_all_finite(p, n), "%s produced NaN or Inf", what);
}
static float *random_buf(size_t n, uint64_t stream, float lo, float hi) {
  float *p = guarded(n);
  tu_fill(p, n, stream, lo, hi);
  return p;
}
static float *copy_buf(const float *src, size_t n) {
  float *p = guarded(n);
  memcpy(p, src, n * sizeof(float));
  return p;
}
static void expect_close(const float *fast, const float *ref, size_t n, const char *what) {
  check_guard(fast, n, what);
  const double e = tu_nmse(fast, ref, n);
  ck_assert_msg(e <= NMSE_MAX, "%s: cpu vs ref NMSE %g > %g", what, e, NMSE_MAX);
}

/* ---- finite differences ---- */

typedef double (*loss_fn)(void *ctx);

/* L = sum(out * r) in double. */
static double dot_loss(const float *out, const float *r, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++) s += (double)out[i] * r[i];
  return s;
}

static void fd_check(float *x, size_t n, const float *analytic, loss_fn loss, void *ctx, const char *what) {
  const float h = 1e-2f;
  for (size_t i = 0; i < n; i++) {
    const float saved = x[i];
    x[i] = saved + h;
    const double lp = loss(ctx);
    x[i] = saved - h;
    const double lm = loss(ctx);
    x[i] = saved;
    const double fd = (lp - lm) / (2.0 * h);
    ck_assert_msg(fabs(analytic[i] - fd) <= 2e-3 + 1e-2 * fabs(fd), "%s[%zu]: analytic %g vs finite difference %g",
                  what, i, (double)analytic[i], fd);
  }
}

/* ---- matmul ---- */

enum { MN = 6, MC = 12, MOC = 20 };
typedef struct { float *out, *inp, *w, *b, *r; } mm_ctx;
static double mm_loss(void *p) {
  mm_ctx *c = p;
  loom_ops_ref()->matmul_forward(c->out, c->inp, c->w, c->b, MN, MC, MOC);
  return dot_loss(c->out, c->r, MN * MOC);
}

START_TEST(matmul) {
  const loom_ops *cpu = loom_ops_cpu(), *ref = loom_ops_ref();
  mm_ctx c = {guarded(MN * MOC), random_buf(MN * MC, 1, -1, 1), random_buf(MOC * MC, 2, -1, 1),
              random_buf(MOC, 3, -1, 1), random_buf(MN * MOC, 4, -1, 1)};
  float *fast = guarded(MN * MOC);
  for (int with_bias = 0; with_bias < 2; with_bias++) {
    const float *bias = with_bias ? c.b : NULL;
    cpu->matmul_forward(fast, c.inp, c.w, bias, MN, MC, MOC);
    ref->matmul_forward(c.out, c.inp, c.w, bias, MN, MC, MOC);
    expect_close(fast, c.out, MN * MOC, "matmul_forward");
  }
  /* Backward adds into pre-filled grads: start both from the same nonzero values. */
  float *di_r = random_buf(MN * MC, 5, -1, 1), *dw_r = random_buf(MOC * MC, 6, -1, 1), *db_r = random_buf(MOC, 7, -1, 1);
  float *di_c = copy_buf(di_r, MN * MC), *dw_c = copy_buf(dw_r, MOC * MC), *db_c = copy_buf(db_r, MOC);
  ref->matmul_backward(di_r, dw_r, db_r, c.r, c.inp, c.w, MN, MC, MOC);
  cpu->matmul_backward(di_c, dw_c, db_c, c.r, c.inp, c.w, MN, MC, MOC);
  expect_close(di_c, di_r, MN * MC, "matmul_backward dinp");
  expect_close(dw_c, dw_r, MOC * MC, "matmul_backward dweight");
  expect_close(db_c, db_r, MOC, "matmul_backward dbias");
  /* Finite differences from zeroed grads. */
  float *di = guarded(MN * MC), *dw = guarded(MOC * MC), *db = guarded(MOC);
  ref->matmul_backward(di, dw, db, c.r, c.inp, c.w, MN, MC, MOC);
  fd_check(c.inp, MN * MC, di, mm_loss, &c, "matmul dinp");
  fd_check(c.w, MOC * MC, dw, mm_loss, &c, "matmul dweight");
  fd_check(c.b, MOC, db, mm_loss, &c, "matmul dbias");
}
END_TEST

/* ---- layernorm ---- */

enum { LN = 5, LC = 24 };
typedef struct { float *out, *mean, *rstd, *inp, *w, *b, *r; } ln_ctx;
static double ln_loss(void *p) {
  ln_ctx *c = p;
  loom_ops_ref()->layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->w, c->b, LN, LC, 1e-5f);
  return dot_loss(c->out, c->r, LN * LC);
}

START_TEST(layernorm) {
  const loom_ops *cpu = loom_ops_cpu(), *ref = loom_ops_ref();
  ln_ctx c = {guarded(LN * LC), guarded(LN), guarded(LN), random_buf(LN * LC, 10, -2, 3),
              random_buf(LC, 11, 0.5, 1.5), random_buf(LC, 12, -1, 1), random_buf(LN * LC, 13, -1, 1)};
  float *out = guarded(LN * LC), *mean = guarded(LN), *rstd = guarded(LN);
  cpu->layernorm_forward(out, mean, rstd, c.inp, c.w, c.b, LN, LC, 1e-5f);
  ln_loss(&c);
  expect_close(out, c.out, LN * LC, "layernorm_forward");
  expect_close(mean, c.mean, LN, "layernorm mean");
  expect_close(rstd, c.rstd, LN, "layernorm rstd");
  float *di_r = random_buf(LN * LC, 14, -1, 1), *dw_r = random_buf(LC, 15, -1, 1), *db_r = random_buf(LC, 16, -1, 1);
  float *di_c = copy_buf(di_r, LN * LC), *dw_c = copy_buf(dw_r, LC), *db_c = copy_buf(db_r, LC);
  ref->layernorm_backward(di_r, dw_r, db_r, c.r, c.inp, c.w, c.mean, c.rstd, LN, LC);
  cpu->layernorm_backward(di_c, dw_c, db_c, c.r, c.inp, c.w, c.mean, c.rstd, LN, LC);
  expect_close(di_c, di_r, LN * LC, "layernorm_backward dinp");
  expect_close(dw_c, dw_r, LC, "layernorm_backward dweight");
  expect_close(db_c, db_r, LC, "layernorm_backward dbias");
  float *di = guarded(LN * LC), *dw = guarded(LC), *db = guarded(LC);
  ref->layernorm_backward(di, dw, db, c.r, c.inp, c.w, c.mean, c.rstd, LN, LC);
  fd_check(c.inp, LN * LC, di, ln_loss, &c, "layernorm dinp");
  fd_check(c.w, LC, dw, ln_loss, &c, "layernorm dweight");
  fd_check(c.b, LC, db, ln_loss, &c, "layernorm dbias");
}
END_TEST

/* ---- gelu ---- */

enum { GN = 300 };
typedef struct { float *out, *inp, *r; } gelu_ctx;
static double gelu_loss(void *p) {
  gelu_ctx *c = p;
  loom_ops_ref()->gelu_forward(c->out, c->inp, GN);
  return dot_loss(c->out, c->r, GN);
}

START_TEST(gelu) {
  const loom_ops *cpu = loom_ops_cpu(), *ref = loom_ops_ref();
  gelu_ctx c = {guarded(GN), random_buf(GN, 20, -5, 5), random_buf(GN, 21, -1, 1)};
  float *out = guarded(GN);
  cpu->gelu_forward(out, c.inp, GN);
  gelu_loss(&c);
  expect_close(out, c.out, GN, "gelu_forward");
  /* Known values of the tanh approximation. */
  ck_assert_double_eq_tol(loom_gelu_value(1.0f), 0.841192, 1e-5);
  ck_assert_double_eq_tol(loom_gelu_value(-1.0f), -0.158808, 1e-5);
  float *d_r = random_buf(GN, 22, -1, 1), *d_c = copy_buf(d_r, GN);
  ref->gelu_backward(d_r, c.r, c.inp, GN);
  cpu->gelu_backward(d_c, c.r, c.inp, GN);
  expect_close(d_c, d_r, GN, "gelu_backward");
  float *d = guarded(GN);
  ref->gelu_backward(d, c.r, c.inp, GN);
  fd_check(c.inp, GN, d, gelu_loss, &c, "gelu dinp");
}
END_TEST

/* ---- attention ---- */

enum { AT = 5, AB = 2, AH = 3, AD = 4, AW = AH * AD, AQKV = AT * AB * 3 * AW, AOUT = AT * AB * AW, AATT = AB * AH * AT * AT };
typedef struct { float *out, *att, *qkv, *r; loom_attn_shape s; loom_dropout d; } att_ctx;
static double att_loss(void *p) {
  att_ctx *c = p;
  loom_ops_ref()->attention_forward(c->out, c->att, c->qkv, &c->s, &c->d);
  return dot_loss(c->out, c->r, AOUT);
}

static void attention_case(float p) {
  const loom_ops *cpu = loom_ops_cpu(), *ref = loom_ops_ref();
  att_ctx c = {guarded(AOUT), guarded(AATT), random_buf(AQKV, 30, -2, 2), random_buf(AOUT, 31, -1, 1),
               {.T = AT, .B = AB, .heads = AH, .head_dim = AD, .head_offset = 0, .total_heads = AH},
               {.p = p, .seed = 5, .stream = 77, .sample_offset = 3}};
  float *out = guarded(AOUT), *att = guarded(AATT);
  cpu->attention_forward(out, att, c.qkv, &c.s, &c.d);
  att_loss(&c);
  expect_close(out, c.out, AOUT, "attention_forward out");
  expect_close(att, c.att, AATT, "attention_forward probabilities");
  /* Causality: a probability above the diagonal is exactly zero; rows sum to 1. */
  for (int r = 0; r < AB * AH; r++)
    for (int tq = 0; tq < AT; tq++) {
      double sum = 0.0;
      for (int tk = 0; tk < AT; tk++) {
        const float v = c.att[(r * AT + tq) * AT + tk];
        if (tk > tq) ck_assert_float_eq(v, 0.0f);
        sum += v;
      }
      ck_assert_double_eq_tol(sum, 1.0, 1e-6);
    }
  float *d_r = random_buf(AQKV, 32, -1, 1), *d_c = copy_buf(d_r, AQKV), *scratch = guarded(AATT);
  ref->attention_backward(d_r, scratch, c.r, c.qkv, c.att, &c.s, &c.d);
  cpu->attention_backward(d_c, scratch, c.r, c.qkv, c.att, &c.s, &c.d);
  expect_close(d_c, d_r, AQKV, "attention_backward dqkv");
  float *d = guarded(AQKV);
  ref->attention_backward(d, scratch, c.r, c.qkv, c.att, &c.s, &c.d);
  fd_check(c.qkv, AQKV, d, att_loss, &c, "attention dqkv");
}

START_TEST(attention) { attention_case(0.0f); }
END_TEST
START_TEST(attention_with_dropout) { attention_case(0.3f); }
END_TEST

/* ---- embedding, positions, bias ---- */

enum { ET = 4, EB = 3, EC = 8, EV = 11, ES = 6 };
START_TEST(embedding) {
  const loom_ops *cpu = loom_ops_cpu(), *ref = loom_ops_ref();
  const int tokens[ET * EB] = {1, 5, 5, 0, 10, 3, 5, 5, 2, 9, 1, 0}; /* repeats on purpose */
  float *wte = random_buf(EV * EC, 40, -1, 1), *wpe = random_buf(ES * EC, 41, -1, 1);
  float *out_r = guarded(ET * EB * EC), *out_c = guarded(ET * EB * EC);
  /* A vocab shard: rows 3..8 of the table, as one TP rank holds them. */
  for (int shard = 0; shard < 2; shard++) {
    const int start = shard ? 3 : 0, rows = shard ? 6 : EV;
    ref->embedding_forward(out_r, tokens, wte + start * EC, start, rows, ET, EB, EC);
    cpu->embedding_forward(out_c, tokens, wte + start * EC, start, rows, ET, EB, EC);
    expect_close(out_c, out_r, ET * EB * EC, "embedding_forward");
    for (int i = 0; i < ET * EB; i++) {
      const int mine = tokens[i] >= start && tokens[i] < start + rows;
      for (int c = 0; c < EC; c++) ck_assert_float_eq(out_r[i * EC + c], mine ? wte[tokens[i] * EC + c] : 0.0f);
    }
  }
  ref->position_forward(out_r, wpe, ET, EB, EC, 2);
  cpu->position_forward(out_c, wpe, ET, EB, EC, 2);
  expect_close(out_c, out_r, ET * EB * EC, "position_forward");
  /* Row (t=1, b=2) is token 3 at position 2 + 1. */
  for (int c = 0; c < EC; c++) ck_assert_float_eq(out_r[(1 * EB + 2) * EC + c], wte[3 * EC + c] + wpe[3 * EC + c]);
  float *dout = random_buf(ET * EB * EC, 42, -1, 1);
  float *dte_r = random_buf(EV * EC, 43, -1, 1), *dpe_r = random_buf(ES * EC, 44, -1, 1);
  float *dte_c = copy_buf(dte_r, EV * EC), *dpe_c = copy_buf(dpe_r, ES * EC);
  ref->embedding_backward(dte_r, dout, tokens, 0, EV, ET, EB, EC);
  cpu->embedding_backward(dte_c, dout, tokens, 0, EV, ET, EB, EC);
  ref->position_backward(dpe_r, dout, ET, EB, EC, 2);
  cpu->position_backward(dpe_c, dout, ET, EB, EC, 2);
  expect_close(dte_c, dte_r, EV * EC, "embedding_backward");
  expect_close(dpe_c, dpe_r, ES * EC, "position_backward");
  /* Token 5 appears 4 times: its grad row is the sum of those 4 rows; a shard
   * without token 5 leaves its rows alone. */
  float *d = guarded(EV * EC);
  ref->embedding_backward(d, dout, tokens, 0, EV, ET, EB, EC);
  for (int c = 0; c < EC; c++) {
    const float want = dout[1 * EC + c] + dout[2 * EC + c] + dout[6 * EC + c] + dout[7 * EC + c];
    ck_assert_float_eq_tol(d[5 * EC + c], want, 1e-6);
  }
  float *shard = guarded(2 * EC);
  cpu->embedding_backward(shard, dout, tokens, 6, 2, ET, EB, EC); /* tokens 6, 7: absent */
  for (int k = 0; k < 2 * EC; k++) ck_assert_float_eq(shard[k], 0.0f);
}
END_TEST

START_TEST(bias) {
  const loom_ops *cpu = loom_ops_cpu(), *ref = loom_ops_ref();
  enum { N = 70, OC = 130 }; /* not multiples of the CPU's 64-column blocks */
  float *out_r = random_buf(N * OC, 45, -1, 1), *out_c = copy_buf(out_r, N * OC), *b = random_buf(OC, 46, -1, 1);
  ref->bias_forward(out_r, b, N, OC);
  cpu->bias_forward(out_c, b, N, OC);
  expect_close(out_c, out_r, N * OC, "bias_forward");
  float *db_r = random_buf(OC, 47, -1, 1), *db_c = copy_buf(db_r, OC);
  ref->bias_backward(db_r, out_r, N, OC);
  cpu->bias_backward(db_c, out_r, N, OC);
  expect_close(db_c, db_r, OC, "bias_backward");
}
END_TEST

/* ---- cross-entropy ---- */

enum { XN = 4, XV = 7, XVP = 9 };
typedef struct { float *losses, *logits, *w, *lse, *picked; int targets[XN]; } xe_ctx;
/* The loss the model builds from the pieces: lse - picked, 0 where masked. */
static void xe_losses(const loom_ops *ops, xe_ctx *c) {
  ops->logsumexp(c->lse, c->logits, XN, XV, XVP);
  ops->pick_targets(c->picked, c->logits, c->targets, 0, XN, XV, XVP);
  for (int n = 0; n < XN; n++) c->losses[n] = c->targets[n] < 0 ? 0.0f : c->lse[n] - c->picked[n];
}
static double xe_loss(void *p) {
  xe_ctx *c = p;
  xe_losses(loom_ops_ref(), c);
  return dot_loss(c->losses, c->w, XN);
}

START_TEST(crossentropy) {
  const loom_ops *cpu = loom_ops_cpu(), *ref = loom_ops_ref();
  float w[XN] = {0.5f, 0.5f, 0.5f, 0.5f};
  xe_ctx c = {guarded(XN), random_buf(XN * XVP, 50, -3, 3), w, guarded(XN), guarded(XN), {2, 6, -1, 0}};
  xe_ctx f = {guarded(XN), c.logits, w, guarded(XN), guarded(XN), {2, 6, -1, 0}};
  /* Huge padding logits must not change anything: they are not part of the vocab. */
  for (int n = 0; n < XN; n++) c.logits[n * XVP + 7] = c.logits[n * XVP + 8] = 1e4f;
  xe_losses(cpu, &f);
  xe_loss(&c);
  expect_close(f.lse, c.lse, XN, "logsumexp");
  expect_close(f.picked, c.picked, XN, "pick_targets");
  ck_assert_float_eq(c.losses[2], 0.0f); /* masked target */
  /* Uniform logits give exactly ln V. */
  float flat[XVP] = {0}, lse;
  ref->logsumexp(&lse, flat, 1, XV, XVP);
  ck_assert_double_eq_tol(lse, log(XV), 1e-6);
  /* A vocab shard sees only its columns: targets elsewhere pick 0. */
  float picked[XN];
  ref->pick_targets(picked, c.logits + 2, c.targets, 2, XN, 3, XVP);
  ck_assert_float_eq(picked[0], c.logits[0 * XVP + 2]);
  ck_assert_float_eq(picked[1], 0.0f); /* target 6 is past columns 2..4 */
  ck_assert_float_eq(picked[3], 0.0f); /* target 0 is before them */
  float *d_r = guarded(XN * XVP), *d_c = guarded(XN * XVP);
  ref->crossentropy_backward(d_r, c.logits, c.lse, c.targets, 0, 0.5f, XN, XV, XVP);
  float *inplace = copy_buf(c.logits, XN * XVP);
  cpu->crossentropy_backward(inplace, inplace, c.lse, c.targets, 0, 0.5f, XN, XV, XVP); /* aliasing allowed */
  memcpy(d_c, inplace, XN * XVP * sizeof(float));
  expect_close(d_c, d_r, XN * XVP, "crossentropy_backward");
  for (int n = 0; n < XN; n++) ck_assert_float_eq(d_r[n * XVP + 8], 0.0f);
  fd_check(c.logits, XN * XVP, d_r, xe_loss, &c, "crossentropy dlogits");
  /* Greedy prediction ignores the padding columns; ties go to the first. */
  float val_r[XN], val_c[XN];
  int idx_r[XN], idx_c[XN];
  c.logits[1 * XVP + 4] = c.logits[1 * XVP + 5] = 50.0f;
  ref->argmax(val_r, idx_r, c.logits, XN, XV, XVP);
  cpu->argmax(val_c, idx_c, c.logits, XN, XV, XVP);
  ck_assert_mem_eq(idx_c, idx_r, sizeof idx_r);
  ck_assert_int_eq(idx_r[1], 4);
  for (int n = 0; n < XN; n++) ck_assert_int_lt(idx_r[n], XV);
}
END_TEST

/* The CPU backend's vectorisable exp and GELU against libm. */
START_TEST(fast_math) {
  double worst = 0.0;
  for (float x = -87.0f; x <= 88.0f; x += 0.0137f) {
    const double want = exp((double)x), got = loom_fast_expf(x);
    worst = fmax(worst, fabs(got - want) / want);
  }
  ck_assert_msg(worst < 3e-7, "fast expf relative error %g", worst);
  ck_assert_float_eq(loom_fast_expf(0.0f), 1.0f);
  ck_assert(loom_fast_expf(-1000.0f) < 1e-37f);
  ck_assert(isnan(loom_fast_expf(NAN)));
  ck_assert(isnan(loom_fast_gelu(NAN)));
  for (float x = -10.0f; x <= 10.0f; x += 0.01f) {
    ck_assert_float_eq_tol(loom_fast_gelu(x), loom_gelu_value(x), 2e-6);
    ck_assert_float_eq_tol(loom_fast_gelu_grad(x), loom_gelu_grad(x), 5e-6);
  }
}
END_TEST

/* ---- elementwise, dropout, adamw ---- */

START_TEST(elementwise) {
  const loom_ops *cpu = loom_ops_cpu(), *ref = loom_ops_ref();
  enum { N = 40000 }; /* above the parallel threshold */
  float *a = random_buf(N, 60, -1, 1), *b = random_buf(N, 61, -1, 1);
  float *o_r = guarded(N), *o_c = guarded(N);
  ref->add(o_r, a, b, N);
  cpu->add(o_c, a, b, N);
  expect_close(o_c, o_r, N, "add");
  ref->accumulate(o_r, a, N);
  cpu->accumulate(o_c, a, N);
  expect_close(o_c, o_r, N, "accumulate");
  ref->scale(o_r, 0.37f, N);
  cpu->scale(o_c, 0.37f, N);
  expect_close(o_c, o_r, N, "scale");
  ck_assert_double_eq_tol(cpu->sumsq(a, N), ref->sumsq(a, N), 1e-9 * ref->sumsq(a, N));
}
END_TEST

START_TEST(dropout) {
  const loom_ops *cpu = loom_ops_cpu(), *ref = loom_ops_ref();
  enum { T = 16, B = 4, C = 64, N = T * B * C };
  const loom_dropout d = {.p = 0.25f, .seed = 3, .stream = 9, .sample_offset = 10};
  float *x_r = random_buf(N, 70, 1, 2), *x_c = copy_buf(x_r, N), *orig = copy_buf(x_r, N);
  ref->dropout_forward(x_r, T, B, C, &d);
  cpu->dropout_forward(x_c, T, B, C, &d);
  expect_close(x_c, x_r, N, "dropout_forward");
  int dropped = 0;
  for (int i = 0; i < N; i++) {
    if (x_r[i] == 0.0f) dropped++;
    else ck_assert_float_eq_tol(x_r[i], orig[i] / 0.75f, 1e-6);
  }
  ck_assert_int_gt(dropped, N / 5);
  ck_assert_int_lt(dropped, N * 3 / 10);
  /* The mask is keyed by the global sample: samples 10..13 of this call equal
   * samples 0..3 of a call whose sample_offset is 10 greater on a shifted batch. */
  const loom_dropout d2 = {.p = 0.25f, .seed = 3, .stream = 9, .sample_offset = 12};
  float *half = guarded(T * 2 * C);
  for (int t = 0; t < T; t++) memcpy(half + t * 2 * C, orig + (t * B + 2) * C, 2 * C * sizeof(float));
  ref->dropout_forward(half, T, 2, C, &d2);
  for (int t = 0; t < T; t++)
    for (int i = 0; i < 2 * C; i++) ck_assert_float_eq(half[t * 2 * C + i], x_r[(t * B + 2) * C + i]);
}
END_TEST

START_TEST(adamw) {
  const loom_ops *cpu = loom_ops_cpu(), *ref = loom_ops_ref();
  enum { N = 20000 };
  float *p_r = random_buf(N, 80, -1, 1), *g = random_buf(N, 81, -1, 1);
  float *m_r = guarded(N), *v_r = guarded(N);
  float *p_c = copy_buf(p_r, N), *m_c = guarded(N), *v_c = guarded(N);
  for (int step = 1; step <= 3; step++) {
    const loom_adamw_args a = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = step};
    ref->adamw(p_r, g, m_r, v_r, N, &a);
    cpu->adamw(p_c, g, m_c, v_c, N, &a);
  }
  expect_close(p_c, p_r, N, "adamw params");
  expect_close(m_c, m_r, N, "adamw m");
  expect_close(v_c, v_r, N, "adamw v");
  /* First step moves each parameter by lr * (sign(g) + wd * p), Adam's hallmark. */
  float p = 0.5f, m = 0.0f, v = 0.0f, grad = -3.0f;
  const loom_adamw_args a1 = {.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 0.0f, .weight_decay = 0.1f, .step = 1};
  ref->adamw(&p, &grad, &m, &v, 1, &a1);
  ck_assert_double_eq_tol(p, 0.5 - 0.1 * (-1.0 + 0.1 * 0.5), 1e-6);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ops");
  TCase *tc = tcase_create("ops");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, matmul);
  tcase_add_test(tc, layernorm);
  tcase_add_test(tc, gelu);
  tcase_add_test(tc, attention);
  tcase_add_test(tc, attention_with_dropout);
  tcase_add_test(tc, embedding);
  tcase_add_test(tc, bias);
  tcase_add_test(tc, crossentropy);
  tcase_add_test(tc, fast_math);
  tcase_add_test(tc, elementwise);
  tcase_add_test(tc, dropout);
  tcase_add_test(tc, adamw);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
