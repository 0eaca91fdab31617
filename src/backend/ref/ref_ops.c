/* The reference backend: naive loops, written to be obviously right. It is
 * the oracle every other backend is tested against, never the fast path. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/op_math.h"
#include "backend/ops.h"
#include "core/check.h"

static void ref_matmul_forward(const loom_ops *be, float *out, const float *inp, const float *weight,
                               const float *bias, int N, int C, int OC) {
  for (int n = 0; n < N; n++) {
    for (int o = 0; o < OC; o++) {
      double acc = bias ? bias[o] : 0.0;
      for (int c = 0; c < C; c++) acc += (double)inp[(size_t)n * C + c] * weight[(size_t)o * C + c];
      out[(size_t)n * OC + o] = (float)acc;
    }
  }
}

static void ref_matmul_backward(const loom_ops *be, float *dinp, float *dweight, float *dbias, const float *dout,
                                const float *inp, const float *weight, int N, int C, int OC) {
  for (int n = 0; n < N; n++) {
    for (int o = 0; o < OC; o++) {
      const float d = dout[(size_t)n * OC + o];
      if (dbias) dbias[o] += d;
      for (int c = 0; c < C; c++) {
        if (dinp) dinp[(size_t)n * C + c] += d * weight[(size_t)o * C + c];
        if (dweight) dweight[(size_t)o * C + c] += d * inp[(size_t)n * C + c];
      }
    }
  }
}

static void ref_layernorm_forward(const loom_ops *be, float *out, float *mean, float *rstd, const float *inp,
                                  const float *weight, const float *bias, int N, int C, float eps) {
  for (int n = 0; n < N; n++) {
    const float *x = inp + (size_t)n * C;
    double m = 0.0, var = 0.0;
    for (int c = 0; c < C; c++) m += x[c];
    m /= C;
    for (int c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
    var /= C;
    const double s = 1.0 / sqrt(var + eps);
    for (int c = 0; c < C; c++) out[(size_t)n * C + c] = (float)((x[c] - m) * s) * weight[c] + bias[c];
    mean[n] = (float)m;
    rstd[n] = (float)s;
  }
}

static void ref_layernorm_backward(const loom_ops *be, float *dinp, float *dweight, float *dbias, const float *dout,
                                   const float *inp, const float *weight, const float *mean,
                                   const float *rstd, int N, int C) {
  for (int n = 0; n < N; n++) {
    const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
    double dnorm_mean = 0.0, dnorm_norm_mean = 0.0;
    for (int c = 0; c < C; c++) {
      const double norm = (x[c] - mean[n]) * rstd[n];
      const double dnorm = (double)weight[c] * dy[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    for (int c = 0; c < C; c++) {
      const double norm = (x[c] - mean[n]) * rstd[n];
      const double dnorm = (double)weight[c] * dy[c];
      dbias[c] += dy[c];
      dweight[c] += (float)(norm * dy[c]);
      dinp[(size_t)n * C + c] += (float)((dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd[n]);
    }
  }
}

static void ref_rmsnorm_forward(const loom_ops *be, float *out, float *rstd, const float *inp, const float *weight, int N,
                                int C, float eps) {
  for (int n = 0; n < N; n++) {
    const float *x = inp + (size_t)n * C;
    double ms = 0.0;
    for (int c = 0; c < C; c++) ms += (double)x[c] * x[c];
    const double s = 1.0 / sqrt(ms / C + eps);
    for (int c = 0; c < C; c++) out[(size_t)n * C + c] = (float)(x[c] * s) * weight[c];
    rstd[n] = (float)s;
  }
}

/* y = x r w with r = (mean(x^2) + eps)^(-1/2): dx = r (w dy) - x r^3 mean(w dy x). */
static void ref_rmsnorm_backward(const loom_ops *be, float *dinp, float *dweight, const float *dout, const float *inp,
                                 const float *weight, const float *rstd, int N, int C) {
  for (int n = 0; n < N; n++) {
    const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
    const double r = rstd[n];
    double dot = 0.0;
    for (int c = 0; c < C; c++) dot += (double)weight[c] * dy[c] * x[c];
    dot /= C;
    for (int c = 0; c < C; c++) {
      dweight[c] += (float)(x[c] * r * dy[c]);
      dinp[(size_t)n * C + c] += (float)(r * weight[c] * dy[c] - x[c] * r * r * r * dot);
    }
  }
}

static void ref_swiglu_forward(const loom_ops *be, float *out, const float *inp, int N, int F, loom_glu glu) {
  for (int n = 0; n < N; n++)
    for (int f = 0; f < F; f++) {
      const float *row = inp + (size_t)n * 2 * F;
      out[(size_t)n * F + f] = loom_glu_act(loom_glu_gate(row[f], glu), glu) * loom_glu_up(row[F + f], glu);
    }
}

static void ref_swiglu_backward(const loom_ops *be, float *dinp, const float *dout, const float *inp, int N, int F,
                                loom_glu glu) {
  for (int n = 0; n < N; n++)
    for (int f = 0; f < F; f++) {
      const float *row = inp + (size_t)n * 2 * F, dy = dout[(size_t)n * F + f], g = loom_glu_gate(row[f], glu);
      float *drow = dinp + (size_t)n * 2 * F;
      drow[f] += dy * loom_glu_up(row[F + f], glu) * loom_glu_act_grad(g, glu) * loom_glu_gate_passes(row[f], glu);
      drow[F + f] += dy * loom_glu_act(g, glu) * loom_glu_up_passes(row[F + f], glu);
    }
}

/* Turns each pair (dims i, i + D/2) of the first `heads` heads by +angle (forward) or -angle (backward). */
static void ref_rope(float *x, int T, int B, int stride, int heads, int D, int pos_offset, loom_rope rope, double sign) {
  const int half = D / 2;
  for (int t = 0; t < T; t++)
    for (int i = 0; i < half; i++) {
      float c, s;
      loom_rope_turn(pos_offset + t, i, D, rope, sign, &c, &s);
      for (int b = 0; b < B; b++)
        for (int h = 0; h < heads; h++) {
          float *head = x + ((size_t)t * B + b) * stride + (size_t)h * D;
          const float x1 = head[i], x2 = head[i + half];
          head[i] = x1 * c - x2 * s;
          head[i + half] = x2 * c + x1 * s;
        }
    }
}

static void ref_rope_forward(const loom_ops *be, float *x, int T, int B, int stride, int heads, int D, int pos_offset,
                             loom_rope rope) {
  ref_rope(x, T, B, stride, heads, D, pos_offset, rope, 1.0);
}

static void ref_rope_backward(const loom_ops *be, float *dx, int T, int B, int stride, int heads, int D, int pos_offset,
                              loom_rope rope) {
  ref_rope(dx, T, B, stride, heads, D, pos_offset, rope, -1.0);
}

static void ref_gelu_forward(const loom_ops *be, float *out, const float *inp, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = loom_gelu_value(inp[i]);
}

static void ref_gelu_backward(const loom_ops *be, float *dinp, const float *dout, const float *inp, size_t n) {
  for (size_t i = 0; i < n; i++) dinp[i] += loom_gelu_grad(inp[i]) * dout[i];
}

/* Offsets of query head h's q, and its key/value head's k and v (part 0, 1, 2), for token (t, b). */
static size_t qkv_at(const loom_attn_shape *s, int t, int b, int part, int h) {
  const size_t D = (size_t)s->head_dim, K = (size_t)s->kv_heads, g = (size_t)loom_attn_kv_head(s, h);
  const size_t row = ((size_t)t * s->B + b) * loom_attn_qkv_width(s);
  if (part == 0) return row + (size_t)h * D;
  if (part == 1) return row + ((size_t)s->heads + g) * D;
  return row + ((size_t)s->heads + K) * D + g * (size_t)loom_attn_v_dim(s);
}
static size_t out_at(const loom_attn_shape *s, int t, int b, int h) {
  return ((size_t)t * s->B + b) * loom_attn_out_width(s) + (size_t)h * loom_attn_v_dim(s);
}
static size_t lse_at(const loom_attn_shape *s, int b, int h, int tq) { return ((size_t)b * s->heads + h) * s->T + tq; }
/* The scaled score of query row tq against key tk, in double. */
static double score(const float *qkv, const loom_attn_shape *s, int b, int h, int tq, int tk) {
  const float *q = qkv + qkv_at(s, tq, b, 0, h), *k = qkv + qkv_at(s, tk, b, 1, h);
  double dot = 0.0;
  for (int d = 0; d < s->head_dim; d++) dot += (double)q[d] * k[d];
  return dot * loom_attn_scale(s);
}
/* Probability after dropout (what multiplies v). */
static float dropped(const loom_dropout *d, const loom_attn_shape *s, float p, int b, int h,
                     int tq, int tk) {
  if (!d || d->p <= 0.0f) return p;
  return loom_dropout_keep(d, loom_attn_dropout_index(d, s, b, h, tq, tk)) ? p / (1.0f - d->p) : 0.0f;
}

/* The first key query row tq sees (loom_attn_sees: 0, or under a window the window's first). */
static int first_key(const loom_attn_shape *s, int tq) {
  int k = 0;
  while (!loom_attn_sees(s->window, tq, k)) k++;
  return k;
}

static void ref_attention_forward(const loom_ops *be, float *out, float *lse, const float *qkv,
                                  const loom_attn_shape *s, const loom_dropout *drop) {
  loom_attn_shape_check(s);
  const int T = s->T, D = loom_attn_v_dim(s);
  double *p = loom_xmalloc((size_t)T * sizeof(double), "attention row");
  for (int b = 0; b < s->B; b++)
    for (int h = 0; h < s->heads; h++)
      for (int tq = 0; tq < T; tq++) {
        double maxv = -INFINITY, sum = 0.0;
        const int first = first_key(s, tq);
        for (int tk = first; tk <= tq; tk++) {
          p[tk] = score(qkv, s, b, h, tq, tk);
          if (p[tk] > maxv) maxv = p[tk];
        }
        for (int tk = first; tk <= tq; tk++) sum += exp(p[tk] - maxv);
        for (int tk = first; tk <= tq; tk++) p[tk] = exp(p[tk] - maxv) / sum;
        lse[lse_at(s, b, h, tq)] = (float)(maxv + log(sum));
        float *o = out + out_at(s, tq, b, h);
        for (int d = 0; d < D; d++) {
          double acc = 0.0;
          for (int tk = first; tk <= tq; tk++)
            acc += (double)dropped(drop, s, (float)p[tk], b, h, tq, tk) * qkv[qkv_at(s, tk, b, 2, h) + d];
          o[d] = (float)acc;
        }
      }
  free(p);
}

/* ---- context-parallel attention's blocks ---- */

/* Offsets of query head h's q among q's rows, and of its key/value head's k or v (part 0, 1) among kv's. */
static size_t block_q_at(const loom_attn_shape *s, int t, int b, int h) {
  return ((size_t)t * s->B + b) * loom_attn_qkv_width(s) + (size_t)h * s->head_dim;
}
static size_t block_kv_at(const loom_attn_shape *s, int t, int b, int part, int h) {
  const size_t D = (size_t)s->head_dim, K = (size_t)s->kv_heads, g = (size_t)loom_attn_kv_head(s, h);
  return ((size_t)t * s->B + b) * loom_attn_kv_width(s) + (part == 0 ? g * D : K * D + g * (size_t)loom_attn_v_dim(s));
}
static double block_score(const float *q, const float *kv, const loom_attn_shape *s, int b, int h, int tq, int tk) {
  const float *x = q + block_q_at(s, tq, b, h), *k = kv + block_kv_at(s, tk, b, 0, h);
  double dot = 0.0;
  for (int d = 0; d < s->head_dim; d++) dot += (double)x[d] * k[d];
  return dot * loom_attn_scale(s);
}

/* Each row's softmax over the keys it sees in the block, its output, and
 * the merge with what earlier blocks left by the two log-sum-exps. */
static void ref_attention_block_forward(const loom_ops *be, float *out, float *lse, const float *q, const float *kv, int Tq,
                                        int Tk, const int *q_pos, const int *k_pos, const loom_attn_shape *s,
                                        const loom_dropout *drop, bool first) {
  loom_attn_shape_check(s);
  const int D = loom_attn_v_dim(s);
  double *p = loom_xmalloc(((size_t)Tk + (size_t)D + 1) * sizeof(double), "attention row"), *acc = p + Tk;
  for (int b = 0; b < s->B; b++)
    for (int h = 0; h < s->heads; h++)
      for (int tq = 0; tq < Tq; tq++) {
        float *o = out + out_at(s, tq, b, h), *l = lse + ((size_t)b * s->heads + h) * Tq + tq;
        double maxv = -INFINITY, sum = 0.0;
        for (int tk = 0; tk < Tk; tk++)
          if (loom_attn_sees(s->window, q_pos[tq], k_pos[tk])) {
            p[tk] = block_score(q, kv, s, b, h, tq, tk);
            if (p[tk] > maxv) maxv = p[tk];
          }
        if (maxv == -INFINITY) { /* no key of this block is before the query */
          if (first) memset(o, 0, (size_t)D * sizeof *o), *l = -INFINITY;
          continue;
        }
        for (int tk = 0; tk < Tk; tk++)
          if (loom_attn_sees(s->window, q_pos[tq], k_pos[tk])) sum += exp(p[tk] - maxv);
        const double block_lse = maxv + log(sum);
        for (int d = 0; d < D; d++) acc[d] = 0.0;
        for (int tk = 0; tk < Tk; tk++) {
          if (!loom_attn_sees(s->window, q_pos[tq], k_pos[tk])) continue;
          const double w = dropped(drop, s, (float)exp(p[tk] - block_lse), b, h, q_pos[tq], k_pos[tk]);
          const float *v = kv + block_kv_at(s, tk, b, 1, h);
          for (int d = 0; d < D; d++) acc[d] += w * v[d];
        }
        const double old = first ? -INFINITY : *l, merged = old > block_lse ? old + log1p(exp(block_lse - old))
                                                                            : block_lse + log1p(exp(old - block_lse));
        const double keep = old == -INFINITY ? 0.0 : exp(old - merged), add = exp(block_lse - merged);
        for (int d = 0; d < D; d++) o[d] = (float)(old == -INFINITY ? add * acc[d] : keep * o[d] + add * acc[d]); /* o unread first */
        *l = (float)merged;
      }
  free(p);
}

/* The block's grads from first principles but for the row's sum_k p dp,
 * which spans the blocks: dout . out. */
static void ref_attention_block_backward(const loom_ops *be, float *dq, float *dkv, const float *dout, const float *out,
                                         const float *q, const float *kv, int Tq, int Tk, const int *q_pos,
                                         const int *k_pos, const float *lse, const loom_attn_shape *s,
                                         const loom_dropout *drop) {
  loom_attn_shape_check(s);
  const int D = s->head_dim, Dv = loom_attn_v_dim(s);
  const float scale = loom_attn_scale(s);
  for (int b = 0; b < s->B; b++)
    for (int h = 0; h < s->heads; h++)
      for (int tq = 0; tq < Tq; tq++) {
        const double l = lse[((size_t)b * s->heads + h) * Tq + tq];
        if (l == -INFINITY) continue;
        const float *dy = dout + out_at(s, tq, b, h), *o = out + out_at(s, tq, b, h), *x = q + block_q_at(s, tq, b, h);
        double dot = 0.0;
        for (int d = 0; d < Dv; d++) dot += (double)dy[d] * o[d];
        float *dx = dq + block_q_at(s, tq, b, h);
        for (int tk = 0; tk < Tk; tk++) {
          if (!loom_attn_sees(s->window, q_pos[tq], k_pos[tk])) continue;
          const double p = exp(block_score(q, kv, s, b, h, tq, tk) - l);
          const float keep = dropped(drop, s, 1.0f, b, h, q_pos[tq], k_pos[tk]);
          const float *k = kv + block_kv_at(s, tk, b, 0, h), *v = kv + block_kv_at(s, tk, b, 1, h);
          float *dk = dkv + block_kv_at(s, tk, b, 0, h), *dv = dkv + block_kv_at(s, tk, b, 1, h);
          double g = 0.0;
          for (int d = 0; d < Dv; d++) {
            g += (double)dy[d] * v[d];
            dv[d] += (float)p * keep * dy[d];
          }
          const float ds = (float)(p * (g * keep - dot)) * scale;
          for (int d = 0; d < D; d++) {
            dx[d] += ds * k[d];
            dk[d] += ds * x[d];
          }
        }
      }
}

/* From first principles, as the oracle should be: each row's probabilities
 * rebuilt from the saved log-sum-exp, and the softmax's sum_k p dp summed
 * over the row (the fast backends take it as dout . out instead). */
static void ref_attention_backward(const loom_ops *be, float *dqkv, const float *dout, const float *out, const float *qkv,
                                   const float *lse, const loom_attn_shape *s, const loom_dropout *drop) {
  loom_attn_shape_check(s);
  (void)out;
  const int T = s->T, D = s->head_dim, Dv = loom_attn_v_dim(s);
  const float scale = loom_attn_scale(s);
  double *p = loom_xmalloc(2 * (size_t)T * sizeof(double), "attention row"), *dp = p + T;
  for (int b = 0; b < s->B; b++)
    for (int h = 0; h < s->heads; h++)
      for (int tq = 0; tq < T; tq++) {
        const float *dy = dout + out_at(s, tq, b, h);
        double dot_pdp = 0.0;
        const int first = first_key(s, tq);
        for (int tk = first; tk <= tq; tk++) {
          p[tk] = exp(score(qkv, s, b, h, tq, tk) - lse[lse_at(s, b, h, tq)]);
          const float *v = qkv + qkv_at(s, tk, b, 2, h);
          float *dv = dqkv + qkv_at(s, tk, b, 2, h);
          const float keep = dropped(drop, s, 1.0f, b, h, tq, tk);
          double g = 0.0;
          for (int d = 0; d < Dv; d++) {
            g += (double)dy[d] * v[d];
            dv[d] += (float)p[tk] * keep * dy[d];
          }
          dp[tk] = g * keep;
          dot_pdp += p[tk] * dp[tk];
        }
        const float *q = qkv + qkv_at(s, tq, b, 0, h);
        float *dq = dqkv + qkv_at(s, tq, b, 0, h);
        for (int tk = first; tk <= tq; tk++) {
          const float ds = (float)(p[tk] * (dp[tk] - dot_pdp)) * scale;
          const float *k = qkv + qkv_at(s, tk, b, 1, h);
          float *dk = dqkv + qkv_at(s, tk, b, 1, h);
          for (int d = 0; d < D; d++) {
            dq[d] += ds * k[d];
            dk[d] += ds * q[d];
          }
        }
      }
  free(p);
}

static int owned(int token, int vocab_start, int rows) { return token >= vocab_start && token < vocab_start + rows; }

static void ref_embedding_forward(const loom_ops *be, float *out, const int *tokens, const float *wte, int vocab_start, int rows,
                                  int T, int B, int C) {
  for (int i = 0; i < T * B; i++)
    for (int c = 0; c < C; c++)
      out[(size_t)i * C + c] = owned(tokens[i], vocab_start, rows) ? wte[(size_t)(tokens[i] - vocab_start) * C + c] : 0.0f;
}

static void ref_embedding_forward_bf16(const loom_ops *be, float *out, const int *tokens, const uint16_t *wte,
                                       int vocab_start, int rows, int T, int B, int C) {
  for (int i = 0; i < T * B; i++)
    for (int c = 0; c < C; c++)
      out[(size_t)i * C + c] =
          owned(tokens[i], vocab_start, rows) ? loom_bf16_value(wte[(size_t)(tokens[i] - vocab_start) * C + c]) : 0.0f;
}

static void ref_embedding_backward(const loom_ops *be, float *dwte, const float *dout, const int *tokens, int vocab_start, int rows,
                                   int T, int B, int C) {
  for (int i = 0; i < T * B; i++)
    if (owned(tokens[i], vocab_start, rows))
      for (int c = 0; c < C; c++) dwte[(size_t)(tokens[i] - vocab_start) * C + c] += dout[(size_t)i * C + c];
}

static void ref_position_forward(const loom_ops *be, float *out, const float *wpe, int T, int B, int C, int pos_offset) {
  for (int t = 0; t < T; t++)
    for (int b = 0; b < B; b++)
      for (int c = 0; c < C; c++) out[((size_t)t * B + b) * C + c] += wpe[(size_t)(pos_offset + t) * C + c];
}

static void ref_position_backward(const loom_ops *be, float *dwpe, const float *dout, int T, int B, int C, int pos_offset) {
  for (int t = 0; t < T; t++)
    for (int b = 0; b < B; b++)
      for (int c = 0; c < C; c++) dwpe[(size_t)(pos_offset + t) * C + c] += dout[((size_t)t * B + b) * C + c];
}

static void ref_bias_forward(const loom_ops *be, float *out, const float *bias, int N, int OC) {
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) out[(size_t)n * OC + o] += bias[o];
}

static void ref_bias_backward(const loom_ops *be, float *dbias, const float *dout, int N, int OC) {
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) dbias[o] += dout[(size_t)n * OC + o];
}

static void ref_logsumexp(const loom_ops *be, float *lse, const float *logits, int N, int V, int width) {
  for (int n = 0; n < N; n++) {
    const float *z = logits + (size_t)n * width;
    double maxv = -INFINITY, sum = 0.0;
    for (int v = 0; v < V; v++) if (z[v] > maxv) maxv = z[v];
    for (int v = 0; v < V; v++) sum += exp(z[v] - maxv);
    lse[n] = V > 0 ? (float)(maxv + log(sum)) : -INFINITY;
  }
}

static void ref_pick_targets(const loom_ops *be, float *picked, const float *logits, const int *targets, int vocab_start,
                             int N, int V, int width) {
  for (int n = 0; n < N; n++) {
    const int col = targets[n] - vocab_start;
    picked[n] = targets[n] >= 0 && col >= 0 && col < V ? logits[(size_t)n * width + col] : 0.0f;
  }
}

/* The reference's own loops, in double, apart from the host helpers the CPU backend uses (ops_common.c), so
 * op_parity compares two computations, not one with itself. */
static void ref_crossentropy_losses(const loom_ops *be, float *losses, const float *lse, const float *picked,
                                    const int *targets, int N) {
  (void)be;
  for (int i = 0; i < N; i++) losses[i] = targets[i] < 0 ? 0.0f : (float)((double)lse[i] - (double)picked[i]);
}

static void ref_exp_shifted(const loom_ops *be, float *x, const float *shift, size_t n) {
  (void)be;
  for (size_t i = 0; i < n; i++) x[i] = (float)exp((double)x[i] - (double)shift[i]);
}

static void ref_log_shifted(const loom_ops *be, float *x, const float *shift, size_t n) {
  (void)be;
  for (size_t i = 0; i < n; i++) x[i] = (float)((double)shift[i] + log((double)x[i]));
}

static void ref_sumsq_batch(const loom_ops *be, const float *const *x, const size_t *n, int count, double *out) {
  (void)be;
  for (int i = 0; i < count; i++) {
    double s = 0.0;
    for (size_t j = 0; j < n[i]; j++) s += (double)x[i][j] * (double)x[i][j];
    out[i] = s;
  }
}

static void ref_crossentropy_backward(const loom_ops *be, float *dlogits, const float *logits, const float *lse, const int *targets,
                                      int vocab_start, float dloss, int N, int V, int width) {
  for (int n = 0; n < N; n++) {
    const float *z = logits + (size_t)n * width;
    float *dz = dlogits + (size_t)n * width;
    for (int v = 0; v < width; v++) {
      const double prob = exp((double)z[v] - lse[n]);
      const double onehot = vocab_start + v == targets[n] ? 1.0 : 0.0;
      dz[v] = (targets[n] < 0 || v >= V) ? 0.0f : (float)(dloss * (prob - onehot));
    }
  }
}

static void ref_argmax(const loom_ops *be, float *val, int *idx, const float *logits, int N, int V, int width) {
  for (int n = 0; n < N; n++) {
    const float *z = logits + (size_t)n * width;
    idx[n] = loom_row_argmax(z, V);
    val[n] = idx[n] >= 0 ? z[idx[n]] : -INFINITY;
  }
}

static void ref_add(const loom_ops *be, float *out, const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}
static void ref_accumulate(const loom_ops *be, float *acc, const float *x, size_t n) {
  for (size_t i = 0; i < n; i++) acc[i] += x[i];
}
static double ref_sumsq(const loom_ops *be, const float *x, size_t n) {
  double acc = 0.0;
  for (size_t i = 0; i < n; i++) acc += (double)x[i] * x[i];
  return acc;
}

static void ref_gemm(const loom_ops *be, bool ta, bool tb, int M, int N, int K, float alpha, const float *a,
                     const float *b, float beta, float *c) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double acc = 0.0;
      for (int k = 0; k < K; k++)
        acc += (double)(ta ? a[(size_t)k * M + i] : a[(size_t)i * K + k]) * (tb ? b[(size_t)j * K + k] : b[(size_t)k * N + j]);
      float *out = &c[(size_t)i * N + j];
      *out = (float)(alpha * acc + (beta == 0.0f ? 0.0 : (double)beta * *out));
    }
}

static void ref_sign_pack(const loom_ops *be, uint32_t *msg, const float *x, size_t n) {
  double total = 0.0;
  for (size_t i = 0; i < n; i++) total += fabs((double)x[i]);
  const float mean = n ? (float)(total / (double)n) : 0.0f;
  memcpy(&msg[0], &mean, sizeof mean);
  for (size_t w = 0; w < (n + 31) / 32; w++) msg[1 + w] = 0;
  for (size_t i = 0; i < n; i++)
    if (x[i] >= 0.0f) msg[1 + i / 32] |= 1u << (i % 32);
}

static void ref_rows_gather(const loom_ops *be, float *out, const float *x, const int *rows, int M, int C) {
  for (int i = 0; i < M; i++)
    for (int c = 0; c < C; c++) out[(size_t)i * C + c] = x[(size_t)rows[i] * C + c];
}

static void ref_rows_combine(const loom_ops *be, float *y, const float *x, const int *slots, const float *w, int N, int k,
                             int C) {
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) {
      float acc = 0.0f;
      for (int j = 0; j < k; j++) {
        const int s = slots[(size_t)n * k + j];
        if (s >= 0) acc += (w ? w[(size_t)n * k + j] : 1.0f) * x[(size_t)s * C + c];
      }
      y[(size_t)n * C + c] = acc;
    }
}

static void ref_rows_combine_backward(const loom_ops *be, float *dx, float *dw, const float *dy, const float *x,
                                      const int *slots, const float *w, int N, int k, int C) {
  for (int n = 0; n < N; n++)
    for (int j = 0; j < k; j++) {
      const int s = slots[(size_t)n * k + j];
      float dot = 0.0f;
      for (int c = 0; s >= 0 && c < C; c++) {
        dx[(size_t)s * C + c] = w[(size_t)n * k + j] * dy[(size_t)n * C + c];
        dot += dy[(size_t)n * C + c] * x[(size_t)s * C + c];
      }
      if (dw) dw[(size_t)n * k + j] = dot;
    }
}

static void ref_sign_unpack_add(const loom_ops *be, float *y, const uint32_t *msg, size_t n, float weight) {
  float mean;
  memcpy(&mean, &msg[0], sizeof mean);
  for (size_t i = 0; i < n; i++) {
    const bool positive = (msg[1 + i / 32] >> (i % 32)) & 1u;
    y[i] += positive ? weight * mean : -(weight * mean);
  }
}

static void ref_dropout_apply(const loom_ops *be, float *x, int T, int B, int C, const loom_dropout *d) {
  if (!d || d->p <= 0.0f) return;
  for (int t = 0; t < T; t++)
    for (int b = 0; b < B; b++)
      for (int c = 0; c < C; c++) {
        const int keep = loom_dropout_keep(d, loom_dropout_index(d, t, b, c, T, C));
        float *e = x + ((size_t)t * B + b) * C + c;
        *e = keep ? *e / (1.0f - d->p) : 0.0f;
      }
}

static void ref_to_bf16(const loom_ops *be, uint16_t *out, const float *in, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = loom_bf16_round(in[i]);
}

static void ref_from_bf16(const loom_ops *be, float *out, const uint16_t *in, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = loom_bf16_value(in[i]);
}

static void ref_round_bf16(const loom_ops *be, float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = loom_bf16_value(loom_bf16_round(x[i]));
}

/* x widened to fp32 in a new array: bf16 bits exactly, fp32 values rounded to
 * bf16 first (a no-op for the bf16 values the contract passes); NULL for an
 * operand the call does not read. */
static float *ref_bf16_values(loom_bf16_operand x, size_t n) {
  if (!loom_bf16_operand_set(x)) return NULL;
  float *out = loom_xmalloc((n ? n : 1) * sizeof(float), "bf16 operand");
  for (size_t i = 0; i < n; i++) out[i] = x.bf16 ? loom_bf16_value(x.bf16[i]) : loom_bf16_value(loom_bf16_round(x.f32[i]));
  return out;
}

/* The fp32 linears on the bf16 values. */
static void ref_matmul_forward_bf16(const loom_ops *be, float *out, loom_bf16_operand inp, const uint16_t *weight,
                                    const float *bias, int N, int C, int OC) {
  float *x = ref_bf16_values(inp, (size_t)N * C), *w = ref_bf16_values(loom_bf16_bits(weight), (size_t)OC * C);
  ref_matmul_forward(be, out, x, w, bias, N, C, OC);
  free(x);
  free(w);
}

static void ref_matmul_backward_bf16(const loom_ops *be, float *dinp, float *dweight, float *dbias, loom_bf16_operand dout,
                                     loom_bf16_operand inp, const uint16_t *weight, int N, int C, int OC) {
  const loom_bf16_operand none = {0};
  float *dy = ref_bf16_values(dout, (size_t)N * OC), *x = ref_bf16_values(dweight ? inp : none, (size_t)N * C);
  float *w = ref_bf16_values(dinp ? loom_bf16_bits(weight) : none, (size_t)OC * C);
  ref_matmul_backward(be, dinp, dweight, dbias, dy, x, w, N, C, OC);
  free(dy);
  free(x);
  free(w);
}

static void ref_adamw(const loom_ops *be, float *param, const float *grad, float *m, float *v, uint16_t *compute,
                      size_t n, const loom_adamw_args *a) {
  const double c1 = 1.0 - pow(a->beta1, a->step), c2 = 1.0 - pow(a->beta2, a->step);
  for (size_t i = 0; i < n; i++) {
    const float g = grad[i] * a->grad_scale;
    m[i] = a->beta1 * m[i] + (1.0f - a->beta1) * g;
    v[i] = a->beta2 * v[i] + (1.0f - a->beta2) * g * g;
    const double mhat = m[i] / c1, vhat = v[i] / c2;
    param[i] -= (float)(a->lr * (mhat / (sqrt(vhat) + a->eps) + a->weight_decay * param[i]));
    if (compute) compute[i] = loom_bf16_round(param[i]);
  }
}

static const loom_ops REF_OPS = {
    .name = "ref",
    .mem = &loom_host_memory,
    .matmul_forward = ref_matmul_forward,
    .matmul_backward = ref_matmul_backward,
    .layernorm_forward = ref_layernorm_forward,
    .layernorm_backward = ref_layernorm_backward,
    .rmsnorm_forward = ref_rmsnorm_forward,
    .rmsnorm_backward = ref_rmsnorm_backward,
    .swiglu_forward = ref_swiglu_forward,
    .swiglu_backward = ref_swiglu_backward,
    .rope_forward = ref_rope_forward,
    .rope_backward = ref_rope_backward,
    .gelu_forward = ref_gelu_forward,
    .gelu_backward = ref_gelu_backward,
    .attention_forward = ref_attention_forward,
    .attention_backward = ref_attention_backward,
    .attention_block_forward = ref_attention_block_forward,
    .attention_block_backward = ref_attention_block_backward,
    .embedding_forward = ref_embedding_forward,
    .embedding_forward_bf16 = ref_embedding_forward_bf16,
    .embedding_backward = ref_embedding_backward,
    .position_forward = ref_position_forward,
    .position_backward = ref_position_backward,
    .bias_forward = ref_bias_forward,
    .bias_backward = ref_bias_backward,
    .logsumexp = ref_logsumexp,
    .pick_targets = ref_pick_targets,
    .crossentropy_backward = ref_crossentropy_backward,
    .crossentropy_losses = ref_crossentropy_losses,
    .exp_shifted = ref_exp_shifted,
    .log_shifted = ref_log_shifted,
    .argmax = ref_argmax,
    .add = ref_add,
    .accumulate = ref_accumulate,
    .sumsq = ref_sumsq,
    .sumsq_batch = ref_sumsq_batch,
    .gemm = ref_gemm,
    .orthonormalize = loom_host_orthonormalize,
    .attention_sink_forward = loom_host_attention_sink_forward,
    .attention_sink_backward = loom_host_attention_sink_backward,
    .sign_pack = ref_sign_pack,
    .sign_unpack_add = ref_sign_unpack_add,
    .grouped_matmul_forward = loom_grouped_matmul_by_expert,
    .grouped_matmul_backward = loom_grouped_matmul_backward_by_expert,
    .rows_gather = ref_rows_gather,
    .rows_combine = ref_rows_combine,
    .rows_combine_backward = ref_rows_combine_backward,
    .dropout_forward = ref_dropout_apply,
    .dropout_backward = ref_dropout_apply,
    .to_bf16 = ref_to_bf16,
    .from_bf16 = ref_from_bf16,
    .round_bf16 = ref_round_bf16,
    .matmul_forward_bf16 = ref_matmul_forward_bf16,
    .matmul_backward_bf16 = ref_matmul_backward_bf16,
    .fp8_amax = loom_host_fp8_amax,
    .fp8_quantize = loom_host_fp8_quantize,
    .fp8_gemm = loom_host_fp8_gemm,
    .adamw = ref_adamw,
};

const loom_ops *loom_ops_ref(void) { return &REF_OPS; }
