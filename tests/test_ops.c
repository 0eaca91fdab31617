/* The op table: every backend compiled in against the naive reference
 * backend, as one table of cases (op_parity.c; here the CPU backend, NMSE <=
 * 1e-10: fp32 summation order only); every entry of every table set and
 * covered by a case; every reference backward against central finite
 * differences of its forward (h = 1e-2 on L = sum(out * R), within 2e-3 +
 * 1e-2 * |fd| per element); and the properties of the reference ops
 * themselves (causality, masks keyed by global coordinates, vocab shards). */
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "backend/cpu/cpu_bf16_gemm.h"
#include "backend/cpu/cpu_math.h"
#include "backend/op_math.h"
#include "backend/ops.h"
#include "core/rng.h"
#include "op_parity.h"
#include "test_util.h"

#define GUARD 16
#define SENTINEL 12345.0f

/* Every test's buffers, freed after it (a checked fixture), so the
 * sanitizer build's leak check sees none. */
#define MAX_BUFFERS 256
static float *g_buffers[MAX_BUFFERS];
static int g_nbuffers;
static void free_buffers(void) {
  while (g_nbuffers > 0) free(g_buffers[--g_nbuffers]);
}

/* A buffer of n floats plus GUARD sentinels after it. */
static float *guarded(size_t n) {
  ck_assert_int_lt(g_nbuffers, MAX_BUFFERS);
  float *p = calloc(n + GUARD, sizeof(float));
  ck_assert_ptr_nonnull(p);
  for (int i = 0; i < GUARD; i++) p[n + i] = SENTINEL;
  return g_buffers[g_nbuffers++] = p;
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

/* ---- finite differences ---- */

typedef double (*loss_fn)(void *ctx);

/* L = sum(out * r) in double. */
static double dot_loss(const float *out, const float *r, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++) s += (double)out[i] * r[i];
  return s;
}

static void fd_check(float *x, size_t n, const float *analytic, loss_fn loss, void *ctx, const char *what) {
  check_guard(analytic, n, what); /* the reference backward stayed inside its output */
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
  loom_ops_ref()->matmul_forward(loom_ops_ref(), c->out, c->inp, c->w, c->b, MN, MC, MOC);
  return dot_loss(c->out, c->r, MN * MOC);
}

START_TEST(matmul) {
  const loom_ops *ref = loom_ops_ref();
  mm_ctx c = {guarded(MN * MOC), random_buf(MN * MC, 1, -1, 1), random_buf(MOC * MC, 2, -1, 1),
              random_buf(MOC, 3, -1, 1), random_buf(MN * MOC, 4, -1, 1)};
  mm_loss(&c);
  /* Finite differences from zeroed grads. */
  float *di = guarded(MN * MC), *dw = guarded(MOC * MC), *db = guarded(MOC);
  ref->matmul_backward(ref, di, dw, db, c.r, c.inp, c.w, MN, MC, MOC);
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
  loom_ops_ref()->layernorm_forward(loom_ops_ref(), c->out, c->mean, c->rstd, c->inp, c->w, c->b, LN, LC, 1e-5f);
  return dot_loss(c->out, c->r, LN * LC);
}

START_TEST(layernorm) {
  const loom_ops *ref = loom_ops_ref();
  ln_ctx c = {guarded(LN * LC), guarded(LN), guarded(LN), random_buf(LN * LC, 10, -2, 3),
              random_buf(LC, 11, 0.5, 1.5), random_buf(LC, 12, -1, 1), random_buf(LN * LC, 13, -1, 1)};
  ln_loss(&c);
  float *di = guarded(LN * LC), *dw = guarded(LC), *db = guarded(LC);
  ref->layernorm_backward(ref, di, dw, db, c.r, c.inp, c.w, c.mean, c.rstd, LN, LC);
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
  loom_ops_ref()->gelu_forward(loom_ops_ref(), c->out, c->inp, GN);
  return dot_loss(c->out, c->r, GN);
}

START_TEST(gelu) {
  const loom_ops *ref = loom_ops_ref();
  gelu_ctx c = {guarded(GN), random_buf(GN, 20, -5, 5), random_buf(GN, 21, -1, 1)};
  gelu_loss(&c);
  /* Known values of the tanh approximation. */
  ck_assert_double_eq_tol(loom_gelu_value(1.0f), 0.841192, 1e-5);
  ck_assert_double_eq_tol(loom_gelu_value(-1.0f), -0.158808, 1e-5);
  float *d = guarded(GN);
  ref->gelu_backward(ref, d, c.r, c.inp, GN);
  fd_check(c.inp, GN, d, gelu_loss, &c, "gelu dinp");
}
END_TEST

/* ---- attention ---- */

enum { AT = 5, AB = 2, AH = 4, AD = 4, AW = AH * AD, AOUT = AT * AB * AW, ALSE = AB * AH * AT };
typedef struct { float *out, *lse, *qkv, *r; loom_attn_shape s; loom_dropout d; } att_ctx;
static double att_loss(void *p) {
  att_ctx *c = p;
  loom_ops_ref()->attention_forward(loom_ops_ref(), c->out, c->lse, c->qkv, &c->s, &c->d);
  return dot_loss(c->out, c->r, AOUT);
}

/* Sets the k and v of every key/value head at position t (every sample) to `value`; old[] keeps what was there. */
static void set_kv(att_ctx *c, int t, float value, float *old) {
  const int K = c->s.kv_heads, w3 = (int)loom_attn_qkv_width(&c->s);
  for (int b = 0; b < AB; b++)
    for (int i = 0; i < 2 * K * AD; i++) {
      float *x = &c->qkv[(size_t)(t * AB + b) * w3 + AH * AD + i];
      if (old) *old++ = *x;
      *x = value;
    }
}

static void restore_kv(att_ctx *c, int t, const float *old) {
  const int K = c->s.kv_heads, w3 = (int)loom_attn_qkv_width(&c->s);
  for (int b = 0; b < AB; b++)
    for (int i = 0; i < 2 * K * AD; i++) c->qkv[(size_t)(t * AB + b) * w3 + AH * AD + i] = *old++;
}

/* kv_heads 4: multi-head; 2: grouped-query; 1: multi-query. */
static void attention_case(float p, int kv_heads) {
  const loom_ops *ref = loom_ops_ref();
  const loom_attn_shape s = {.T = AT, .B = AB, .heads = AH, .kv_heads = kv_heads, .head_dim = AD, .head_offset = 0,
                             .total_heads = AH};
  const size_t nqkv = (size_t)AT * AB * loom_attn_qkv_width(&s);
  att_ctx c = {guarded(AOUT), guarded(ALSE), random_buf(nqkv, 30, -2, 2), random_buf(AOUT, 31, -1, 1), s,
               {.p = p, .seed = 5, .stream = 77, .sample_offset = 3}};
  const int w3 = (int)loom_attn_qkv_width(&s);
  float kept[AB * 2 * AH * AD], before[AOUT];
  /* Causality: the last position's keys and values change no earlier row. */
  att_loss(&c);
  memcpy(before, c.out, sizeof before);
  set_kv(&c, AT - 1, 7.0f, kept);
  att_loss(&c);
  ck_assert_mem_eq(c.out, before, (size_t)(AT - 1) * AB * AW * sizeof(float));
  ck_assert(memcmp(c.out + (AT - 1) * AB * AW, before + (AT - 1) * AB * AW, AB * AW * sizeof(float)) != 0);
  restore_kv(&c, AT - 1, kept);
  att_loss(&c);
  /* The first row sees itself alone: its log-sum-exp is its one score. */
  for (int b = 0; b < AB; b++)
    for (int h = 0; h < AH; h++) {
      const float *q = c.qkv + (size_t)b * w3 + h * AD, *k = c.qkv + (size_t)b * w3 + (AH + loom_attn_kv_head(&s, h)) * AD;
      double dot = 0.0;
      for (int d = 0; d < AD; d++) dot += (double)q[d] * k[d];
      ck_assert_double_eq_tol(c.lse[(b * AH + h) * AT], dot / sqrt(AD), 1e-6);
    }
  float *d = guarded(nqkv);
  ref->attention_backward(ref, d, c.r, c.out, c.qkv, c.lse, &c.s, &c.d);
  fd_check(c.qkv, nqkv, d, att_loss, &c, "attention dqkv");
  if (p > 0.0f) return;
  /* Each row's probabilities sum to 1: with every value 1, every output is 1. */
  for (int t = 0; t < AT; t++)
    for (int b = 0; b < AB; b++)
      for (int i = kv_heads * AD; i < 2 * kv_heads * AD; i++) c.qkv[(size_t)(t * AB + b) * w3 + AH * AD + i] = 1.0f;
  att_loss(&c);
  for (int i = 0; i < AOUT; i++) ck_assert_double_eq_tol(c.out[i], 1.0, 1e-6);
}

START_TEST(attention) { attention_case(0.0f, (int[]){4, 2, 1}[_i]); }
END_TEST
START_TEST(attention_with_dropout) { attention_case(0.3f, (int[]){4, 2, 1}[_i]); }
END_TEST

/* ---- embedding, positions, bias ---- */

enum { ET = 4, EB = 3, EC = 8, EV = 11, ES = 6 };
START_TEST(embedding) {
  const loom_ops *ref = loom_ops_ref();
  const int tokens[ET * EB] = {1, 5, 5, 0, 10, 3, 5, 5, 2, 9, 1, 0}; /* repeats on purpose */
  float *wte = random_buf(EV * EC, 40, -1, 1), *wpe = random_buf(ES * EC, 41, -1, 1);
  float *out_r = guarded(ET * EB * EC);
  /* A vocab shard: rows 3..8 of the table, as one TP rank holds them. */
  for (int shard = 0; shard < 2; shard++) {
    const int start = shard ? 3 : 0, rows = shard ? 6 : EV;
    ref->embedding_forward(ref, out_r, tokens, wte + start * EC, start, rows, ET, EB, EC);
    for (int i = 0; i < ET * EB; i++) {
      const int mine = tokens[i] >= start && tokens[i] < start + rows;
      for (int c = 0; c < EC; c++) ck_assert_float_eq(out_r[i * EC + c], mine ? wte[tokens[i] * EC + c] : 0.0f);
    }
  }
  ref->position_forward(ref, out_r, wpe, ET, EB, EC, 2);
  /* Row (t=1, b=2) is token 3 at position 2 + 1. */
  for (int c = 0; c < EC; c++) ck_assert_float_eq(out_r[(1 * EB + 2) * EC + c], wte[3 * EC + c] + wpe[3 * EC + c]);
  float *dout = random_buf(ET * EB * EC, 42, -1, 1);
  /* Token 5 appears 4 times: its grad row is the sum of those 4 rows; a shard
   * without token 5 leaves its rows alone. */
  float *d = guarded(EV * EC);
  ref->embedding_backward(ref, d, dout, tokens, 0, EV, ET, EB, EC);
  for (int c = 0; c < EC; c++) {
    const float want = dout[1 * EC + c] + dout[2 * EC + c] + dout[6 * EC + c] + dout[7 * EC + c];
    ck_assert_float_eq_tol(d[5 * EC + c], want, 1e-6);
  }
  float *shard = guarded(2 * EC);
  ref->embedding_backward(ref, shard, dout, tokens, 6, 2, ET, EB, EC); /* tokens 6, 7: absent */
  for (int k = 0; k < 2 * EC; k++) ck_assert_float_eq(shard[k], 0.0f);
}
END_TEST

/* ---- cross-entropy ---- */

enum { XN = 4, XV = 7, XVP = 9 };
typedef struct { float *losses, *logits, *w, *lse, *picked; int targets[XN]; } xe_ctx;
/* The loss the model builds from the pieces: lse - picked, 0 where masked. */
static void xe_losses(const loom_ops *ops, xe_ctx *c) {
  ops->logsumexp(ops, c->lse, c->logits, XN, XV, XVP);
  ops->pick_targets(ops, c->picked, c->logits, c->targets, 0, XN, XV, XVP);
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
  /* Huge padding logits must not change anything: they are not part of the vocab. */
  for (int n = 0; n < XN; n++) c.logits[n * XVP + 7] = c.logits[n * XVP + 8] = 1e4f;
  xe_loss(&c);
  ck_assert(tu_all_finite(c.lse, XN));
  ck_assert_float_eq(c.losses[2], 0.0f); /* masked target */
  /* Uniform logits give exactly ln V. */
  float flat[XVP] = {0}, lse;
  ref->logsumexp(ref, &lse, flat, 1, XV, XVP);
  ck_assert_double_eq_tol(lse, log(XV), 1e-6);
  /* A vocab shard sees only its columns: targets elsewhere pick 0. */
  float picked[XN];
  ref->pick_targets(ref, picked, c.logits + 2, c.targets, 2, XN, 3, XVP);
  ck_assert_float_eq(picked[0], c.logits[0 * XVP + 2]);
  ck_assert_float_eq(picked[1], 0.0f); /* target 6 is past columns 2..4 */
  ck_assert_float_eq(picked[3], 0.0f); /* target 0 is before them */
  float *d_r = guarded(XN * XVP);
  ref->crossentropy_backward(ref, d_r, c.logits, c.lse, c.targets, 0, 0.5f, XN, XV, XVP);
  /* dlogits may alias logits (the model does it in place), on every backend. */
  const loom_ops *both[2] = {ref, cpu};
  for (int k = 0; k < 2; k++) {
    float *inplace = copy_buf(c.logits, XN * XVP);
    both[k]->crossentropy_backward(both[k], inplace, inplace, c.lse, c.targets, 0, 0.5f, XN, XV, XVP);
    ck_assert_msg(tu_nmse(inplace, d_r, XN * XVP) <= 1e-10, "%s: crossentropy_backward in place", both[k]->name);
  }
  for (int n = 0; n < XN; n++) ck_assert_float_eq(d_r[n * XVP + 8], 0.0f);
  fd_check(c.logits, XN * XVP, d_r, xe_loss, &c, "crossentropy dlogits");
  /* Greedy prediction ignores the padding columns; ties go to the first. */
  float val_r[XN];
  int idx_r[XN];
  c.logits[1 * XVP + 4] = c.logits[1 * XVP + 5] = 50.0f;
  ref->argmax(ref, val_r, idx_r, c.logits, XN, XV, XVP);
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

START_TEST(dropout) {
  const loom_ops *ref = loom_ops_ref();
  enum { T = 16, B = 4, C = 64, N = T * B * C };
  const loom_dropout d = {.p = 0.25f, .seed = 3, .stream = 9, .sample_offset = 10};
  float *x_r = random_buf(N, 70, 1, 2), *orig = copy_buf(x_r, N);
  ref->dropout_forward(ref, x_r, T, B, C, &d);
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
  ref->dropout_forward(ref, half, T, 2, C, &d2);
  for (int t = 0; t < T; t++)
    for (int i = 0; i < 2 * C; i++) ck_assert_float_eq(half[t * 2 * C + i], x_r[(t * B + 2) * C + i]);
}
END_TEST

START_TEST(adamw) {
  const loom_ops *ref = loom_ops_ref();
  /* First step moves each parameter by lr * (sign(g) + wd * p), Adam's hallmark. */
  float p = 0.5f, m = 0.0f, v = 0.0f, grad = -3.0f;
  const loom_adamw_args a1 = {.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 0.0f, .weight_decay = 0.1f, .grad_scale = 1.0f, .step = 1};
  ref->adamw(ref, &p, &grad, &m, &v, NULL, 1, &a1);
  ck_assert_double_eq_tol(p, 0.5 - 0.1 * (-1.0 + 0.1 * 0.5), 1e-6);
}
END_TEST

/* ---- the parity table ---- */

/* Case `i` of the table on the CPU backend, then on the guarded one (a Check loop test: one run per case). */
/* ---- RMSNorm, SwiGLU, RoPE ---- */

typedef struct { float *out, *rstd, *inp, *w, *r; } rms_ctx;
static double rms_loss(void *p) {
  rms_ctx *c = p;
  loom_ops_ref()->rmsnorm_forward(loom_ops_ref(), c->out, c->rstd, c->inp, c->w, LN, LC, 1e-5f);
  return dot_loss(c->out, c->r, LN * LC);
}

START_TEST(rmsnorm) {
  const loom_ops *ref = loom_ops_ref();
  rms_ctx c = {guarded(LN * LC), guarded(LN), random_buf(LN * LC, 14, -2, 3), random_buf(LC, 15, 0.5, 1.5),
               random_buf(LN * LC, 16, -1, 1)};
  rms_loss(&c);
  for (int n = 0; n < LN; n++) { /* the saved statistic is what it says */
    double ms = 0.0;
    for (int k = 0; k < LC; k++) ms += (double)c.inp[n * LC + k] * c.inp[n * LC + k];
    ck_assert_double_eq_tol(c.rstd[n], 1.0 / sqrt(ms / LC + 1e-5), 1e-5);
  }
  float *di = guarded(LN * LC), *dw = guarded(LC);
  ref->rmsnorm_backward(ref, di, dw, c.r, c.inp, c.w, c.rstd, LN, LC);
  fd_check(c.inp, LN * LC, di, rms_loss, &c, "rmsnorm dinp");
  fd_check(c.w, LC, dw, rms_loss, &c, "rmsnorm dweight");
}
END_TEST

enum { SN = 4, SF = 9 };
typedef struct {
  float *out, *inp, *r;
  loom_glu glu;
} swiglu_ctx;
static double swiglu_loss(void *p) {
  swiglu_ctx *c = p;
  loom_ops_ref()->swiglu_forward(loom_ops_ref(), c->out, c->inp, SN, SF, c->glu);
  return dot_loss(c->out, c->r, SN * SF);
}

/* SwiGLU, and GPT-OSS's unit with a clamp of 2.5 that the inputs in [-4, 4] cross both ways (none within the
 * differences' step of it, where the clamp's kink would leave them nothing to agree on: at 2 one is). */
START_TEST(swiglu) {
  const loom_ops *ref = loom_ops_ref();
  const loom_glu units[2] = {{0}, {.alpha = 1.702f, .clamp = 2.5f, .offset = 1.0f}};
  for (int u = 0; u < 2; u++) {
    swiglu_ctx c = {guarded(SN * SF), random_buf(SN * 2 * SF, 17, -4, 4), random_buf(SN * SF, 18, -1, 1), units[u]};
    swiglu_loss(&c);
    /* silu(g) * u, at one element worked by hand: silu(2) = 2 / (1 + e^-2); GPT-OSS's: (clamp(u) + 1) g' sigmoid(1.702 g'),
     * g' = min(g, 2.5) */
    for (int i = 0; i < SN * SF; i++) {
      const double g = c.inp[(i / SF) * 2 * SF + i % SF], x = c.inp[(i / SF) * 2 * SF + SF + i % SF];
      const double want = u ? (fmin(fmax(x, -2.5), 2.5) + 1.0) * fmin(g, 2.5) / (1.0 + exp(-1.702 * fmin(g, 2.5)))
                            : g / (1.0 + exp(-g)) * x;
      ck_assert_msg(fabs(c.out[i] - want) <= 1e-5 * (1.0 + fabs(want)), "unit %d element %d: %g, want %g", u, i, c.out[i], want);
    }
    float *di = guarded(SN * 2 * SF);
    ref->swiglu_backward(ref, di, c.r, c.inp, SN, SF, c.glu);
    fd_check(c.inp, SN * 2 * SF, di, swiglu_loss, &c, u ? "GPT-OSS's unit dinp" : "swiglu dinp");
  }
}
END_TEST

/* Two heads of q and one of k turned in rows of 4 heads (v untouched), at positions 5.. */
enum { RT = 3, RB = 2, RD = 8, RHEADS = 3, RSTRIDE = 4 * RD };
typedef struct { float *x, *work, *r; } rope_ctx;
static double rope_loss(void *p) {
  rope_ctx *c = p;
  memcpy(c->work, c->x, RT * RB * RSTRIDE * sizeof(float));
  loom_ops_ref()->rope_forward(loom_ops_ref(), c->work, RT, RB, RSTRIDE, RHEADS, RD, 5, (loom_rope){.theta = 100.0f});
  return dot_loss(c->work, c->r, RT * RB * RSTRIDE);
}

START_TEST(rope) {
  const loom_ops *ref = loom_ops_ref();
  const size_t n = RT * RB * RSTRIDE;
  rope_ctx c = {random_buf(n, 19, -2, 2), guarded(n), random_buf(n, 20, -1, 1)};
  rope_loss(&c);
  /* Row (t 1, b 0), head 1, pair 2: turned by (5 + 1) * 100^(-2*2/8) = 0.6 rad; the 4th head is v, unturned. */
  const size_t at = (size_t)(1 * RB + 0) * RSTRIDE + 1 * RD;
  const double a = 6.0 * pow(100.0, -0.5), x1 = c.x[at + 2], x2 = c.x[at + 2 + RD / 2];
  ck_assert_double_eq_tol(c.work[at + 2], x1 * cos(a) - x2 * sin(a), 1e-5);
  ck_assert_double_eq_tol(c.work[at + 2 + RD / 2], x2 * cos(a) + x1 * sin(a), 1e-5);
  ck_assert_mem_eq(c.work + 3 * RD, c.x + 3 * RD, RD * sizeof(float));
  /* Backward: the grad of x is the transpose turn of the output's grad. */
  float *dx = copy_buf(c.r, n);
  ref->rope_backward(ref, dx, RT, RB, RSTRIDE, RHEADS, RD, 5, (loom_rope){.theta = 100.0f});
  fd_check(c.x, n, dx, rope_loss, &c, "rope dx");
}
END_TEST

/* Llama 3.1's scaled frequencies (theta 500000, head 128, factor 8, low 1,
 * high 4, 8192 original positions) in each of the three bands, worked out
 * here: a wavelength 2 pi / f under 8192 / 4 keeps f, one over 8192 / 1 is
 * divided by 8, and one between mixes the two by s = (8192 / wavelength -
 * 1) / (4 - 1). Unscaled, every frequency is theta^(-2i/128). */
START_TEST(rope_scaling_frequencies) {
  const loom_rope plain = {.theta = 500000.0f}, scaled = {.theta = 500000.0f, .factor = 8.0f, .low_freq_factor = 1.0f,
                                                          .high_freq_factor = 4.0f, .original_max_position = 8192};
  const int D = 128;
  for (int i = 0; i < D / 2; i++) {
    const double f = pow(500000.0, -2.0 * i / D), wavelength = 2.0 * 3.14159265358979323846 / f;
    ck_assert_double_eq_tol(loom_rope_frequency(i, D, plain), f, 1e-12 * f);
    double want = f; /* the high band */
    if (wavelength > 8192.0) want = f / 8.0;
    else if (wavelength >= 2048.0) want = (1.0 - (8192.0 / wavelength - 1.0) / 3.0) * f / 8.0 + (8192.0 / wavelength - 1.0) / 3.0 * f;
    ck_assert_double_eq_tol(loom_rope_frequency(i, D, scaled), want, 1e-12 * f);
  }
  /* The bands are where the text says: i 0..28 kept, 29..34 mixed, 35.. divided (wavelengths 2048 and 8192). */
  ck_assert_double_eq(loom_rope_frequency(28, D, scaled), loom_rope_frequency(28, D, plain));
  ck_assert_double_lt(loom_rope_frequency(30, D, scaled), loom_rope_frequency(30, D, plain));
  ck_assert_double_gt(loom_rope_frequency(30, D, scaled), loom_rope_frequency(30, D, plain) / 8.0);
  ck_assert_double_eq_tol(loom_rope_frequency(40, D, scaled), loom_rope_frequency(40, D, plain) / 8.0, 1e-18);
  ck_assert_double_eq(loom_rope_angle(3, 40, D, scaled), 3.0 * loom_rope_frequency(40, D, scaled));
}
END_TEST

/* YaRN's frequencies as GPT-OSS configures them (theta 150000, head 64,
 * factor 32, 4096 original positions, beta_fast 32, beta_slow 1, no
 * truncation), worked out here: the correction dims of 32 and 1 rotations
 * over 4096 positions, D ln(4096 / (rotations 2 pi)) / (2 ln theta), are
 * 8.09 and 17.40; dims below the first keep f, those past the second take
 * f / 32, and a linear ramp mixes the two between; truncated (DeepSeek's
 * default) the range is [8, 18]. The attention factor, 0.1 ln 32 + 1,
 * scales cos and sin. */
START_TEST(yarn_frequencies) {
  const int D = 64;
  const double pi = 3.14159265358979323846, theta = 150000.0;
  const double low = D * log(4096.0 / (32.0 * 2.0 * pi)) / (2.0 * log(theta)), high = D * log(4096.0 / (2.0 * pi)) / (2.0 * log(theta));
  ck_assert_double_eq_tol(low, 8.09, 0.01);
  ck_assert_double_eq_tol(high, 17.40, 0.01);
  loom_rope yarn = {.theta = 150000.0f, .factor = 32.0f, .original_max_position = 4096, .yarn = 1, .beta_fast = 32.0f,
                    .beta_slow = 1.0f, .attention_factor = (float)(0.1 * log(32.0) + 1.0)};
  for (int truncate = 0; truncate < 2; truncate++) {
    yarn.truncate = truncate;
    const double lo = truncate ? 8.0 : low, hi = truncate ? 18.0 : high;
    for (int i = 0; i < D / 2; i++) {
      const double f = pow(theta, -2.0 * i / D), ramp = i <= lo ? 0.0 : i >= hi ? 1.0 : (i - lo) / (hi - lo);
      const double want = (1.0 - ramp) * f + ramp * f / 32.0;
      ck_assert_msg(fabs(loom_rope_frequency(i, D, yarn) - want) <= 1e-12 * f, "dim %d (truncate %d): %g, want %g", i, truncate,
                    loom_rope_frequency(i, D, yarn), want);
    }
  }
  ck_assert_double_eq(loom_rope_frequency(5, D, yarn), pow(theta, -10.0 / D)); /* below the range: kept */
  ck_assert_double_eq_tol(loom_rope_frequency(30, D, yarn), pow(theta, -60.0 / D) / 32.0, 1e-18); /* past it: / 32 */
  float c, sn;
  loom_rope_turn(7, 30, D, yarn, 1.0, &c, &sn);
  const double a = 7.0 * loom_rope_frequency(30, D, yarn), m = 0.1 * log(32.0) + 1.0;
  ck_assert_float_eq_tol(c, (float)(m * cos(a)), 1e-7f);
  ck_assert_float_eq_tol(sn, (float)(m * sin(a)), 1e-7f);
}
END_TEST

START_TEST(op_parity) {
  const op_backend b = _i < OP_CASE_COUNT ? op_backend_cpu() : op_backend_guarded();
  const op_case *c = &OP_CASES[_i % OP_CASE_COUNT];
  op_report r = {0};
  c->run(&b, &r);
  ck_assert_msg(r.checks > 0, "%s: compared nothing", c->name);
  ck_assert_msg(r.failures == 0, "%s on %s: %d of %d comparisons failed; first: %s", c->name, b.name, r.failures, r.checks,
                r.first);
}
END_TEST

/* Every function entry of every backend's table is set, and every one has a
 * parity case, so a new op cannot land untested. */
START_TEST(every_op_is_set_and_tested) {
  const int n = op_table_entries();
  ck_assert_int_gt(n, 0);
  ck_assert_uint_eq(op_table_offset(n - 1) + sizeof(void (*)(void)), sizeof(loom_ops)); /* nothing after the last */
  const loom_ops *tables[] = {loom_ops_cpu(), loom_ops_ref(), loom_ops_guarded()};
  for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++) {
    ck_assert_msg(tables[t]->mem != NULL, "%s: no memory", tables[t]->name);
    for (int k = 0; k < n; k++)
      ck_assert_msg(op_table_entry(tables[t], k) != NULL, "%s: op-table entry %d (offset %zu) is not set", tables[t]->name,
                    k, op_table_offset(k));
  }
  for (int k = 0; k < n; k++) {
    bool covered = false;
    for (int c = 0; c < OP_CASE_COUNT; c++)
      for (int e = 0; e < OP_CASES[c].nentries; e++) covered |= OP_CASES[c].entries[e] == op_table_offset(k);
    ck_assert_msg(covered, "op-table entry %d (offset %zu) has no parity case in tests/op_parity.c", k, op_table_offset(k));
  }
}
END_TEST

/* ---- bf16 ---- */

/* Round to nearest even, worked by hand: exact values stay, a tie goes to the
 * even neighbour, past a tie rounds up, overflow is inf, NaN stays NaN. */
START_TEST(bf16_rounding) {
  const struct {
    uint32_t in;
    uint16_t out;
  } cases[] = {
      {0x3f800000u, 0x3f80}, /* 1 */
      {0x3f808000u, 0x3f80}, /* 1 + 2^-8, a tie: to the even 1 */
      {0x3f818000u, 0x3f82}, /* a tie above an odd mantissa: up */
      {0x3f808001u, 0x3f81}, /* just past a tie: up */
      {0x3f807fffu, 0x3f80}, /* just below: down */
      {0xbf818000u, 0xbf82}, /* negative, the same */
      {0x7f7fffffu, 0x7f80}, /* the largest float rounds past bf16's largest: inf */
      {0x7f800000u, 0x7f80}, /* inf */
      {0x00000001u, 0x0000}, /* the smallest subnormal: to zero */
      {0x80000000u, 0x8000}, /* -0 */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    float x;
    memcpy(&x, &cases[i].in, sizeof x);
    ck_assert_msg(loom_bf16_round(x) == cases[i].out, "0x%08x rounds to 0x%04x, not 0x%04x", cases[i].in,
                  loom_bf16_round(x), cases[i].out);
    const float back = loom_bf16_value(cases[i].out);
    uint32_t bits;
    memcpy(&bits, &back, sizeof bits);
    if ((cases[i].in & 0xffffu) == 0) ck_assert_uint_eq(bits, cases[i].in); /* a bf16 value comes back exactly */
  }
  const float nan = NAN;
  ck_assert(isnan(loom_bf16_value(loom_bf16_round(nan))));
}
END_TEST

/* ---- tensor memory ---- */

/* Every backend's memory calls do what they say: fills, copies (overlapping
 * too), strided copies and host transfers, read back through the host. */
/* The bf16 GEMM's two paths (cpu_bf16_gemm.h) against one another and
 * against an fp64 sum of the same bf16 products, for every layout a linear
 * layer asks for, overwriting and accumulating: NMSE <= 1e-12 (each product
 * of two bf16 values is exact in fp32; only the summation order differs).
 * Where this CPU has no bf16 instructions the native path is refused, and
 * the widening path is checked alone. */
static void bf16_gemm_case(loom_bf16_gemm_path path, const loom_gemm_shape *s, const uint16_t *A, const uint16_t *B,
                           const float *C0, const char *what) {
  const size_t nc = (size_t)s->M * s->N, na = (size_t)s->M * s->K, nb = (size_t)s->K * s->N;
  float *want = guarded(nc), *a = guarded(na), *b = guarded(nb);
  for (size_t i = 0; i < na; i++) a[i] = loom_bf16_value(A[i]);
  for (size_t i = 0; i < nb; i++) b[i] = loom_bf16_value(B[i]);
  for (int i = 0; i < s->M; i++)
    for (int j = 0; j < s->N; j++) {
      double sum = s->beta != 0.0f ? (double)C0[(size_t)i * s->N + j] : 0.0;
      for (int k = 0; k < s->K; k++) {
        const uint16_t x = s->ta ? A[(size_t)k * s->M + i] : A[(size_t)i * s->K + k];
        const uint16_t y = s->tb ? B[(size_t)j * s->K + k] : B[(size_t)k * s->N + j];
        sum += (double)loom_bf16_value(x) * (double)loom_bf16_value(y);
      }
      want[(size_t)i * s->N + j] = (float)sum;
    }
  /* Operands as bf16 bits, or as fp32 holding the same values (a bf16 run's activations). */
  const loom_bf16_operand forms[][2] = {{loom_bf16_bits(A), loom_bf16_bits(B)},
                                        {loom_bf16_values(a), loom_bf16_bits(B)},
                                        {loom_bf16_values(a), loom_bf16_values(b)}};
  for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++) {
    float *c = copy_buf(C0, nc);
    loom_cpu_bf16_gemm_run(path, s, forms[f][0], forms[f][1], c);
    check_guard(c, nc, what);
    const double e = tu_nmse(c, want, nc);
    ck_assert_msg(e <= 1e-12, "%s (%s path, operand form %zu): NMSE %.3g against the fp64 sum", what,
                  loom_cpu_bf16_gemm_path_name(path), f, e);
  }
}

START_TEST(bf16_gemm_paths_agree) {
  const int N = 37, C = 61, OC = 53;
  loom_gemm_shape g[LOOM_LINEAR_GEMMS];
  loom_cpu_linear_gemms(N, C, OC, g);
  static const char *const ROLE[LOOM_LINEAR_GEMMS] = {"forward", "input grad", "weight grad"};
  const bool native = loom_cpu_bf16_native_available();
  const loom_bf16_gemm_path chosen = loom_cpu_bf16_gemm_path();
  ck_assert_int_eq(chosen, native ? LOOM_BF16_GEMM_NATIVE : LOOM_BF16_GEMM_WIDEN);
  char impl[128];
  loom_cpu_bf16_gemm_describe(LOOM_BF16_GEMM_NATIVE, impl, sizeof impl);
  printf("bf16 GEMM on this CPU: %s\n", impl);
  if (native) ck_assert_msg(strstr(impl, "bf16") || strstr(impl, "amx"), "oneDNN runs %s", impl);
  else ck_assert(!loom_cpu_bf16_gemm_force(LOOM_BF16_GEMM_NATIVE));
  for (int r = 0; r < LOOM_LINEAR_GEMMS; r++) {
    for (int beta = 0; beta < 2; beta++) {
      loom_gemm_shape s = g[r];
      s.beta = (float)beta;
      const size_t na = (size_t)s.M * s.K, nb = (size_t)s.K * s.N;
      float *a = random_buf(na, 10 + r, -2, 2), *b = random_buf(nb, 20 + r, -2, 2), *c0 = random_buf((size_t)s.M * s.N, 30 + r, -1, 1);
      uint16_t *A = malloc(na * sizeof *A), *B = malloc(nb * sizeof *B);
      for (size_t i = 0; i < na; i++) A[i] = loom_bf16_round(a[i]);
      for (size_t i = 0; i < nb; i++) B[i] = loom_bf16_round(b[i]);
      char what[64];
      snprintf(what, sizeof what, "%s, beta %d", ROLE[r], beta);
      bf16_gemm_case(LOOM_BF16_GEMM_WIDEN, &s, A, B, c0, what);
      if (native) bf16_gemm_case(LOOM_BF16_GEMM_NATIVE, &s, A, B, c0, what);
      if (native) { /* each shape's own implementation, as `bench step --verbose` names it */
        loom_cpu_bf16_gemm_impl(&s, impl, sizeof impl);
        ck_assert_msg(strstr(impl, "bf16") || strstr(impl, "amx"), "%s: oneDNN runs %s", what, impl);
      }
      free(A);
      free(B);
    }
  }
}
END_TEST

START_TEST(memory_calls) {
  const loom_allocator *mems[] = {loom_ops_cpu()->mem, loom_ops_guarded()->mem};
  for (size_t k = 0; k < sizeof mems / sizeof *mems; k++) {
    const loom_allocator *mem = mems[k];
    enum { N = 24 };
    float host[N], back[N];
    for (int i = 0; i < N; i++) host[i] = (float)i + 0.5f;
    float *a = loom_xzalloc(mem, N * sizeof(float), "test"), *b = loom_xzalloc(mem, N * sizeof(float), "test");
    ck_assert(mem->owns(mem, a) && mem->owns(mem, a + N - 1));
    mem->to_host(mem, back, a, sizeof back);
    for (int i = 0; i < N; i++) ck_assert_float_eq(back[i], 0.0f); /* zeroed */
    mem->from_host(mem, a, host, sizeof host);
    mem->copy(mem, a + 1, a, (N - 1) * sizeof(float)); /* overlapping: memmove */
    mem->to_host(mem, back, a, sizeof back);
    float shifted[N]; /* what a now holds */
    for (int i = 0; i < N; i++) shifted[i] = i == 0 ? host[0] : host[i - 1];
    ck_assert_mem_eq(back, shifted, sizeof back);
    const float one = 1.0f;
    uint32_t bits;
    memcpy(&bits, &one, sizeof bits);
    mem->fill32(mem, b, bits, N);
    mem->copy_2d(mem, b, 6 * sizeof(float), a, 4 * sizeof(float), 2 * sizeof(float), 3); /* 3 rows of 2 */
    mem->to_host(mem, back, b, sizeof back);
    for (int r = 0; r < 4; r++)
      for (int c = 0; c < 6; c++) ck_assert_float_eq(back[r * 6 + c], r < 3 && c < 2 ? shifted[r * 4 + c] : 1.0f);
    mem->release(mem, a);
    mem->release(mem, b);
  }
  float plain = 0.0f;
  ck_assert(!loom_ops_guarded()->mem->owns(loom_ops_guarded()->mem, &plain)); /* host memory is not the guarded backend's */
}
END_TEST

/* Host code that dereferences the guarded backend's memory dies at once of a
 * segmentation fault, with a message naming the guarded backend. */
START_TEST(guarded_memory_faults_on_host_access) {
  int err[2];
  ck_assert_int_eq(pipe(err), 0);
  const pid_t child = fork();
  ck_assert_int_ge(child, 0);
  if (child == 0) {
    dup2(err[1], STDERR_FILENO);
    const loom_allocator *mem = loom_ops_guarded()->mem;
    volatile float *x = mem->zalloc(mem, 16 * sizeof(float), "test");
    x[3] = 1.0f; /* the stray access */
    _exit(0);
  }
  close(err[1]);
  char said[512] = "";
  size_t got = 0;
  ssize_t n;
  while (got < sizeof said - 1 && (n = read(err[0], said + got, sizeof said - 1 - got)) > 0) got += (size_t)n;
  said[got] = '\0';
  close(err[0]);
  int status = 0;
  ck_assert_int_eq(waitpid(child, &status, 0), child);
  ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV, "the stray access did not fault (status %d)", status);
  ck_assert_msg(strstr(said, "under the guarded backend: host code dereferenced tensor memory") != NULL,
                "no message naming the guarded backend: '%s'", said);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ops");
  TCase *tc = tcase_create("ops");
  tcase_add_checked_fixture(tc, NULL, free_buffers);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, matmul);
  tcase_add_test(tc, layernorm);
  tcase_add_test(tc, rmsnorm);
  tcase_add_test(tc, swiglu);
  tcase_add_test(tc, rope);
  tcase_add_test(tc, rope_scaling_frequencies);
  tcase_add_test(tc, yarn_frequencies);
  tcase_add_test(tc, gelu);
  tcase_add_loop_test(tc, attention, 0, 3);
  tcase_add_loop_test(tc, attention_with_dropout, 0, 3);
  tcase_add_test(tc, embedding);
  tcase_add_test(tc, crossentropy);
  tcase_add_test(tc, fast_math);
  tcase_add_test(tc, dropout);
  tcase_add_test(tc, adamw);
  tcase_add_loop_test(tc, op_parity, 0, 2 * OP_CASE_COUNT);
  tcase_add_test(tc, every_op_is_set_and_tested);
  tcase_add_test(tc, memory_calls);
  tcase_add_test(tc, bf16_rounding);
  tcase_add_test(tc, bf16_gemm_paths_agree);
  tcase_add_test(tc, guarded_memory_faults_on_host_access);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
