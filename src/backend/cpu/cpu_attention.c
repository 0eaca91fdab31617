/* The CPU backend's attention, forward and backward, whole and in blocks. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu_attention.h"
#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_math.h"
#include "backend/op_math.h"
#include "core/check.h"

static inline float dot(const float *a, const float *b, int n) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int i = 0; i < n; i++) acc += a[i] * b[i];
  return acc;
}

/* Multiplier of probability (b,h,tq,tk) on v: 1 without dropout, else mask/(1-p). */
static inline float keep_scale(const loom_dropout *d, const loom_attn_shape *s, int b, int h,
                               int tq, int tk) {
  if (!d || d->p <= 0.0f) return 1.0f;
  return loom_dropout_keep(d, loom_attn_dropout_index(d, s, b, h, tq, tk)) ? 1.0f / (1.0f - d->p)
                                                                            : 0.0f;
}

/* The rows of the attention ops' blocks are vectorised: the keys query
 * row tq sees, a run [a, m) of the block's columns (columns 0.. are keys
 * lo.., loom_attn_sees), are computed in branch-free loops (dropout's mask
 * in a loop of its own, only when there is one), and the columns it does
 * not see, which the mask zeroes, are filled apart. */
static bool dropping(const loom_dropout *d) { return d && d->p > 0.0f; }

/* The columns [*a, *m) of a block whose column 0 is key lo that query row tq sees. */
static void seen_columns(const loom_attn_shape *s, int tq, int lo, int *a, int *m) {
  const int first = s->window > 0 && tq - s->window > 0 ? tq - s->window : 0;
  *a = first > lo ? first - lo : 0, *m = tq + 1 - lo;
}

/* Zeroes the columns of a row of n outside [a, m). */
static void zero_outside(float *x, int a, int m, int n) {
  if (a > 0) memset(x, 0, (size_t)a * sizeof(float));
  if (n > m) memset(x + m, 0, (size_t)(n - m) * sizeof(float));
}

/* Row tq of a block (column 0: key lo): its scores pr[0..n) become the
 * probabilities that multiply v (dropout's mask and scale applied, 0 where
 * the row does not see the key); returns the row's log-sum-exp. */
static float softmax_row(float *pr, int tq, int lo, int n, const loom_dropout *drop, const loom_attn_shape *s, int b, int h) {
  int a, m;
  seen_columns(s, tq, lo, &a, &m);
  float maxv = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : maxv)
  for (int tk = a; tk < m; tk++) maxv = pr[tk] > maxv ? pr[tk] : maxv;
#pragma omp simd reduction(+ : sum)
  for (int tk = a; tk < m; tk++) {
    pr[tk] = loom_fast_expf(pr[tk] - maxv);
    sum += pr[tk];
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int tk = a; tk < m; tk++) pr[tk] *= inv;
  if (dropping(drop))
    for (int tk = a; tk < m; tk++) pr[tk] *= keep_scale(drop, s, b, h, tq, lo + tk);
  zero_outside(pr, a, m, n);
  return maxv + logf(sum);
}

/* Row tq of a backward block (column 0: key lo): its scores pr and dp =
 * dout v^T become the probabilities that multiplied v (p rebuilt from the
 * saved log-sum-exp, dropout's mask and scale applied) and dS = p (dp keep
 * - delta) scale, 0 where the row does not see the key. */
static void softmax_grad_row(float *pr, float *dpr, int tq, int lo, int n, float lse, float delta, float scale,
                             const loom_dropout *drop, const loom_attn_shape *s, int b, int h) {
  int a, m;
  seen_columns(s, tq, lo, &a, &m);
  if (!dropping(drop)) {
#pragma omp simd
    for (int tk = a; tk < m; tk++) {
      const float prob = loom_fast_expf(pr[tk] - lse);
      pr[tk] = prob;
      dpr[tk] = prob * (dpr[tk] - delta) * scale;
    }
  } else {
    for (int tk = a; tk < m; tk++) {
      const float prob = loom_fast_expf(pr[tk] - lse), keep = keep_scale(drop, s, b, h, tq, lo + tk);
      pr[tk] = prob * keep;                              /* what multiplied v */
      dpr[tk] = prob * (dpr[tk] * keep - delta) * scale; /* dS */
    }
  }
  zero_outside(pr, a, m, n);
  zero_outside(dpr, a, m, n);
}

/* The first key a tile of query rows from i0 reaches (under a window its first row's window's first, else 0). */
static int tile_first_key(const loom_attn_shape *s, int i0) { return s->window > 0 && i0 - s->window > 0 ? i0 - s->window : 0; }

/* Rows t of one head's k or v (stride `stride` floats in qkv) copied to a
 * packed [T, D] block and back: qkv's rows lie 3 x hidden x B floats apart,
 * a multiple of 4 KiB at GPT shapes, so reading them in place keeps
 * evicting one L1 set. Copies change no arithmetic. */
static void pack_rows(float *dst, const float *src, size_t stride, int T, int D) {
  for (int t = 0; t < T; t++) memcpy(dst + (size_t)t * D, src + t * stride, (size_t)D * sizeof(float));
}

static void unpack_rows(float *dst, size_t stride, const float *src, int T, int D) {
  for (int t = 0; t < T; t++) memcpy(dst + t * stride, src + (size_t)t * D, (size_t)D * sizeof(float));
}

enum { ATT_ROWS = 64 }; /* query rows per block of the attention ops */

/* Flash attention's contract on the CPU, blocked with GEMMs: for each block
 * of query rows, the scores against every key up to the block's last row
 * (S = Q K^T), each row's softmax and log-sum-exp (kept), then O = P V. The
 * scores live in a per-thread block buffer and are never kept. */
void loom_cpu_attention_forward(const loom_ops *be, float *out, float *lse, const float *qkv,
                                  const loom_attn_shape *s, const loom_dropout *drop) {
  loom_attn_shape_check(s);
  const int T = s->T, B = s->B, H = s->heads, D = s->head_dim, Dv = loom_attn_v_dim(s);
  const size_t width = loom_attn_out_width(s), w3 = loom_attn_qkv_width(s), row3 = w3 * B, row = width * B;
  const size_t block = (size_t)T * D, vblock = (size_t)T * Dv;
  const float scale = loom_attn_scale(s);
  const loom_gemm_library lib = loom_cpu_gemm_library();
#pragma omp parallel
  {
    float *k = loom_xmalloc((2 * block + 2 * vblock + (size_t)ATT_ROWS * T) * sizeof(float), "attention scratch");
    float *q = k + block, *v = q + block, *o = v + vblock, *p = o + vblock;
#pragma omp for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; b++)
      for (int h = 0; h < H; h++) {
        const float *base = qkv + (size_t)b * w3;
        const size_t g = (size_t)loom_attn_kv_head(s, h);
        pack_rows(q, base + (size_t)h * D, row3, T, D);
        pack_rows(k, base + ((size_t)H + g) * D, row3, T, D);
        pack_rows(v, base + ((size_t)H + s->kv_heads) * D + g * Dv, row3, T, Dv);
        for (int i0 = 0; i0 < T; i0 += ATT_ROWS) {
          /* keys lo..i0+R-1 reach its rows: n of them */
          const int R = T - i0 < ATT_ROWS ? T - i0 : ATT_ROWS, lo = tile_first_key(s, i0), n = i0 + R - lo;
          const float *kt = k + (size_t)lo * D, *vt = v + (size_t)lo * Dv;
          loom_cpu_sgemm_with(lib, false, true, R, n, D, scale, q + (size_t)i0 * D, D, kt, D, 0.0f, p, n);
          for (int r = 0; r < R; r++)
            lse[((size_t)b * H + h) * T + i0 + r] = softmax_row(p + (size_t)r * n, i0 + r, lo, n, drop, s, b, h);
          loom_cpu_sgemm_with(lib, false, false, R, Dv, n, 1.0f, p, n, vt, Dv, 0.0f, o + (size_t)i0 * Dv, Dv);
        }
        unpack_rows(out + (size_t)b * width + (size_t)h * Dv, row, o, T, Dv);
      }
    free(k);
  }
}

/* Blocked as flash attention's backward, with GEMMs: for each block of
 * query rows, the scores against every key up to the block's last row
 * (S = Q K^T), p rebuilt from the saved log-sum-exps, dP = dout V^T, then
 * dS = p (dP - dout . out) scale (the softmax's sum_k p dp is dout . out,
 * ops.h) and three products: dV += P^T dout, dK += dS^T Q, dQ += dS K. */
void loom_cpu_attention_backward(const loom_ops *be, float *dqkv, const float *dout, const float *out, const float *qkv,
                                   const float *lse, const loom_attn_shape *s, const loom_dropout *drop) {
  loom_attn_shape_check(s);
  const int T = s->T, B = s->B, H = s->heads, K = s->kv_heads, D = s->head_dim, Dv = loom_attn_v_dim(s), group = H / K;
  const size_t width = loom_attn_out_width(s), w3 = loom_attn_qkv_width(s), row3 = w3 * B, row = width * B;
  const size_t block = (size_t)T * D, vblock = (size_t)T * Dv, tile = (size_t)ATT_ROWS * T;
  const float scale = loom_attn_scale(s);
  const loom_gemm_library lib = loom_cpu_gemm_library();
  /* Each (b, kv head) touches only its own columns of dqkv: its k and v, and the q of the heads it serves. */
#pragma omp parallel
  {
    float *k = loom_xmalloc((4 * block + 3 * vblock + 2 * tile + (size_t)T) * sizeof(float), "attention scratch");
    float *dk = k + block, *q = dk + block, *dq = q + block, *v = dq + block, *dv = v + vblock, *dy = dv + vblock;
    float *p = dy + vblock, *dp = p + tile, *delta = dp + tile;
#pragma omp for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; b++)
      for (int g = 0; g < K; g++) {
        const size_t kat = (size_t)b * w3 + ((size_t)H + g) * D, vat = (size_t)b * w3 + ((size_t)H + K) * D + (size_t)g * Dv;
        pack_rows(k, qkv + kat, row3, T, D);
        pack_rows(v, qkv + vat, row3, T, Dv);
        pack_rows(dk, dqkv + kat, row3, T, D); /* accumulated into, as in place */
        pack_rows(dv, dqkv + vat, row3, T, Dv);
        for (int h = g * group; h < (g + 1) * group; h++) {
          const size_t head = (size_t)b * w3 + (size_t)h * D, at = (size_t)b * width + (size_t)h * Dv;
          const float *l = lse + ((size_t)b * H + h) * T;
          pack_rows(q, qkv + head, row3, T, D);
          pack_rows(dq, dqkv + head, row3, T, D);
          pack_rows(dy, dout + at, row, T, Dv);
          for (int t = 0; t < T; t++) delta[t] = dot(dy + (size_t)t * Dv, out + t * row + at, Dv);
          for (int i0 = 0; i0 < T; i0 += ATT_ROWS) {
            /* keys lo..i0+R-1 reach its rows: n of them */
            const int R = T - i0 < ATT_ROWS ? T - i0 : ATT_ROWS, lo = tile_first_key(s, i0), n = i0 + R - lo;
            const float *qi = q + (size_t)i0 * D, *dyi = dy + (size_t)i0 * Dv, *kt = k + (size_t)lo * D,
                        *vt = v + (size_t)lo * Dv;
            loom_cpu_sgemm_with(lib, false, true, R, n, D, scale, qi, D, kt, D, 0.0f, p, n);
            loom_cpu_sgemm_with(lib, false, true, R, n, Dv, 1.0f, dyi, Dv, vt, Dv, 0.0f, dp, n);
            for (int r = 0; r < R; r++)
              softmax_grad_row(p + (size_t)r * n, dp + (size_t)r * n, i0 + r, lo, n, l[i0 + r], delta[i0 + r], scale, drop,
                               s, b, h);
            loom_cpu_sgemm_with(lib, true, false, n, Dv, R, 1.0f, p, n, dyi, Dv, 1.0f, dv + (size_t)lo * Dv, Dv);
            loom_cpu_sgemm_with(lib, true, false, n, D, R, 1.0f, dp, n, qi, D, 1.0f, dk + (size_t)lo * D, D);
            loom_cpu_sgemm_with(lib, false, false, R, D, n, 1.0f, dp, n, kt, D, 1.0f, dq + (size_t)i0 * D, D);
          }
          unpack_rows(dqkv + head, row3, dq, T, D);
        }
        unpack_rows(dqkv + kat, row3, dk, T, D);
        unpack_rows(dqkv + vat, row3, dv, T, Dv);
      }
    free(k);
  }
}

/* ---- context-parallel attention's blocks ---- */

/* A block's keys as runs of consecutive positions (a ring's blocks are
 * two): run r is keys [at, at + len) at positions first, first + 1, ...;
 * a query at pos sees a stretch of each (key_span). */
typedef struct {
  int at, len, first;
} key_run;

/* The runs of k_pos[0..n) into runs (room for n); returns how many. */
static int key_runs(const int *k_pos, int n, key_run *runs) {
  int count = 0;
  for (int t = 0; t < n; t++) {
    if (count && k_pos[t] == runs[count - 1].first + runs[count - 1].len && runs[count - 1].at + runs[count - 1].len == t)
      runs[count - 1].len++;
    else runs[count++] = (key_run){t, 1, k_pos[t]};
  }
  return count;
}

/* The keys [*a, *m) of run u that a query at pos sees (loom_attn_sees): a
 * prefix of it, or under a window a stretch; empty where *m <= *a. */
static void key_span(const key_run *u, int pos, int window, int *a, int *m) {
  const int end = pos - u->first + 1, start = window > 0 ? pos - window - u->first : 0;
  *m = end < 0 ? 0 : end > u->len ? u->len : end;
  *a = start < 0 ? 0 : start > *m ? *m : start;
}

/* Whether any of the queries at pos[0..R) sees any key of the runs (a tile none of whose rows does is skipped). */
static bool sees_any(const key_run *runs, int nruns, const int *pos, int R, int window) {
  for (int r = 0; r < R; r++)
    for (int i = 0; i < nruns; i++) {
      int a, m;
      key_span(&runs[i], pos[r], window, &a, &m);
      if (m > a) return true;
    }
  return false;
}

/* Row pos of a backward block: its scores pr and dp = dout v^T become the
 * probabilities that multiplied v and dS = p (dp keep - delta) scale over
 * the keys it sees (p rebuilt from the merged log-sum-exp lse), 0 for the
 * rest, as softmax_grad_row's, run by run. */
static void block_softmax_grad_row(float *pr, float *dpr, int pos, const key_run *runs, int nruns, const int *k_pos,
                                   float lse, float delta, float scale, const loom_dropout *drop, const loom_attn_shape *s,
                                   int b, int h) {
  for (int i = 0; i < nruns; i++) {
    float *x = pr + runs[i].at, *dx = dpr + runs[i].at;
    int a, m;
    key_span(&runs[i], pos, s->window, &a, &m);
    if (lse == -INFINITY) a = m = 0;
    if (!dropping(drop)) {
#pragma omp simd
      for (int t = a; t < m; t++) {
        const float prob = loom_fast_expf(x[t] - lse);
        x[t] = prob;
        dx[t] = prob * (dx[t] - delta) * scale;
      }
    } else {
      for (int t = a; t < m; t++) {
        const float prob = loom_fast_expf(x[t] - lse), keep = keep_scale(drop, s, b, h, pos, k_pos[runs[i].at + t]);
        x[t] = prob * keep;
        dx[t] = prob * (dx[t] * keep - delta) * scale;
      }
    }
    zero_outside(x, a, m, runs[i].len);
    zero_outside(dx, a, m, runs[i].len);
  }
}

/* Row pos of a block's scores pr[0..n) (keys in runs): the probabilities
 * that multiply v over the keys at or before the query's position (mask and
 * scale of dropout applied by the global positions; 0 for the rest); returns
 * the row's log-sum-exp over them, -inf where it sees none. Each run's
 * visible prefix in branch-free loops, as softmax_row's. */
static float block_softmax_row(float *pr, int n, int pos, const key_run *runs, int nruns, const int *k_pos,
                               const loom_dropout *drop, const loom_attn_shape *s, int b, int h) {
  float maxv = -INFINITY, sum = 0.0f;
  for (int i = 0; i < nruns; i++) {
    const float *x = pr + runs[i].at;
    int a, m;
    key_span(&runs[i], pos, s->window, &a, &m);
#pragma omp simd reduction(max : maxv)
    for (int t = a; t < m; t++) maxv = x[t] > maxv ? x[t] : maxv;
  }
  if (maxv == -INFINITY) {
    memset(pr, 0, (size_t)n * sizeof(float));
    return -INFINITY;
  }
  for (int i = 0; i < nruns; i++) {
    float *x = pr + runs[i].at;
    int a, m;
    key_span(&runs[i], pos, s->window, &a, &m);
#pragma omp simd reduction(+ : sum)
    for (int t = a; t < m; t++) {
      x[t] = loom_fast_expf(x[t] - maxv);
      sum += x[t];
    }
    zero_outside(x, a, m, runs[i].len);
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int t = 0; t < n; t++) pr[t] *= inv;
  if (dropping(drop))
    for (int t = 0; t < n; t++) pr[t] *= pr[t] > 0.0f ? keep_scale(drop, s, b, h, pos, k_pos[t]) : 1.0f;
  return maxv + logf(sum);
}

/* Folds a block's row (its output o_blk and log-sum-exp) into what earlier blocks left in o and *lse. */
static void merge_row(float *o, float *lse, const float *o_blk, float blk, int D, bool first) {
  if (blk == -INFINITY) {
    if (first) memset(o, 0, (size_t)D * sizeof(float)), *lse = -INFINITY;
    return;
  }
  const float old = first ? -INFINITY : *lse;
  const float merged = old > blk ? old + log1pf(expf(blk - old)) : blk + log1pf(expf(old - blk));
  const float keep = old == -INFINITY ? 0.0f : expf(old - merged), add = expf(blk - merged);
  /* Nothing before (the first block): o is not read, as it may hold anything, a NaN included (0 * NaN is NaN). */
  if (old == -INFINITY)
    for (int d = 0; d < D; d++) o[d] = add * o_blk[d];
  else
    for (int d = 0; d < D; d++) o[d] = keep * o[d] + add * o_blk[d];
  *lse = merged;
}

/* Blocked as attention_forward, with GEMMs: for each tile of query rows
 * the scores against the block's keys (S = Q K^T), each row's softmax over
 * the keys before it, O = P V, and each row merged into out. */
void loom_cpu_attention_block_forward(const loom_ops *be, float *out, float *lse, const float *q, const float *kv, int Tq,
                                        int Tk, const int *q_pos, const int *k_pos, const loom_attn_shape *s,
                                        const loom_dropout *drop, bool first) {
  loom_attn_shape_check(s);
  const int B = s->B, H = s->heads, K = s->kv_heads, D = s->head_dim, Dv = loom_attn_v_dim(s);
  const size_t width = loom_attn_out_width(s), w3 = loom_attn_qkv_width(s), kvw = loom_attn_kv_width(s);
  const float scale = loom_attn_scale(s);
  const loom_gemm_library lib = loom_cpu_gemm_library();
  key_run *runs = loom_xmalloc((size_t)Tk * sizeof *runs, "attention key runs");
  const int nruns = key_runs(k_pos, Tk, runs);
#pragma omp parallel
  {
    float *k = loom_xmalloc(((size_t)Tk * (D + Dv) + (size_t)Tq * (D + Dv) + (size_t)ATT_ROWS * Tk) * sizeof(float),
                            "attention scratch");
    float *v = k + (size_t)Tk * D, *x = v + (size_t)Tk * Dv, *o = x + (size_t)Tq * D, *p = o + (size_t)Tq * Dv;
#pragma omp for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; b++)
      for (int h = 0; h < H; h++) {
        const size_t g = (size_t)loom_attn_kv_head(s, h);
        pack_rows(x, q + (size_t)b * w3 + (size_t)h * D, w3 * B, Tq, D);
        pack_rows(k, kv + (size_t)b * kvw + g * D, kvw * B, Tk, D);
        pack_rows(v, kv + (size_t)b * kvw + (size_t)K * D + g * Dv, kvw * B, Tk, Dv);
        for (int i0 = 0; i0 < Tq; i0 += ATT_ROWS) {
          const int R = Tq - i0 < ATT_ROWS ? Tq - i0 : ATT_ROWS;
          float blk[ATT_ROWS];
          if (sees_any(runs, nruns, q_pos + i0, R, s->window)) {
            loom_cpu_sgemm_with(lib, false, true, R, Tk, D, scale, x + (size_t)i0 * D, D, k, D, 0.0f, p, Tk);
            for (int r = 0; r < R; r++)
              blk[r] = block_softmax_row(p + (size_t)r * Tk, Tk, q_pos[i0 + r], runs, nruns, k_pos, drop, s, b, h);
            loom_cpu_sgemm_with(lib, false, false, R, Dv, Tk, 1.0f, p, Tk, v, Dv, 0.0f, o + (size_t)i0 * Dv, Dv);
          } else {
            for (int r = 0; r < R; r++) blk[r] = -INFINITY;
            memset(o + (size_t)i0 * Dv, 0, (size_t)R * Dv * sizeof(float));
          }
          for (int r = 0; r < R; r++) {
            const int t = i0 + r;
            merge_row(out + ((size_t)t * B + b) * width + (size_t)h * Dv, lse + ((size_t)b * H + h) * Tq + t,
                      o + (size_t)t * Dv, blk[r], Dv, first);
          }
        }
      }
    free(k);
  }
  free(runs);
}

/* Blocked as attention_backward: per key/value head, the block's keys and
 * values against the query tiles of every head they serve, p rebuilt from
 * the merged log-sum-exps, dS = p (dP keep - dout . out) scale, and
 * dV += P^T dout, dK += dS^T Q, dQ += dS K. */
void loom_cpu_attention_block_backward(const loom_ops *be, float *dq, float *dkv, const float *dout, const float *out,
                                         const float *q, const float *kv, int Tq, int Tk, const int *q_pos,
                                         const int *k_pos, const float *lse, const loom_attn_shape *s,
                                         const loom_dropout *drop) {
  loom_attn_shape_check(s);
  const int B = s->B, H = s->heads, K = s->kv_heads, D = s->head_dim, Dv = loom_attn_v_dim(s), group = H / K;
  const size_t width = loom_attn_out_width(s), w3 = loom_attn_qkv_width(s), kvw = loom_attn_kv_width(s);
  const size_t keys = (size_t)Tk * D, vkeys = (size_t)Tk * Dv, rows = (size_t)Tq * D, vrows = (size_t)Tq * Dv;
  const size_t tile = (size_t)ATT_ROWS * Tk;
  const float scale = loom_attn_scale(s);
  const loom_gemm_library lib = loom_cpu_gemm_library();
  key_run *runs = loom_xmalloc((size_t)Tk * sizeof *runs, "attention key runs");
  const int nruns = key_runs(k_pos, Tk, runs);
  /* Each (b, kv head) touches only its own columns: its k and v, and the q of the heads it serves. */
#pragma omp parallel
  {
    float *k = loom_xmalloc((2 * keys + 2 * vkeys + 2 * rows + vrows + 2 * tile + (size_t)Tq) * sizeof(float),
                            "attention scratch");
    float *dk = k + keys, *v = dk + keys, *dv = v + vkeys, *x = dv + vkeys, *dx = x + rows, *dy = dx + rows;
    float *p = dy + vrows, *dp = p + tile, *delta = dp + tile;
#pragma omp for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; b++)
      for (int g = 0; g < K; g++) {
        const size_t kat = (size_t)b * kvw + (size_t)g * D, vat = (size_t)b * kvw + (size_t)K * D + (size_t)g * Dv;
        pack_rows(k, kv + kat, kvw * B, Tk, D);
        pack_rows(v, kv + vat, kvw * B, Tk, Dv);
        pack_rows(dk, dkv + kat, kvw * B, Tk, D);
        pack_rows(dv, dkv + vat, kvw * B, Tk, Dv);
        for (int h = g * group; h < (g + 1) * group; h++) {
          const size_t head = (size_t)b * w3 + (size_t)h * D, at = (size_t)b * width + (size_t)h * Dv;
          const float *l = lse + ((size_t)b * H + h) * Tq;
          pack_rows(x, q + head, w3 * B, Tq, D);
          pack_rows(dx, dq + head, w3 * B, Tq, D);
          pack_rows(dy, dout + at, width * B, Tq, Dv);
          for (int t = 0; t < Tq; t++) delta[t] = dot(dy + (size_t)t * Dv, out + (size_t)t * width * B + at, Dv);
          for (int i0 = 0; i0 < Tq; i0 += ATT_ROWS) {
            const int R = Tq - i0 < ATT_ROWS ? Tq - i0 : ATT_ROWS;
            const float *xi = x + (size_t)i0 * D, *dyi = dy + (size_t)i0 * Dv;
            if (!sees_any(runs, nruns, q_pos + i0, R, s->window)) continue; /* a tile none of whose rows sees a key adds nothing */
            loom_cpu_sgemm_with(lib, false, true, R, Tk, D, scale, xi, D, k, D, 0.0f, p, Tk);
            loom_cpu_sgemm_with(lib, false, true, R, Tk, Dv, 1.0f, dyi, Dv, v, Dv, 0.0f, dp, Tk);
            for (int r = 0; r < R; r++) {
              const int t = i0 + r;
              float *pr = p + (size_t)r * Tk, *dpr = dp + (size_t)r * Tk;
              block_softmax_grad_row(pr, dpr, q_pos[t], runs, nruns, k_pos, l[t], delta[t], scale, drop, s, b, h);
            }
            loom_cpu_sgemm_with(lib, true, false, Tk, Dv, R, 1.0f, p, Tk, dyi, Dv, 1.0f, dv, Dv);
            loom_cpu_sgemm_with(lib, true, false, Tk, D, R, 1.0f, dp, Tk, xi, D, 1.0f, dk, D);
            loom_cpu_sgemm_with(lib, false, false, R, D, Tk, 1.0f, dp, Tk, k, D, 1.0f, dx + (size_t)i0 * D, D);
          }
          unpack_rows(dq + head, w3 * B, dx, Tq, D);
        }
        unpack_rows(dkv + kat, kvw * B, dk, Tk, D);
        unpack_rows(dkv + vat, kvw * B, dv, Tk, Dv);
      }
    free(k);
  }
  free(runs);
}
