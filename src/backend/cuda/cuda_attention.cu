// The CUDA backend's attention: whole sequences, and context parallelism's blocks.
#include "backend/cuda/cuda_ops.cuh"

namespace loom_cuda {

// ---- context-parallel attention's blocks ---------------------------------------
// A direct version of the contract: a block of threads per query row (or
// key row) and head, a thread per head dimension, each score a block sum;
// deterministic (every grad summed by the thread that owns it, no
// atomics), not yet tiled as the fused kernels are.

void check_shape(const loom_attn_shape *s); // below, with the fused attention's

// The rows' global positions (host memory) copied to the context's buffer on the stream: q's, then k's.
const int *device_positions(Backend &g, const int *q_pos, int Tq, const int *k_pos, int Tk) {
  int *dev = (int *)grow(g, g.positions, g.position_bytes, ((size_t)Tq + Tk) * sizeof(int), "attention positions");
  check(cudaMemcpyAsync(dev, q_pos, (size_t)Tq * sizeof(int), cudaMemcpyHostToDevice, g.stream), "attention positions");
  check(cudaMemcpyAsync(dev + Tq, k_pos, (size_t)Tk * sizeof(int), cudaMemcpyHostToDevice, g.stream), "attention positions");
  return dev;
}

// Where a block's rows lie: q's among qkv rows, k's and v's among kv rows (part 0, 1).
struct BlockRows {
  int Tq, Tk, K;
  size_t w3, kvw;
  __device__ const float *q(const float *base, const AttnArgs &a, int t, int b, int h) const {
    return base + ((size_t)t * a.B + b) * w3 + (size_t)h * a.D;
  }
  __device__ size_t kv_at(const AttnArgs &a, int t, int b, int part, int g) const {
    return ((size_t)t * a.B + b) * kvw + (part == 0 ? (size_t)g * a.D : (size_t)K * a.D + (size_t)g * a.Dv);
  }
  __device__ const float *kv(const float *base, const AttnArgs &a, int t, int b, int part, int g) const {
    return base + kv_at(a, t, b, part, g);
  }
};

inline BlockRows block_rows(const loom_attn_shape *s, int Tq, int Tk) {
  return BlockRows{Tq, Tk, s->kv_heads, loom_attn_qkv_width(s), loom_attn_kv_width(s)};
}

// The wider of a call's head widths: a block's threads cover both.
inline int widest_head(const loom_attn_shape *s) { return s->head_dim > loom_attn_v_dim(s) ? s->head_dim : loom_attn_v_dim(s); }

// A thread per dimension, rounded up to whole warps.
inline unsigned dim_threads(int D) { return (unsigned)((D + 31) / 32 * 32); }

__device__ inline float row_dot(const float *x, const float *y, int D) {
  const int d = threadIdx.x;
  return block_sum(d < D ? x[d] * y[d] : 0.0f);
}

__global__ void attention_block_forward_kernel(float *out, float *lse, const float *q, const float *kv, const int *pos,
                                               BlockRows r, AttnArgs a, bool first) {
  const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, d = threadIdx.x, D = a.D, Dv = a.Dv, g = h / (a.H / r.K);
  const int *k_pos = pos + r.Tq, qp = pos[t];
  const float scale = a.scale, *x = r.q(q, a, t, b, h);
  float *o = out + ((size_t)t * a.B + b) * a.H * Dv + (size_t)h * Dv, *l = lse + ((size_t)b * a.H + h) * r.Tq + t;
  const float old = first ? -INFINITY : *l;
  __syncthreads(); // every thread has read *l before thread 0 writes it
  float maxv = -INFINITY, sum = 0.0f, acc = 0.0f;
  for (int tk = 0; tk < r.Tk; tk++)
    if (loom_attn_sees(a.window, qp, k_pos[tk])) maxv = fmaxf(maxv, row_dot(x, r.kv(kv, a, tk, b, 0, g), D) * scale);
  if (maxv == -INFINITY) { // no key of this block is before the query
    if (first && d < Dv) o[d] = 0.0f;
    if (first && d == 0) *l = -INFINITY;
    return;
  }
  for (int tk = 0; tk < r.Tk; tk++)
    if (loom_attn_sees(a.window, qp, k_pos[tk])) sum += expf(row_dot(x, r.kv(kv, a, tk, b, 0, g), D) * scale - maxv);
  const float blk = maxv + logf(sum);
  for (int tk = 0; tk < r.Tk; tk++) {
    if (!loom_attn_sees(a.window, qp, k_pos[tk])) continue;
    const float p = expf(row_dot(x, r.kv(kv, a, tk, b, 0, g), D) * scale - blk) * keep_factor(a, b, h, qp, k_pos[tk]);
    if (d < Dv) acc += p * r.kv(kv, a, tk, b, 1, g)[d];
  }
  const float merged = old > blk ? old + log1pf(expf(blk - old)) : blk + log1pf(expf(old - blk));
  const float keep = old == -INFINITY ? 0.0f : expf(old - merged), add = expf(blk - merged);
  if (d < Dv) o[d] = old == -INFINITY ? add * acc : keep * o[d] + add * acc; /* o unread first: it may hold a NaN */
  if (d == 0) *l = merged;
}

// dq of one query row and head: its block's keys, p from the merged log-sum-exp, dS = p (dP keep - dout . out) scale.
__global__ void attention_block_dq_kernel(float *dq, const float *dout, const float *out, const float *q, const float *kv,
                                          const float *lse, const int *pos, BlockRows r, AttnArgs a) {
  const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, d = threadIdx.x, D = a.D, Dv = a.Dv, g = h / (a.H / r.K);
  const int *k_pos = pos + r.Tq, qp = pos[t];
  const float l = lse[((size_t)b * a.H + h) * r.Tq + t];
  if (l == -INFINITY) return;
  const float scale = a.scale, *x = r.q(q, a, t, b, h);
  const size_t at = ((size_t)t * a.B + b) * a.H * Dv + (size_t)h * Dv;
  const float delta = row_dot(dout + at, out + at, Dv);
  float acc = 0.0f;
  for (int tk = 0; tk < r.Tk; tk++) {
    if (!loom_attn_sees(a.window, qp, k_pos[tk])) continue;
    const float *k = r.kv(kv, a, tk, b, 0, g);
    const float p = expf(row_dot(x, k, D) * scale - l), keep = keep_factor(a, b, h, qp, k_pos[tk]);
    const float ds = p * (row_dot(dout + at, r.kv(kv, a, tk, b, 1, g), Dv) * keep - delta) * scale;
    if (d < D) acc += ds * k[d];
  }
  if (d < D) dq[((size_t)t * a.B + b) * r.w3 + (size_t)h * D + d] += acc;
}

// dk and dv of one key row and key/value head: every query row of the heads it serves that sees it.
__global__ void attention_block_dkv_kernel(float *dkv, const float *dout, const float *out, const float *q, const float *kv,
                                           const float *lse, const int *pos, BlockRows r, AttnArgs a) {
  const int tk = blockIdx.x, g = blockIdx.y, b = blockIdx.z, d = threadIdx.x, D = a.D, Dv = a.Dv, group = a.H / r.K;
  const int kp = pos[r.Tq + tk];
  const float scale = a.scale, *k = r.kv(kv, a, tk, b, 0, g), *v = r.kv(kv, a, tk, b, 1, g);
  float dk = 0.0f, dv = 0.0f;
  for (int h = g * group; h < (g + 1) * group; h++)
    for (int t = 0; t < r.Tq; t++) {
      const float l = lse[((size_t)b * a.H + h) * r.Tq + t];
      if (!loom_attn_sees(a.window, pos[t], kp) || l == -INFINITY) continue;
      const float *x = r.q(q, a, t, b, h);
      const size_t at = ((size_t)t * a.B + b) * a.H * Dv + (size_t)h * Dv;
      const float p = expf(row_dot(x, k, D) * scale - l), keep = keep_factor(a, b, h, pos[t], kp);
      const float ds = p * (row_dot(dout + at, v, Dv) * keep - row_dot(dout + at, out + at, Dv)) * scale;
      if (d < Dv) dv += p * keep * dout[at + d];
      if (d < D) dk += ds * x[d];
    }
  if (d < D) dkv[r.kv_at(a, tk, b, 0, g) + d] += dk;
  if (d < Dv) dkv[r.kv_at(a, tk, b, 1, g) + d] += dv;
}

void cuda_attention_block_forward(const loom_ops *be, float *out, float *lse, const float *q, const float *kv, int Tq, int Tk,
                                  const int *q_pos, const int *k_pos, const loom_attn_shape *s, const loom_dropout *drop,
                                  bool first) {
  Backend &g = ctx(be);
  check_shape(s);
  if (Tq == 0) return;
  const int *pos = device_positions(g, q_pos, Tq, k_pos, Tk);
  LAUNCH(attention_block_forward_kernel, dim3((unsigned)Tq, (unsigned)s->heads, (unsigned)s->B), dim_threads(widest_head(s)), 0,
         g.stream, out, lse, q, kv, pos, block_rows(s, Tq, Tk), attn_args(s, drop), first);
  launched("attention_block_forward");
}

void cuda_attention_block_backward(const loom_ops *be, float *dq, float *dkv, const float *dout, const float *out,
                                   const float *q, const float *kv, int Tq, int Tk, const int *q_pos, const int *k_pos,
                                   const float *lse, const loom_attn_shape *s, const loom_dropout *drop) {
  Backend &g = ctx(be);
  check_shape(s);
  if (Tq == 0 || Tk == 0) return;
  const int *pos = device_positions(g, q_pos, Tq, k_pos, Tk);
  const BlockRows r = block_rows(s, Tq, Tk);
  const AttnArgs a = attn_args(s, drop);
  LAUNCH(attention_block_dq_kernel, dim3((unsigned)Tq, (unsigned)s->heads, (unsigned)s->B), dim_threads(widest_head(s)), 0,
         g.stream, dq, dout, out, q, kv, lse, pos, r, a);
  LAUNCH(attention_block_dkv_kernel, dim3((unsigned)Tk, (unsigned)s->kv_heads, (unsigned)s->B), dim_threads(widest_head(s)), 0,
         g.stream, dkv, dout, out, q, kv, lse, pos, r, a);
  launched("attention_block_backward");
}

// ---- attention sinks ---------------------------------------------------------------
// ops.h's contract on out[T,B,H*Dv] and lse[B,H,T]: a block per row, a
// thread per dimension, forward; a block per head summing its rows in a
// fixed order, backward (deterministic, no atomics).

__device__ inline size_t sink_row(const loom_attn_shape &s, int Dv, int b, int h, int t) {
  return ((size_t)t * s.B + b) * (size_t)s.heads * Dv + (size_t)h * Dv;
}

__global__ void attention_sink_forward_kernel(float *out, float *lse, const float *sinks, loom_attn_shape s, int Dv) {
  const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, d = threadIdx.x;
  float *l = lse + ((size_t)b * s.heads + h) * s.T + t;
  const float old = *l, joined = loom_sink_joined_lse(old, sinks ? sinks[h] : 0.0f);
  __syncthreads(); // every thread has read *l before thread 0 writes it
  if (d < Dv) out[sink_row(s, Dv, b, h, t) + d] *= old == -INFINITY ? 0.0f : expf(old - joined);
  if (d == 0) *l = joined;
}

__global__ void attention_sink_backward_kernel(float *dsinks, const float *dout, const float *out, const float *lse,
                                               const float *sinks, loom_attn_shape s, int Dv) {
  const int h = blockIdx.x;
  const float sink = sinks ? sinks[h] : 0.0f;
  float grad = 0.0f;
  for (int r = threadIdx.x; r < s.B * s.T; r += blockDim.x) {
    const int b = r / s.T, t = r % s.T;
    const float *dy = dout + sink_row(s, Dv, b, h, t), *o = out + sink_row(s, Dv, b, h, t);
    float dot = 0.0f;
    for (int d = 0; d < Dv; d++) dot += dy[d] * o[d];
    grad -= expf(sink - lse[((size_t)b * s.heads + h) * s.T + t]) * dot;
  }
  grad = block_sum(grad);
  if (threadIdx.x == 0) dsinks[h] += grad;
}

void cuda_attention_sink_forward(const loom_ops *be, float *out, float *lse, const float *sinks, const loom_attn_shape *s) {
  Backend &g = ctx(be);
  if (s->T == 0 || s->B == 0) return;
  LAUNCH(attention_sink_forward_kernel, dim3((unsigned)s->T, (unsigned)s->heads, (unsigned)s->B), dim_threads(loom_attn_v_dim(s)), 0,
         g.stream, out, lse, sinks, *s, loom_attn_v_dim(s));
  launched("attention_sink_forward");
}

void cuda_attention_sink_backward(const loom_ops *be, float *dsinks, const float *dout, const float *out, const float *lse,
                                  const float *sinks, const loom_attn_shape *s) {
  Backend &g = ctx(be);
  if (s->T == 0 || s->B == 0) return;
  LAUNCH(attention_sink_backward_kernel, s->heads, 256, 0, g.stream, dsinks, dout, out, lse, sinks, *s, loom_attn_v_dim(s));
  launched("attention_sink_backward");
}

// ---- attention -------------------------------------------------------------------
// Two implementations of the flash contract (ops.h: out and each row's
// log-sum-exp are kept, nothing T x T): the fused, tiled kernels of
// cuda_flash.cu (the default), and this one, which materialises the scores
// in context scratch for each call: strided-batched cuBLAS GEMMs over the
// heads with a softmax kernel between them, the backward rebuilding the
// probabilities from the saved log-sum-exps. It is the reference the fused
// kernels are timed against. qkv rows are [t, b] with q|k|v of every local head.

// One block per row (b, h, tq) of scores: causal softmax in place, the
// row's log-sum-exp saved; dropped (if not null) gets the probabilities
// after dropout.
__global__ void softmax_kernel(float *att, float *lse, float *dropped, AttnArgs a) {
  const int row = blockIdx.x, tq = row % a.T, h = row / a.T % a.H, b = row / (a.T * a.H);
  float *p = att + (size_t)row * a.T;
  float m = -INFINITY;
  for (int tk = threadIdx.x; tk <= tq; tk += blockDim.x)
    if (loom_attn_sees(a.window, tq, tk)) m = fmaxf(m, p[tk]);
  m = block_max(m);
  float s = 0.0f;
  for (int tk = threadIdx.x; tk <= tq; tk += blockDim.x)
    if (loom_attn_sees(a.window, tq, tk)) s += expf(p[tk] - m);
  s = block_sum(s);
  if (threadIdx.x == 0) lse[row] = m + logf(s);
  for (int tk = threadIdx.x; tk < a.T; tk += blockDim.x) {
    const float prob = loom_attn_sees(a.window, tq, tk) ? expf(p[tk] - m) / s : 0.0f;
    p[tk] = prob;
    if (dropped) dropped[(size_t)row * a.T + tk] = prob * keep_factor(a, b, h, tq, tk);
  }
}

// Scores back to probabilities with the saved log-sum-exps, in place; dropped as above.
__global__ void probs_kernel(float *att, const float *lse, float *dropped, AttnArgs a) {
  const int row = blockIdx.x, tq = row % a.T, h = row / a.T % a.H, b = row / (a.T * a.H);
  float *p = att + (size_t)row * a.T;
  const float l = lse[row];
  for (int tk = threadIdx.x; tk < a.T; tk += blockDim.x) {
    const float prob = loom_attn_sees(a.window, tq, tk) ? expf(p[tk] - l) : 0.0f;
    p[tk] = prob;
    if (dropped) dropped[(size_t)row * a.T + tk] = prob * keep_factor(a, b, h, tq, tk);
  }
}

// In place on datt: dP (after the dropout mask) becomes dS = P * (dP - sum P dP) * scale.
__global__ void softmax_backward_kernel(float *datt, const float *att, AttnArgs a, float scale) {
  const int row = blockIdx.x, tq = row % a.T, h = row / a.T % a.H, b = row / (a.T * a.H);
  const float *p = att + (size_t)row * a.T;
  float *dp = datt + (size_t)row * a.T;
  float dot = 0.0f;
  for (int tk = threadIdx.x; tk <= tq; tk += blockDim.x) {
    dp[tk] *= keep_factor(a, b, h, tq, tk);
    dot += p[tk] * dp[tk]; // p is 0 outside the window
  }
  dot = block_sum(dot);
  for (int tk = threadIdx.x; tk < a.T; tk += blockDim.x)
    dp[tk] = loom_attn_sees(a.window, tq, tk) ? p[tk] * (dp[tk] - dot) * scale : 0.0f;
}

unsigned row_threads(int T) { return T >= 256 ? 256u : (unsigned)((T + 31) / 32 * 32); }

// Grouped-query attention: query head h = g * group + j reads key/value head g.
// Each batched GEMM runs over the K key/value heads for one j, so its batch
// members write distinct heads; the j loop accumulates dk and dv in order.
// scores[b, h] = scale * q k^T for every (b, h), into att (column-major: k^T-view x q).
void attention_scores(Backend &g, float *att, const float *qkv, const loom_attn_shape *s) {
  const int T = s->T, H = s->heads, D = s->head_dim, K = s->kv_heads, group = H / K;
  const long long w3 = (long long)loom_attn_qkv_width(s), ldq = (long long)s->B * w3, TT = (long long)T * T;
  const float scale = loom_attn_scale(s), zero = 0.0f;
  for (int b = 0; b < s->B; b++)
    for (int j = 0; j < group; j++) {
      const float *q = qkv + (size_t)b * w3 + (size_t)j * D, *k = qkv + (size_t)b * w3 + (size_t)H * D;
      check_blas(g.lib.sgemm_strided_batched(g.blas, CUBLAS_OP_T, CUBLAS_OP_N, T, T, D, &scale, k, (int)ldq, D, q, (int)ldq,
                                           (long long)group * D, &zero, att + ((size_t)b * H + j) * TT, T, group * TT, K),
                 "attention scores");
    }
}

// Whether an attention call has no rows: cuBLAS refuses its leading dimensions (ldc T below max(1, m)).
bool no_rows(const loom_attn_shape *s) { return s->T == 0 || s->B == 0 || s->heads == 0; }

void cublas_attention_forward(Backend &g, float *out, float *lse, const float *qkv, const loom_attn_shape *s,
                              const loom_dropout *drop) {
  if (no_rows(s)) return;
  const AttnArgs a = attn_args(s, drop);
  const int T = a.T, H = a.H, D = a.D, Dv = a.Dv, K = s->kv_heads, group = H / K;
  const long long w3 = (long long)loom_attn_qkv_width(s), ldq = (long long)a.B * w3, ldo = (long long)a.B * H * Dv,
                  TT = (long long)T * T;
  const size_t probs_n = (size_t)a.B * H * TT;
  float *att = scratch(g, (a.p > 0.0f ? 2 : 1) * probs_n), *dropped = a.p > 0.0f ? att + probs_n : nullptr;
  attention_scores(g, att, qkv, s);
  LAUNCH(softmax_kernel, a.B * H * T, row_threads(T), 0, g.stream, att, lse, dropped, a);
  launched("attention softmax");
  const float *probs = dropped ? dropped : att, one = 1.0f, zero = 0.0f;
  for (int b = 0; b < a.B; b++) // out[b, h] = P v
    for (int j = 0; j < group; j++) {
      const float *v = qkv + (size_t)b * w3 + (size_t)(H + K) * D;
      check_blas(g.lib.sgemm_strided_batched(g.blas, CUBLAS_OP_N, CUBLAS_OP_N, Dv, T, T, &one, v, (int)ldq, Dv,
                                           probs + ((size_t)b * H + j) * TT, T, group * TT, &zero,
                                           out + (size_t)b * H * Dv + (size_t)j * Dv, (int)ldo, (long long)group * Dv, K),
                 "attention output");
    }
}

void cublas_attention_backward(Backend &g, float *dqkv, const float *dout, const float *qkv, const float *lse,
                               const loom_attn_shape *s, const loom_dropout *drop) {
  if (no_rows(s)) return;
  const AttnArgs a = attn_args(s, drop);
  const int T = a.T, H = a.H, D = a.D, Dv = a.Dv, K = s->kv_heads, group = H / K;
  const long long w3 = (long long)loom_attn_qkv_width(s), ldq = (long long)a.B * w3, ldo = (long long)a.B * H * Dv,
                  TT = (long long)T * T, qstride = (long long)group * D, ostride = (long long)group * Dv;
  const size_t probs_n = (size_t)a.B * H * TT;
  float *att = scratch(g, (a.p > 0.0f ? 3 : 2) * probs_n), *datt = att + probs_n;
  float *dropped = a.p > 0.0f ? datt + probs_n : nullptr;
  attention_scores(g, att, qkv, s);
  LAUNCH(probs_kernel, a.B * H * T, row_threads(T), 0, g.stream, att, lse, dropped, a);
  launched("attention probabilities");
  const float *probs = dropped ? dropped : att, one = 1.0f, zero = 0.0f;
  for (int b = 0; b < a.B; b++)
    for (int j = 0; j < group; j++) {
      const size_t vat = (size_t)b * w3 + (size_t)(H + K) * D;
      const float *v = qkv + vat, *dy = dout + (size_t)b * H * Dv + (size_t)j * Dv;
      float *dv = dqkv + vat, *dp = datt + ((size_t)b * H + j) * TT;
      // dP' = dy v^T (column-major: v^T-view x dy)
      check_blas(g.lib.sgemm_strided_batched(g.blas, CUBLAS_OP_T, CUBLAS_OP_N, T, T, Dv, &one, v, (int)ldq, Dv, dy, (int)ldo,
                                           ostride, &zero, dp, T, group * TT, K),
                 "attention dP");
      // dv += P'^T dy
      check_blas(g.lib.sgemm_strided_batched(g.blas, CUBLAS_OP_N, CUBLAS_OP_T, Dv, T, T, &one, dy, (int)ldo, ostride,
                                           probs + ((size_t)b * H + j) * TT, T, group * TT, &one, dv, (int)ldq, Dv, K),
                 "attention dv");
    }
  LAUNCH(softmax_backward_kernel, a.B * H * T, row_threads(T), 0, g.stream, datt, att, a, a.scale);
  launched("attention softmax backward");
  for (int b = 0; b < a.B; b++)
    for (int j = 0; j < group; j++) {
      const size_t qat = (size_t)b * w3 + (size_t)j * D, kat = (size_t)b * w3 + (size_t)H * D;
      const float *q = qkv + qat, *k = qkv + kat, *ds = datt + ((size_t)b * H + j) * TT;
      // dq += dS k
      check_blas(g.lib.sgemm_strided_batched(g.blas, CUBLAS_OP_N, CUBLAS_OP_N, D, T, T, &one, k, (int)ldq, D, ds, T,
                                           group * TT, &one, dqkv + qat, (int)ldq, qstride, K),
                 "attention dq");
      // dk += dS^T q
      check_blas(g.lib.sgemm_strided_batched(g.blas, CUBLAS_OP_N, CUBLAS_OP_T, D, T, T, &one, q, (int)ldq, qstride, ds, T,
                                           group * TT, &one, dqkv + kat, (int)ldq, D, K),
                 "attention dk");
    }
}

void check_shape(const loom_attn_shape *s) {
  if (loom_attn_shape_valid(s)) return;
  fprintf(stderr, "loom: %s\n", LOOM_ATTN_SHAPE_RULE);
  abort();
}

void cuda_attention_forward(const loom_ops *be, float *out, float *lse, const float *qkv, const loom_attn_shape *s,
                            const loom_dropout *drop) {
  check_shape(s);
  Backend &g = ctx(be);
  if (g.attention == LOOM_CUDA_ATTENTION_CUBLAS || !flash_attention_fits(g, s->head_dim, loom_attn_v_dim(s)))
    cublas_attention_forward(g, out, lse, qkv, s, drop);
  else flash_attention_forward(g, out, lse, qkv, attn_args(s, drop), s->kv_heads);
}

void cuda_attention_backward(const loom_ops *be, float *dqkv, const float *dout, const float *out, const float *qkv,
                             const float *lse, const loom_attn_shape *s, const loom_dropout *drop) {
  check_shape(s);
  Backend &g = ctx(be);
  if (g.attention == LOOM_CUDA_ATTENTION_CUBLAS || !flash_attention_fits(g, s->head_dim, loom_attn_v_dim(s)))
    cublas_attention_backward(g, dqkv, dout, qkv, lse, s, drop);
  else flash_attention_backward(g, dqkv, dout, out, qkv, lse, attn_args(s, drop), s->kv_heads);
}

} // namespace loom_cuda
