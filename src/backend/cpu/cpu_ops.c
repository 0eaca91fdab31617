/* The CPU backend: every matmul through its GEMM library (cpu_gemm.h: oneDNN
 * or OpenBLAS), everything else as
 * OpenMP-parallel loops that the compiler vectorises. Semantics match the
 * reference backend (ref/ref_ops.c) op for op; tests/test_ops.c holds them to
 * it. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu_attention.h"
#include "backend/cpu/cpu_bf16_gemm.h"
#include "backend/cpu/cpu_fp8.h"
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

static void cpu_swiglu_forward(const loom_ops *be, float *out, const float *inp, int N, int F, loom_glu glu) {
#pragma omp parallel for schedule(static) if ((size_t)N * F > PAR_MIN)
  for (int n = 0; n < N; n++) {
    const float *gate = inp + (size_t)n * 2 * F, *up = gate + F;
    float *y = out + (size_t)n * F;
#pragma omp simd
    for (int f = 0; f < F; f++) y[f] = loom_glu_act(loom_glu_gate(gate[f], glu), glu) * loom_glu_up(up[f], glu);
  }
}

static void cpu_swiglu_backward(const loom_ops *be, float *dinp, const float *dout, const float *inp, int N, int F,
                                loom_glu glu) {
#pragma omp parallel for schedule(static) if ((size_t)N * F > PAR_MIN)
  for (int n = 0; n < N; n++) {
    const float *gate = inp + (size_t)n * 2 * F, *up = gate + F, *dy = dout + (size_t)n * F;
    float *dgate = dinp + (size_t)n * 2 * F, *dup = dgate + F;
#pragma omp simd
    for (int f = 0; f < F; f++) {
      const float g = loom_glu_gate(gate[f], glu);
      dgate[f] += dy[f] * loom_glu_up(up[f], glu) * loom_glu_act_grad(g, glu) * loom_glu_gate_passes(gate[f], glu);
      dup[f] += dy[f] * loom_glu_act(g, glu) * loom_glu_up_passes(up[f], glu);
    }
  }
}

/* RoPE with one table of each position's cos and sin, shared by the batch and the heads. */
static void cpu_rope(float *x, int T, int B, int stride, int heads, int D, int pos_offset, loom_rope rope, double sign) {
  const int half = D / 2;
  float *cs = loom_xmalloc((size_t)T * half * 2 * sizeof(float), "RoPE table");
  for (int t = 0; t < T; t++)
    for (int i = 0; i < half; i++) {
      loom_rope_turn(pos_offset + t, i, D, rope, sign, &cs[((size_t)t * half + i) * 2], &cs[((size_t)t * half + i) * 2 + 1]);
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
    .attention_forward = loom_cpu_attention_forward,
    .attention_block_forward = loom_cpu_attention_block_forward,
    .attention_block_backward = loom_cpu_attention_block_backward,
    .attention_backward = loom_cpu_attention_backward,
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
    .attention_sink_forward = loom_host_attention_sink_forward,
    .attention_sink_backward = loom_host_attention_sink_backward,
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
    .fp8_amax = loom_host_fp8_amax,
    .fp8_quantize = loom_host_fp8_quantize,
    .fp8_gemm = loom_cpu_fp8_gemm,
    .adamw = cpu_adamw,
};

const loom_ops *loom_ops_cpu(void) { return &CPU_OPS; }
