/* The CPU backend: every matmul through its GEMM library (cpu_gemm.h: oneDNN
 * or OpenBLAS), everything else as
 * OpenMP-parallel loops that the compiler vectorises. Semantics match the
 * reference backend (ref/ref_ops.c) op for op; tests/test_ops.c holds them to
 * it. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu_bf16_gemm.h"
#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_math.h"
#include "backend/op_math.h"
#include "backend/ops.h"
#include "core/check.h"

/* Below this many elements a parallel region costs more than it saves. */
#define PAR_MIN 16384

static void cpu_bias_forward(const loom_ops *be, float *out, const float *bias, int N, int OC) {
#pragma omp parallel for schedule(static) if ((size_t)N * OC > PAR_MIN)
  for (int n = 0; n < N; n++) {
    float *row = out + (size_t)n * OC;
#pragma omp simd
    for (int o = 0; o < OC; o++) row[o] += bias[o];
  }
}

/* Column sums, blocked over output features so each thread owns its slice. */
/* dbias[o] += the sum of column o of dout[N, OC], held as fp32 or as bf16
 * bits (one of the two), in 64-column strips. */
static void column_sums(float *dbias, const float *dout, const uint16_t *bits, int N, int OC) {
#pragma omp parallel for schedule(static) if ((size_t)N * OC > PAR_MIN)
  for (int o0 = 0; o0 < OC; o0 += 64) {
    const int o1 = o0 + 64 < OC ? o0 + 64 : OC;
    float acc[64] = {0};
    for (int n = 0; n < N; n++) {
      const size_t row = (size_t)n * OC;
      if (bits)
        for (int o = o0; o < o1; o++) acc[o - o0] += loom_bf16_value(bits[row + o]);
      else
        for (int o = o0; o < o1; o++) acc[o - o0] += dout[row + o];
    }
    for (int o = o0; o < o1; o++) dbias[o] += acc[o - o0];
  }
}

static void cpu_bias_backward(const loom_ops *be, float *dbias, const float *dout, int N, int OC) {
  column_sums(dbias, dout, NULL, N, OC);
}

static void cpu_matmul_forward(const loom_ops *be, float *out, const float *inp, const float *weight,
                               const float *bias, int N, int C, int OC) {
  loom_gemm_shape g[LOOM_LINEAR_GEMMS];
  loom_cpu_linear_gemms(N, C, OC, g);
  loom_cpu_gemm_run(loom_cpu_gemm_library(), &g[LOOM_LINEAR_FORWARD], inp, weight, out);
  if (bias) cpu_bias_forward(be, out, bias, N, OC);
}

static void cpu_matmul_backward(const loom_ops *be, float *dinp, float *dweight, float *dbias, const float *dout,
                                const float *inp, const float *weight, int N, int C, int OC) {
  loom_gemm_shape g[LOOM_LINEAR_GEMMS];
  loom_cpu_linear_gemms(N, C, OC, g);
  if (dinp) loom_cpu_gemm_run(loom_cpu_gemm_library(), &g[LOOM_LINEAR_INPUT_GRAD], dout, weight, dinp);
  if (dweight) loom_cpu_gemm_run(loom_cpu_gemm_library(), &g[LOOM_LINEAR_WEIGHT_GRAD], dout, inp, dweight);
  if (dbias) cpu_bias_backward(be, dbias, dout, N, OC);
}

static void cpu_layernorm_forward(const loom_ops *be, float *out, float *mean, float *rstd, const float *inp,
                                  const float *weight, const float *bias, int N, int C, float eps) {
#pragma omp parallel for schedule(static) if ((size_t)N * C > PAR_MIN)
  for (int n = 0; n < N; n++) {
    const float *x = inp + (size_t)n * C;
    float *y = out + (size_t)n * C;
    float m = 0.0f, var = 0.0f;
#pragma omp simd reduction(+ : m)
    for (int c = 0; c < C; c++) m += x[c];
    m /= (float)C;
#pragma omp simd reduction(+ : var)
    for (int c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
    var /= (float)C;
    const float s = 1.0f / sqrtf(var + eps);
#pragma omp simd
    for (int c = 0; c < C; c++) y[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

static void cpu_layernorm_backward(const loom_ops *be, float *dinp, float *dweight, float *dbias, const float *dout,
                                   const float *inp, const float *weight, const float *mean,
                                   const float *rstd, int N, int C) {
  const int nthreads = omp_get_max_threads();
  /* Per-thread partial sums of dweight and dbias, reduced at the end. */
  float *partial = loom_xcalloc((size_t)nthreads * 2 * C, sizeof(float), "layernorm grads");
#pragma omp parallel if ((size_t)N * C > PAR_MIN)
  {
    float *pw = partial + (size_t)omp_get_thread_num() * 2 * C, *pb = pw + C;
#pragma omp for schedule(static)
    for (int n = 0; n < N; n++) {
      const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
      float *dx = dinp + (size_t)n * C;
      const float mu = mean[n], rs = rstd[n];
      float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
      for (int c = 0; c < C; c++) {
        const float dnorm = weight[c] * dy[c];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * (x[c] - mu) * rs;
      }
      dnorm_mean /= (float)C;
      dnorm_norm_mean /= (float)C;
#pragma omp simd
      for (int c = 0; c < C; c++) {
        const float norm = (x[c] - mu) * rs;
        pb[c] += dy[c];
        pw[c] += norm * dy[c];
        dx[c] += (weight[c] * dy[c] - dnorm_mean - norm * dnorm_norm_mean) * rs;
      }
    }
  }
  for (int t = 0; t < nthreads; t++) {
    const float *pw = partial + (size_t)t * 2 * C, *pb = pw + C;
    for (int c = 0; c < C; c++) {
      dweight[c] += pw[c];
      dbias[c] += pb[c];
    }
  }
  free(partial);
}

static void cpu_rmsnorm_forward(const loom_ops *be, float *out, float *rstd, const float *inp, const float *weight, int N,
                                int C, float eps) {
#pragma omp parallel for schedule(static) if ((size_t)N * C > PAR_MIN)
  for (int n = 0; n < N; n++) {
    const float *x = inp + (size_t)n * C;
    float *y = out + (size_t)n * C;
    float ms = 0.0f;
#pragma omp simd reduction(+ : ms)
    for (int c = 0; c < C; c++) ms += x[c] * x[c];
    const float s = 1.0f / sqrtf(ms / (float)C + eps);
#pragma omp simd
    for (int c = 0; c < C; c++) y[c] = x[c] * s * weight[c];
    rstd[n] = s;
  }
}

static void cpu_rmsnorm_backward(const loom_ops *be, float *dinp, float *dweight, const float *dout, const float *inp,
                                 const float *weight, const float *rstd, int N, int C) {
  const int nthreads = omp_get_max_threads();
  float *partial = loom_xcalloc((size_t)nthreads * C, sizeof(float), "rmsnorm grads"); /* per-thread dweight */
#pragma omp parallel if ((size_t)N * C > PAR_MIN)
  {
    float *pw = partial + (size_t)omp_get_thread_num() * C;
#pragma omp for schedule(static)
    for (int n = 0; n < N; n++) {
      const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
      float *dx = dinp + (size_t)n * C;
      const float r = rstd[n];
      float d = 0.0f;
#pragma omp simd reduction(+ : d)
      for (int c = 0; c < C; c++) d += weight[c] * dy[c] * x[c];
      const float k = r * r * r * d / (float)C;
#pragma omp simd
      for (int c = 0; c < C; c++) {
        pw[c] += x[c] * r * dy[c];
        dx[c] += r * weight[c] * dy[c] - x[c] * k;
      }
    }
  }
  for (int t = 0; t < nthreads; t++)
    for (int c = 0; c < C; c++) dweight[c] += partial[(size_t)t * C + c];
  free(partial);
}

static void cpu_swiglu_forward(const loom_ops *be, float *out, const float *inp, int N, int F) {
#pragma omp parallel for schedule(static) if ((size_t)N * F > PAR_MIN)
  for (int n = 0; n < N; n++) {
    const float *gate = inp + (size_t)n * 2 * F, *up = gate + F;
    float *y = out + (size_t)n * F;
#pragma omp simd
    for (int f = 0; f < F; f++) y[f] = loom_silu_at(gate[f]) * up[f];
  }
}

static void cpu_swiglu_backward(const loom_ops *be, float *dinp, const float *dout, const float *inp, int N, int F) {
#pragma omp parallel for schedule(static) if ((size_t)N * F > PAR_MIN)
  for (int n = 0; n < N; n++) {
    const float *gate = inp + (size_t)n * 2 * F, *up = gate + F, *dy = dout + (size_t)n * F;
    float *dgate = dinp + (size_t)n * 2 * F, *dup = dgate + F;
#pragma omp simd
    for (int f = 0; f < F; f++) {
      dgate[f] += dy[f] * up[f] * loom_silu_grad_at(gate[f]);
      dup[f] += dy[f] * loom_silu_at(gate[f]);
    }
  }
}

/* RoPE with one table of each position's cos and sin, shared by the batch and the heads. */
static void cpu_rope(float *x, int T, int B, int stride, int heads, int D, int pos_offset, loom_rope rope, double sign) {
  const int half = D / 2;
  float *cs = loom_xmalloc((size_t)T * half * 2 * sizeof(float), "RoPE table");
  for (int t = 0; t < T; t++)
    for (int i = 0; i < half; i++) {
      const double a = sign * loom_rope_angle(pos_offset + t, i, D, rope);
      cs[((size_t)t * half + i) * 2] = (float)cos(a);
      cs[((size_t)t * half + i) * 2 + 1] = (float)sin(a);
    }
#pragma omp parallel for schedule(static) if ((size_t)T * B * heads * D > PAR_MIN)
  for (int row = 0; row < T * B; row++) {
    const float *tc = cs + (size_t)(row / B) * half * 2;
    for (int h = 0; h < heads; h++) {
      float *x1 = x + (size_t)row * stride + (size_t)h * D, *x2 = x1 + half;
#pragma omp simd
      for (int i = 0; i < half; i++) {
        const float c = tc[2 * i], s = tc[2 * i + 1], a = x1[i], b = x2[i];
        x1[i] = a * c - b * s;
        x2[i] = b * c + a * s;
      }
    }
  }
  free(cs);
}

static void cpu_rope_forward(const loom_ops *be, float *x, int T, int B, int stride, int heads, int D, int pos_offset,
                             loom_rope rope) {
  cpu_rope(x, T, B, stride, heads, D, pos_offset, rope, 1.0);
}

static void cpu_rope_backward(const loom_ops *be, float *dx, int T, int B, int stride, int heads, int D, int pos_offset,
                              loom_rope rope) {
  cpu_rope(dx, T, B, stride, heads, D, pos_offset, rope, -1.0);
}

static void cpu_gelu_forward(const loom_ops *be, float *out, const float *inp, size_t n) {
#pragma omp parallel for simd schedule(static) if (n > PAR_MIN)
  for (size_t i = 0; i < n; i++) out[i] = loom_fast_gelu(inp[i]);
}

static void cpu_gelu_backward(const loom_ops *be, float *dinp, const float *dout, const float *inp, size_t n) {
#pragma omp parallel for simd schedule(static) if (n > PAR_MIN)
  for (size_t i = 0; i < n; i++) dinp[i] += loom_fast_gelu_grad(inp[i]) * dout[i];
}

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

/* The rows of the attention ops' blocks are vectorised: keys 0..tq of query
 * row tq are computed in branch-free loops (dropout's mask in a loop of its
 * own, only when there is one), and the keys past tq, which the causal mask
 * zeroes, are filled apart. */
static bool dropping(const loom_dropout *d) { return d && d->p > 0.0f; }

/* Row tq of a block: its scores pr[0..n) become the probabilities that
 * multiply v (dropout's mask and scale applied, 0 past tq); returns the
 * row's log-sum-exp. */
static float softmax_row(float *pr, int tq, int n, const loom_dropout *drop, const loom_attn_shape *s, int b, int h) {
  const int m = tq + 1;
  float maxv = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : maxv)
  for (int tk = 0; tk < m; tk++) maxv = pr[tk] > maxv ? pr[tk] : maxv;
#pragma omp simd reduction(+ : sum)
  for (int tk = 0; tk < m; tk++) {
    pr[tk] = loom_fast_expf(pr[tk] - maxv);
    sum += pr[tk];
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int tk = 0; tk < m; tk++) pr[tk] *= inv;
  if (dropping(drop))
    for (int tk = 0; tk < m; tk++) pr[tk] *= keep_scale(drop, s, b, h, tq, tk);
  if (n > m) memset(pr + m, 0, (size_t)(n - m) * sizeof(float));
  return maxv + logf(sum);
}

/* Row tq of a backward block: its scores pr and dp = dout v^T become the
 * probabilities that multiplied v (p rebuilt from the saved log-sum-exp,
 * dropout's mask and scale applied) and dS = p (dp keep - delta) scale, 0
 * past tq. */
static void softmax_grad_row(float *pr, float *dpr, int tq, int n, float lse, float delta, float scale,
                             const loom_dropout *drop, const loom_attn_shape *s, int b, int h) {
  const int m = tq + 1;
  if (!dropping(drop)) {
#pragma omp simd
    for (int tk = 0; tk < m; tk++) {
      const float prob = loom_fast_expf(pr[tk] - lse);
      pr[tk] = prob;
      dpr[tk] = prob * (dpr[tk] - delta) * scale;
    }
  } else {
    for (int tk = 0; tk < m; tk++) {
      const float prob = loom_fast_expf(pr[tk] - lse), keep = keep_scale(drop, s, b, h, tq, tk);
      pr[tk] = prob * keep;                              /* what multiplied v */
      dpr[tk] = prob * (dpr[tk] * keep - delta) * scale; /* dS */
    }
  }
  if (n > m) {
    memset(pr + m, 0, (size_t)(n - m) * sizeof(float));
    memset(dpr + m, 0, (size_t)(n - m) * sizeof(float));
  }
}

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
static void cpu_attention_forward(const loom_ops *be, float *out, float *lse, const float *qkv,
                                  const loom_attn_shape *s, const loom_dropout *drop) {
  loom_attn_shape_check(s);
  const int T = s->T, B = s->B, H = s->heads, D = s->head_dim;
  const size_t width = (size_t)H * D, w3 = loom_attn_qkv_width(s), row3 = w3 * B, row = width * B, block = (size_t)T * D;
  const float scale = 1.0f / sqrtf((float)D);
  const loom_gemm_library lib = loom_cpu_gemm_library();
#pragma omp parallel
  {
    float *k = loom_xmalloc((4 * block + (size_t)ATT_ROWS * T) * sizeof(float), "attention scratch");
    float *v = k + block, *q = v + block, *o = q + block, *p = o + block;
#pragma omp for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; b++)
      for (int h = 0; h < H; h++) {
        const float *base = qkv + (size_t)b * w3;
        const size_t kv = (size_t)loom_attn_kv_head(s, h) * D;
        pack_rows(q, base + (size_t)h * D, row3, T, D);
        pack_rows(k, base + width + kv, row3, T, D);
        pack_rows(v, base + width + (size_t)s->kv_heads * D + kv, row3, T, D);
        for (int i0 = 0; i0 < T; i0 += ATT_ROWS) {
          const int R = T - i0 < ATT_ROWS ? T - i0 : ATT_ROWS, n = i0 + R; /* keys 0..n-1 reach its last row */
          loom_cpu_sgemm_with(lib, false, true, R, n, D, scale, q + (size_t)i0 * D, D, k, D, 0.0f, p, n);
          for (int r = 0; r < R; r++)
            lse[((size_t)b * H + h) * T + i0 + r] = softmax_row(p + (size_t)r * n, i0 + r, n, drop, s, b, h);
          loom_cpu_sgemm_with(lib, false, false, R, D, n, 1.0f, p, n, v, D, 0.0f, o + (size_t)i0 * D, D);
        }
        unpack_rows(out + (size_t)b * width + (size_t)h * D, row, o, T, D);
      }
    free(k);
  }
}

/* Blocked as flash attention's backward, with GEMMs: for each block of
 * query rows, the scores against every key up to the block's last row
 * (S = Q K^T), p rebuilt from the saved log-sum-exps, dP = dout V^T, then
 * dS = p (dP - dout . out) scale (the softmax's sum_k p dp is dout . out,
 * ops.h) and three products: dV += P^T dout, dK += dS^T Q, dQ += dS K. */
static void cpu_attention_backward(const loom_ops *be, float *dqkv, const float *dout, const float *out, const float *qkv,
                                   const float *lse, const loom_attn_shape *s, const loom_dropout *drop) {
  loom_attn_shape_check(s);
  const int T = s->T, B = s->B, H = s->heads, K = s->kv_heads, D = s->head_dim, group = H / K;
  const size_t width = (size_t)H * D, w3 = loom_attn_qkv_width(s), row3 = w3 * B, row = width * B, block = (size_t)T * D;
  const size_t tile = (size_t)ATT_ROWS * T;
  const float scale = 1.0f / sqrtf((float)D);
  const loom_gemm_library lib = loom_cpu_gemm_library();
  /* Each (b, kv head) touches only its own columns of dqkv: its k and v, and the q of the heads it serves. */
#pragma omp parallel
  {
    float *k = loom_xmalloc((7 * block + 2 * tile + (size_t)T) * sizeof(float), "attention scratch");
    float *v = k + block, *dk = v + block, *dv = dk + block, *q = dv + block, *dy = q + block, *dq = dy + block;
    float *p = dq + block, *dp = p + tile, *delta = dp + tile;
#pragma omp for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; b++)
      for (int g = 0; g < K; g++) {
        const size_t kat = (size_t)b * w3 + width + (size_t)g * D, vat = kat + (size_t)K * D;
        pack_rows(k, qkv + kat, row3, T, D);
        pack_rows(v, qkv + vat, row3, T, D);
        pack_rows(dk, dqkv + kat, row3, T, D); /* accumulated into, as in place */
        pack_rows(dv, dqkv + vat, row3, T, D);
        for (int h = g * group; h < (g + 1) * group; h++) {
          const size_t head = (size_t)b * w3 + (size_t)h * D, at = (size_t)b * width + (size_t)h * D;
          const float *l = lse + ((size_t)b * H + h) * T;
          pack_rows(q, qkv + head, row3, T, D);
          pack_rows(dq, dqkv + head, row3, T, D);
          pack_rows(dy, dout + at, row, T, D);
          for (int t = 0; t < T; t++) delta[t] = dot(dy + (size_t)t * D, out + t * row + at, D);
          for (int i0 = 0; i0 < T; i0 += ATT_ROWS) {
            const int R = T - i0 < ATT_ROWS ? T - i0 : ATT_ROWS, n = i0 + R; /* keys 0..n-1 reach its last row */
            const float *qi = q + (size_t)i0 * D, *dyi = dy + (size_t)i0 * D;
            loom_cpu_sgemm_with(lib, false, true, R, n, D, scale, qi, D, k, D, 0.0f, p, n);
            loom_cpu_sgemm_with(lib, false, true, R, n, D, 1.0f, dyi, D, v, D, 0.0f, dp, n);
            for (int r = 0; r < R; r++)
              softmax_grad_row(p + (size_t)r * n, dp + (size_t)r * n, i0 + r, n, l[i0 + r], delta[i0 + r], scale, drop,
                               s, b, h);
            loom_cpu_sgemm_with(lib, true, false, n, D, R, 1.0f, p, n, dyi, D, 1.0f, dv, D);
            loom_cpu_sgemm_with(lib, true, false, n, D, R, 1.0f, dp, n, qi, D, 1.0f, dk, D);
            loom_cpu_sgemm_with(lib, false, false, R, D, n, 1.0f, dp, n, k, D, 1.0f, dq + (size_t)i0 * D, D);
          }
          unpack_rows(dqkv + head, row3, dq, T, D);
        }
        unpack_rows(dqkv + kat, row3, dk, T, D);
        unpack_rows(dqkv + vat, row3, dv, T, D);
      }
    free(k);
  }
}

/* ---- context-parallel attention's blocks ---- */

/* A block's keys as runs of consecutive positions (a ring's blocks are
 * two): run r is keys [at, at + len) at positions first, first + 1, ...;
 * a query at pos sees a prefix of each (key_prefix). */
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

/* The keys of run u that a query at pos sees: a prefix of it. */
static int key_prefix(const key_run *u, int pos) {
  const int m = pos - u->first + 1;
  return m < 0 ? 0 : m > u->len ? u->len : m;
}

/* Whether any key of the runs is at or before pos. */
static bool sees_any(const key_run *runs, int nruns, int pos) {
  for (int i = 0; i < nruns; i++)
    if (runs[i].first <= pos) return true;
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
    const int m = lse == -INFINITY ? 0 : key_prefix(&runs[i], pos);
    if (!dropping(drop)) {
#pragma omp simd
      for (int t = 0; t < m; t++) {
        const float prob = loom_fast_expf(x[t] - lse);
        x[t] = prob;
        dx[t] = prob * (dx[t] - delta) * scale;
      }
    } else {
      for (int t = 0; t < m; t++) {
        const float prob = loom_fast_expf(x[t] - lse), keep = keep_scale(drop, s, b, h, pos, k_pos[runs[i].at + t]);
        x[t] = prob * keep;
        dx[t] = prob * (dx[t] * keep - delta) * scale;
      }
    }
    if (runs[i].len > m) {
      memset(x + m, 0, (size_t)(runs[i].len - m) * sizeof(float));
      memset(dx + m, 0, (size_t)(runs[i].len - m) * sizeof(float));
    }
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
    const int m = key_prefix(&runs[i], pos);
#pragma omp simd reduction(max : maxv)
    for (int t = 0; t < m; t++) maxv = x[t] > maxv ? x[t] : maxv;
  }
  if (maxv == -INFINITY) {
    memset(pr, 0, (size_t)n * sizeof(float));
    return -INFINITY;
  }
  for (int i = 0; i < nruns; i++) {
    float *x = pr + runs[i].at;
    const int m = key_prefix(&runs[i], pos);
#pragma omp simd reduction(+ : sum)
    for (int t = 0; t < m; t++) {
      x[t] = loom_fast_expf(x[t] - maxv);
      sum += x[t];
    }
    if (runs[i].len > m) memset(x + m, 0, (size_t)(runs[i].len - m) * sizeof(float));
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
static void cpu_attention_block_forward(const loom_ops *be, float *out, float *lse, const float *q, const float *kv, int Tq,
                                        int Tk, const int *q_pos, const int *k_pos, const loom_attn_shape *s,
                                        const loom_dropout *drop, bool first) {
  loom_attn_shape_check(s);
  const int B = s->B, H = s->heads, K = s->kv_heads, D = s->head_dim;
  const size_t width = (size_t)H * D, w3 = loom_attn_qkv_width(s), kvw = 2 * (size_t)K * D;
  const float scale = 1.0f / sqrtf((float)D);
  const loom_gemm_library lib = loom_cpu_gemm_library();
  key_run *runs = loom_xmalloc((size_t)Tk * sizeof *runs, "attention key runs");
  const int nruns = key_runs(k_pos, Tk, runs);
#pragma omp parallel
  {
    float *k = loom_xmalloc((2 * (size_t)Tk * D + 2 * (size_t)Tq * D + (size_t)ATT_ROWS * Tk) * sizeof(float),
                            "attention scratch");
    float *v = k + (size_t)Tk * D, *x = v + (size_t)Tk * D, *o = x + (size_t)Tq * D, *p = o + (size_t)Tq * D;
#pragma omp for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; b++)
      for (int h = 0; h < H; h++) {
        const size_t g = (size_t)loom_attn_kv_head(s, h) * D;
        pack_rows(x, q + (size_t)b * w3 + (size_t)h * D, w3 * B, Tq, D);
        pack_rows(k, kv + (size_t)b * kvw + g, kvw * B, Tk, D);
        pack_rows(v, kv + (size_t)b * kvw + (size_t)K * D + g, kvw * B, Tk, D);
        for (int i0 = 0; i0 < Tq; i0 += ATT_ROWS) {
          const int R = Tq - i0 < ATT_ROWS ? Tq - i0 : ATT_ROWS;
          float blk[ATT_ROWS];
          int last = q_pos[i0]; /* the tile's latest query: where no key is at or before it, no row sees any */
          for (int r = 1; r < R; r++) last = q_pos[i0 + r] > last ? q_pos[i0 + r] : last;
          if (sees_any(runs, nruns, last)) {
            loom_cpu_sgemm_with(lib, false, true, R, Tk, D, scale, x + (size_t)i0 * D, D, k, D, 0.0f, p, Tk);
            for (int r = 0; r < R; r++)
              blk[r] = block_softmax_row(p + (size_t)r * Tk, Tk, q_pos[i0 + r], runs, nruns, k_pos, drop, s, b, h);
            loom_cpu_sgemm_with(lib, false, false, R, D, Tk, 1.0f, p, Tk, v, D, 0.0f, o + (size_t)i0 * D, D);
          } else {
            for (int r = 0; r < R; r++) blk[r] = -INFINITY;
            memset(o + (size_t)i0 * D, 0, (size_t)R * D * sizeof(float));
          }
          for (int r = 0; r < R; r++) {
            const int t = i0 + r;
            merge_row(out + ((size_t)t * B + b) * width + (size_t)h * D, lse + ((size_t)b * H + h) * Tq + t,
                      o + (size_t)t * D, blk[r], D, first);
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
static void cpu_attention_block_backward(const loom_ops *be, float *dq, float *dkv, const float *dout, const float *out,
                                         const float *q, const float *kv, int Tq, int Tk, const int *q_pos,
                                         const int *k_pos, const float *lse, const loom_attn_shape *s,
                                         const loom_dropout *drop) {
  loom_attn_shape_check(s);
  const int B = s->B, H = s->heads, K = s->kv_heads, D = s->head_dim, group = H / K;
  const size_t width = (size_t)H * D, w3 = loom_attn_qkv_width(s), kvw = 2 * (size_t)K * D;
  const size_t keys = (size_t)Tk * D, rows = (size_t)Tq * D, tile = (size_t)ATT_ROWS * Tk;
  const float scale = 1.0f / sqrtf((float)D);
  const loom_gemm_library lib = loom_cpu_gemm_library();
  key_run *runs = loom_xmalloc((size_t)Tk * sizeof *runs, "attention key runs");
  const int nruns = key_runs(k_pos, Tk, runs);
  /* Each (b, kv head) touches only its own columns: its k and v, and the q of the heads it serves. */
#pragma omp parallel
  {
    float *k = loom_xmalloc((4 * keys + 3 * rows + 2 * tile + (size_t)Tq) * sizeof(float), "attention scratch");
    float *v = k + keys, *dk = v + keys, *dv = dk + keys, *x = dv + keys, *dx = x + rows, *dy = dx + rows;
    float *p = dy + rows, *dp = p + tile, *delta = dp + tile;
#pragma omp for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; b++)
      for (int g = 0; g < K; g++) {
        const size_t kat = (size_t)b * kvw + (size_t)g * D, vat = kat + (size_t)K * D;
        pack_rows(k, kv + kat, kvw * B, Tk, D);
        pack_rows(v, kv + vat, kvw * B, Tk, D);
        pack_rows(dk, dkv + kat, kvw * B, Tk, D);
        pack_rows(dv, dkv + vat, kvw * B, Tk, D);
        for (int h = g * group; h < (g + 1) * group; h++) {
          const size_t head = (size_t)b * w3 + (size_t)h * D, at = (size_t)b * width + (size_t)h * D;
          const float *l = lse + ((size_t)b * H + h) * Tq;
          pack_rows(x, q + head, w3 * B, Tq, D);
          pack_rows(dx, dq + head, w3 * B, Tq, D);
          pack_rows(dy, dout + at, width * B, Tq, D);
          for (int t = 0; t < Tq; t++) delta[t] = dot(dy + (size_t)t * D, out + (size_t)t * width * B + at, D);
          for (int i0 = 0; i0 < Tq; i0 += ATT_ROWS) {
            const int R = Tq - i0 < ATT_ROWS ? Tq - i0 : ATT_ROWS;
            const float *xi = x + (size_t)i0 * D, *dyi = dy + (size_t)i0 * D;
            int last = q_pos[i0]; /* a tile none of whose rows sees a key adds nothing */
            for (int r = 1; r < R; r++) last = q_pos[i0 + r] > last ? q_pos[i0 + r] : last;
            if (!sees_any(runs, nruns, last)) continue;
            loom_cpu_sgemm_with(lib, false, true, R, Tk, D, scale, xi, D, k, D, 0.0f, p, Tk);
            loom_cpu_sgemm_with(lib, false, true, R, Tk, D, 1.0f, dyi, D, v, D, 0.0f, dp, Tk);
            for (int r = 0; r < R; r++) {
              const int t = i0 + r;
              float *pr = p + (size_t)r * Tk, *dpr = dp + (size_t)r * Tk;
              block_softmax_grad_row(pr, dpr, q_pos[t], runs, nruns, k_pos, l[t], delta[t], scale, drop, s, b, h);
            }
            loom_cpu_sgemm_with(lib, true, false, Tk, D, R, 1.0f, p, Tk, dyi, D, 1.0f, dv, D);
            loom_cpu_sgemm_with(lib, true, false, Tk, D, R, 1.0f, dp, Tk, xi, D, 1.0f, dk, D);
            loom_cpu_sgemm_with(lib, false, false, R, D, Tk, 1.0f, dp, Tk, k, D, 1.0f, dx + (size_t)i0 * D, D);
          }
          unpack_rows(dq + head, w3 * B, dx, Tq, D);
        }
        unpack_rows(dkv + kat, kvw * B, dk, Tk, D);
        unpack_rows(dkv + vat, kvw * B, dv, Tk, D);
      }
    free(k);
  }
  free(runs);
}

/* The table row token i's output row o takes, or -1 with o zeroed (another rank's token). */
static int embedding_row(float *o, int token, int vocab_start, int rows, int C) {
  const int row = token - vocab_start;
  if (row >= 0 && row < rows) return row;
  memset(o, 0, (size_t)C * sizeof(float));
  return -1;
}

static void cpu_embedding_forward(const loom_ops *be, float *out, const int *tokens, const float *wte, int vocab_start, int rows,
                                  int T, int B, int C) {
#pragma omp parallel for schedule(static) if ((size_t)T * B * C > PAR_MIN)
  for (int i = 0; i < T * B; i++) {
    float *o = out + (size_t)i * C;
    const int row = embedding_row(o, tokens[i], vocab_start, rows, C);
    if (row >= 0) memcpy(o, wte + (size_t)row * C, (size_t)C * sizeof(float));
  }
}

static void cpu_embedding_forward_bf16(const loom_ops *be, float *out, const int *tokens, const uint16_t *wte,
                                       int vocab_start, int rows, int T, int B, int C) {
#pragma omp parallel for schedule(static) if ((size_t)T * B * C > PAR_MIN)
  for (int i = 0; i < T * B; i++) {
    float *o = out + (size_t)i * C;
    const int row = embedding_row(o, tokens[i], vocab_start, rows, C);
    if (row < 0) continue;
    const uint16_t *w = wte + (size_t)row * C;
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = loom_bf16_value(w[c]);
  }
}

static void cpu_embedding_backward(const loom_ops *be, float *dwte, const float *dout, const int *tokens, int vocab_start, int rows,
                                   int T, int B, int C) {
  /* Tokens repeat, so threads split the feature dimension, never the rows. */
#pragma omp parallel for schedule(static) if ((size_t)T * B * C > PAR_MIN)
  for (int c0 = 0; c0 < C; c0 += 64) {
    const int c1 = c0 + 64 < C ? c0 + 64 : C;
    for (int i = 0; i < T * B; i++) {
      const int row = tokens[i] - vocab_start;
      if (row < 0 || row >= rows) continue;
      const float *d = dout + (size_t)i * C;
      float *e = dwte + (size_t)row * C;
      for (int c = c0; c < c1; c++) e[c] += d[c];
    }
  }
}

static void cpu_position_forward(const loom_ops *be, float *out, const float *wpe, int T, int B, int C, int pos_offset) {
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)T * B * C > PAR_MIN)
  for (int t = 0; t < T; t++)
    for (int b = 0; b < B; b++) {
      const float *p = wpe + (size_t)(pos_offset + t) * C;
      float *o = out + ((size_t)t * B + b) * C;
#pragma omp simd
      for (int c = 0; c < C; c++) o[c] += p[c];
    }
}

static void cpu_position_backward(const loom_ops *be, float *dwpe, const float *dout, int T, int B, int C, int pos_offset) {
  /* Position t gathers its B rows; threads own positions. */
#pragma omp parallel for schedule(static) if ((size_t)T * B * C > PAR_MIN)
  for (int t = 0; t < T; t++) {
    float *p = dwpe + (size_t)(pos_offset + t) * C;
    for (int b = 0; b < B; b++) {
      const float *d = dout + ((size_t)t * B + b) * C;
#pragma omp simd
      for (int c = 0; c < C; c++) p[c] += d[c];
    }
  }
}

/* log sum exp of one row's first V logits (-inf for an empty range). */
static float row_logsumexp(const float *z, int V) {
  if (V <= 0) return -INFINITY;
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (int v = 0; v < V; v++) m = z[v] > m ? z[v] : m;
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int v = 0; v < V; v++) sum += loom_fast_expf(z[v] - m);
  return m + logf(sum);
}

static void cpu_logsumexp(const loom_ops *be, float *lse, const float *logits, int N, int V, int width) {
#pragma omp parallel for schedule(static) if ((size_t)N * V > PAR_MIN)
  for (int n = 0; n < N; n++) lse[n] = row_logsumexp(logits + (size_t)n * width, V);
}

static void cpu_pick_targets(const loom_ops *be, float *picked, const float *logits, const int *targets, int vocab_start,
                             int N, int V, int width) {
  for (int n = 0; n < N; n++) {
    const int col = targets[n] - vocab_start;
    picked[n] = targets[n] >= 0 && col >= 0 && col < V ? logits[(size_t)n * width + col] : 0.0f;
  }
}

static void cpu_crossentropy_backward(const loom_ops *be, float *dlogits, const float *logits, const float *lse, const int *targets,
                                      int vocab_start, float dloss, int N, int V, int width) {
#pragma omp parallel for schedule(static) if ((size_t)N * width > PAR_MIN)
  for (int n = 0; n < N; n++) {
    const float *z = logits + (size_t)n * width;
    float *dz = dlogits + (size_t)n * width;
    const int col = targets[n] - vocab_start;
    if (targets[n] < 0) {
      memset(dz, 0, (size_t)width * sizeof(float));
      continue;
    }
    const float zt = col >= 0 && col < V ? z[col] : 0.0f, l = lse[n];
#pragma omp simd
    for (int v = 0; v < V; v++) dz[v] = dloss * loom_fast_expf(z[v] - l);
    if (col >= 0 && col < V) dz[col] = dloss * (loom_fast_expf(zt - l) - 1.0f);
    for (int v = V; v < width; v++) dz[v] = 0.0f;
  }
}

static void cpu_argmax(const loom_ops *be, float *val, int *idx, const float *logits, int N, int V, int width) {
#pragma omp parallel for schedule(static) if ((size_t)N * V > PAR_MIN)
  for (int n = 0; n < N; n++) {
    const float *z = logits + (size_t)n * width;
    idx[n] = loom_row_argmax(z, V);
    val[n] = idx[n] >= 0 ? z[idx[n]] : -INFINITY;
  }
}

static void cpu_add(const loom_ops *be, float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for simd schedule(static) if (n > PAR_MIN)
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

static void cpu_accumulate(const loom_ops *be, float *acc, const float *x, size_t n) {
#pragma omp parallel for simd schedule(static) if (n > PAR_MIN)
  for (size_t i = 0; i < n; i++) acc[i] += x[i];
}

static double cpu_sumsq(const loom_ops *be, const float *x, size_t n) {
  double acc = 0.0;
#pragma omp parallel for simd reduction(+ : acc) schedule(static) if (n > PAR_MIN)
  for (size_t i = 0; i < n; i++) acc += (double)x[i] * x[i];
  return acc;
}

static void cpu_gemm(const loom_ops *be, bool ta, bool tb, int M, int N, int K, float alpha, const float *a,
                     const float *b, float beta, float *c) {
  if (M == 0 || N == 0) return;
  loom_cpu_sgemm_with(loom_cpu_gemm_library(), ta, tb, M, N, K, alpha, a, ta ? M : K, b, tb ? K : N, beta, c, N);
}

static void cpu_sign_pack(const loom_ops *be, uint32_t *msg, const float *x, size_t n) {
  double total = 0.0;
#pragma omp parallel for simd reduction(+ : total) schedule(static) if (n > PAR_MIN)
  for (size_t i = 0; i < n; i++) total += fabs((double)x[i]);
  const float mean = n ? (float)(total / (double)n) : 0.0f;
  memcpy(&msg[0], &mean, sizeof mean);
  const size_t words = (n + 31) / 32;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
  for (size_t w = 0; w < words; w++) {
    uint32_t bits = 0;
    const size_t end = 32 * w + 32 < n ? 32 * w + 32 : n;
    for (size_t i = 32 * w; i < end; i++) bits |= (uint32_t)(x[i] >= 0.0f) << (i % 32);
    msg[1 + w] = bits;
  }
}

static void cpu_rows_gather(const loom_ops *be, float *out, const float *x, const int *rows, int M, int C) {
#pragma omp parallel for schedule(static) if ((size_t)M * C > PAR_MIN)
  for (int i = 0; i < M; i++) memcpy(out + (size_t)i * C, x + (size_t)rows[i] * C, (size_t)C * sizeof(float));
}

/* Threads own tokens; each element sums its k terms in order, as the reference does. */
static void cpu_rows_combine(const loom_ops *be, float *y, const float *x, const int *slots, const float *w, int N, int k,
                             int C) {
#pragma omp parallel for schedule(static) if ((size_t)N * C * k > PAR_MIN)
  for (int n = 0; n < N; n++) {
    float *o = y + (size_t)n * C;
    for (int c = 0; c < C; c++) o[c] = 0.0f;
    for (int j = 0; j < k; j++) {
      const int s = slots[(size_t)n * k + j];
      if (s < 0) continue;
      const float wj = w ? w[(size_t)n * k + j] : 1.0f, *r = x + (size_t)s * C;
#pragma omp simd
      for (int c = 0; c < C; c++) o[c] += wj * r[c];
    }
  }
}

static void cpu_rows_combine_backward(const loom_ops *be, float *dx, float *dw, const float *dy, const float *x,
                                      const int *slots, const float *w, int N, int k, int C) {
#pragma omp parallel for schedule(static) if ((size_t)N * C * k > PAR_MIN)
  for (int n = 0; n < N; n++)
    for (int j = 0; j < k; j++) {
      const int s = slots[(size_t)n * k + j];
      const float wj = w[(size_t)n * k + j], *d = dy + (size_t)n * C;
      float dot = 0.0f;
      for (int c = 0; s >= 0 && c < C; c++) { /* in order: the dot product sums as the reference's */
        dx[(size_t)s * C + c] = wj * d[c];
        dot += d[c] * x[(size_t)s * C + c];
      }
      if (dw) dw[(size_t)n * k + j] = dot;
    }
}

static void cpu_sign_unpack_add(const loom_ops *be, float *y, const uint32_t *msg, size_t n, float weight) {
  float mean;
  memcpy(&mean, &msg[0], sizeof mean);
  const float step = weight * mean;
#pragma omp parallel for simd schedule(static) if (n > PAR_MIN)
  for (size_t i = 0; i < n; i++) y[i] += (msg[1 + i / 32] >> (i % 32) & 1u) ? step : -step;
}

static void cpu_dropout_apply(const loom_ops *be, float *x, int T, int B, int C, const loom_dropout *d) {
  if (!d || d->p <= 0.0f) return;
  const float inv = 1.0f / (1.0f - d->p);
#pragma omp parallel for collapse(2) schedule(static)
  for (int t = 0; t < T; t++)
    for (int b = 0; b < B; b++) {
      float *row = x + ((size_t)t * B + b) * C;
      for (int c = 0; c < C; c++)
        row[c] = loom_dropout_keep(d, loom_dropout_index(d, t, b, c, T, C)) ? row[c] * inv : 0.0f;
    }
}

static void cpu_to_bf16(const loom_ops *be, uint16_t *out, const float *in, size_t n) {
#pragma omp parallel for simd schedule(static) if (n > PAR_MIN)
  for (size_t i = 0; i < n; i++) out[i] = loom_bf16_round(in[i]);
}

static void cpu_from_bf16(const loom_ops *be, float *out, const uint16_t *in, size_t n) {
#pragma omp parallel for simd schedule(static) if (n > PAR_MIN)
  for (size_t i = 0; i < n; i++) out[i] = loom_bf16_value(in[i]);
}

static void cpu_round_bf16(const loom_ops *be, float *x, size_t n) {
#pragma omp parallel for simd schedule(static) if (n > PAR_MIN)
  for (size_t i = 0; i < n; i++) x[i] = loom_bf16_value(loom_bf16_round(x[i]));
}

/* Native where the CPU has bf16 instructions, else widened exactly (cpu_bf16_gemm.h). */
static void cpu_matmul_forward_bf16(const loom_ops *be, float *out, loom_bf16_operand inp, const uint16_t *weight,
                                    const float *bias, int N, int C, int OC) {
  loom_gemm_shape g[LOOM_LINEAR_GEMMS];
  loom_cpu_linear_gemms(N, C, OC, g);
  loom_cpu_bf16_gemm_run(loom_cpu_bf16_gemm_path(), &g[LOOM_LINEAR_FORWARD], inp, loom_bf16_bits(weight), out);
  if (bias) cpu_bias_forward(be, out, bias, N, OC);
}

static void cpu_matmul_backward_bf16(const loom_ops *be, float *dinp, float *dweight, float *dbias, loom_bf16_operand dout,
                                     loom_bf16_operand inp, const uint16_t *weight, int N, int C, int OC) {
  loom_gemm_shape g[LOOM_LINEAR_GEMMS];
  loom_cpu_linear_gemms(N, C, OC, g);
  const loom_bf16_gemm_path path = loom_cpu_bf16_gemm_path();
  if (dinp && dweight) dout = loom_cpu_bf16_gemm_operand(path, dout, (size_t)N * OC); /* converted once for both */
  if (dinp) loom_cpu_bf16_gemm_run(path, &g[LOOM_LINEAR_INPUT_GRAD], dout, loom_bf16_bits(weight), dinp);
  if (dweight) loom_cpu_bf16_gemm_run(path, &g[LOOM_LINEAR_WEIGHT_GRAD], dout, inp, dweight);
  if (dbias) column_sums(dbias, dout.f32, dout.bf16, N, OC);
}

/* One AdamW update of element i (the loop bodies below share it). */
static inline float adamw_update(float *param, const float *grad, float *m, float *v, size_t i, float b1, float b2,
                                 float lr, float wd, float eps, float gs, float c1, float c2) {
  const float g = grad[i] * gs;
  const float mi = b1 * m[i] + (1.0f - b1) * g;
  const float vi = b2 * v[i] + (1.0f - b2) * g * g;
  m[i] = mi;
  v[i] = vi;
  return param[i] -= lr * (mi * c1 / (sqrtf(vi * c2) + eps) + wd * param[i]);
}

static void cpu_adamw(const loom_ops *be, float *param, const float *grad, float *m, float *v, uint16_t *compute,
                      size_t n, const loom_adamw_args *a) {
  const float b1 = a->beta1, b2 = a->beta2, lr = a->lr, wd = a->weight_decay, eps = a->eps, gs = a->grad_scale;
  const float c1 = 1.0f / (float)(1.0 - pow(a->beta1, a->step));
  const float c2 = 1.0f / (float)(1.0 - pow(a->beta2, a->step));
  if (!compute) {
#pragma omp parallel for simd schedule(static) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) adamw_update(param, grad, m, v, i, b1, b2, lr, wd, eps, gs, c1, c2);
    return;
  }
#pragma omp parallel for simd schedule(static) if (n > PAR_MIN)
  for (size_t i = 0; i < n; i++) compute[i] = loom_bf16_round(adamw_update(param, grad, m, v, i, b1, b2, lr, wd, eps, gs, c1, c2));
}

static const loom_ops CPU_OPS = {
    .name = "cpu",
    .mem = &loom_host_memory,
    .matmul_forward = cpu_matmul_forward,
    .matmul_backward = cpu_matmul_backward,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .attention_forward = cpu_attention_forward,
    .attention_block_forward = cpu_attention_block_forward,
    .attention_block_backward = cpu_attention_block_backward,
    .attention_backward = cpu_attention_backward,
    .embedding_forward = cpu_embedding_forward,
    .embedding_forward_bf16 = cpu_embedding_forward_bf16,
    .embedding_backward = cpu_embedding_backward,
    .position_forward = cpu_position_forward,
    .position_backward = cpu_position_backward,
    .bias_forward = cpu_bias_forward,
    .bias_backward = cpu_bias_backward,
    .logsumexp = cpu_logsumexp,
    .pick_targets = cpu_pick_targets,
    .crossentropy_backward = cpu_crossentropy_backward,
    .crossentropy_losses = loom_host_crossentropy_losses,
    .exp_shifted = loom_host_exp_shifted,
    .log_shifted = loom_host_log_shifted,
    .argmax = cpu_argmax,
    .add = cpu_add,
    .accumulate = cpu_accumulate,
    .sumsq = cpu_sumsq,
    .sumsq_batch = loom_host_sumsq_batch,
    .gemm = cpu_gemm,
    .orthonormalize = loom_host_orthonormalize,
    .sign_pack = cpu_sign_pack,
    .sign_unpack_add = cpu_sign_unpack_add,
    .grouped_matmul_forward = loom_grouped_matmul_by_expert,
    .grouped_matmul_backward = loom_grouped_matmul_backward_by_expert,
    .rows_gather = cpu_rows_gather,
    .rows_combine = cpu_rows_combine,
    .rows_combine_backward = cpu_rows_combine_backward,
    .dropout_forward = cpu_dropout_apply,
    .dropout_backward = cpu_dropout_apply,
    .to_bf16 = cpu_to_bf16,
    .from_bf16 = cpu_from_bf16,
    .round_bf16 = cpu_round_bf16,
    .matmul_forward_bf16 = cpu_matmul_forward_bf16,
    .matmul_backward_bf16 = cpu_matmul_backward_bf16,
    .adamw = cpu_adamw,
};

const loom_ops *loom_ops_cpu(void) { return &CPU_OPS; }
