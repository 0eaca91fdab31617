// The CUDA backend's elementwise and row-wise kernels: norms, activations, RoPE, sign compression, the
// experts' rows, dropout, embeddings, cross-entropy and AdamW.
#include "backend/cuda/cuda_ops.cuh"

namespace loom_cuda {

// ---- layernorm ---------------------------------------------------------------

__global__ void layernorm_forward_kernel(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                                         const float *bias, int C, float eps) {
  const int n = blockIdx.x;
  const float *x = inp + (size_t)n * C;
  float s = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) s += x[c];
  const float m = block_sum(s) / C;
  float v = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) v += (x[c] - m) * (x[c] - m);
  const float r = rsqrtf(block_sum(v) / C + eps);
  for (int c = threadIdx.x; c < C; c += blockDim.x) out[(size_t)n * C + c] = (x[c] - m) * r * weight[c] + bias[c];
  if (threadIdx.x == 0) {
    mean[n] = m;
    rstd[n] = r;
  }
}

// The weight (and bias) grads of a norm, column by column, deterministic: a
// block owns 32 columns (a lane each, so a warp reads 32 consecutive
// floats), its 8 warps stride over the rows, and their partial sums are
// added in warp order. dweight[c] += sum_n (x - mean[n]) rstd[n] dy and
// dbias[c] += sum_n dy (mean, dbias NULL for RMSNorm, whose norm is x rstd).
constexpr int NORM_COLS = 32, NORM_WARPS = 8;
__global__ void norm_param_grad_kernel(float *dweight, float *dbias, const float *dout, const float *inp, const float *mean,
                                       const float *rstd, int N, int C) {
  __shared__ float part_w[NORM_WARPS][NORM_COLS], part_b[NORM_WARPS][NORM_COLS];
  const int c = blockIdx.x * NORM_COLS + threadIdx.x;
  float w = 0.0f, b = 0.0f;
  for (int n = threadIdx.y; n < N && c < C; n += NORM_WARPS) {
    const size_t i = (size_t)n * C + c;
    const float norm = (inp[i] - (mean ? mean[n] : 0.0f)) * rstd[n];
    w += norm * dout[i];
    b += dout[i];
  }
  part_w[threadIdx.y][threadIdx.x] = w;
  part_b[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  for (int k = 1; k < NORM_WARPS; k++) w += part_w[k][threadIdx.x], b += part_b[k][threadIdx.x];
  dweight[c] += w;
  if (dbias) dbias[c] += b;
}

void norm_param_grads(Backend &g, float *dweight, float *dbias, const float *dout, const float *inp, const float *mean,
                      const float *rstd, int N, int C, const char *what) {
  LAUNCH(norm_param_grad_kernel, (unsigned)((C + NORM_COLS - 1) / NORM_COLS), dim3(NORM_COLS, NORM_WARPS), 0, g.stream,
         dweight, dbias, dout, inp, mean, rstd, N, C);
  launched(what);
}

// The input grad, a row a block (the weight and bias grads: norm_param_grads).
__global__ void layernorm_backward_kernel(float *dinp, const float *dout, const float *inp, const float *weight,
                                          const float *mean, const float *rstd, int C) {
  const int n = blockIdx.x;
  const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
  float a = 0.0f, b = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float norm = (x[c] - mean[n]) * rstd[n], dnorm = weight[c] * dy[c];
    a += dnorm;
    b += dnorm * norm;
  }
  const float dnorm_mean = block_sum(a) / C, dnorm_norm_mean = block_sum(b) / C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float norm = (x[c] - mean[n]) * rstd[n], dnorm = weight[c] * dy[c];
    dinp[(size_t)n * C + c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd[n];
  }
}

void cuda_layernorm_forward(const loom_ops *be, float *out, float *mean, float *rstd, const float *inp, const float *weight,
                            const float *bias, int N, int C, float eps) {
  Backend &g = ctx(be);
  LAUNCH(layernorm_forward_kernel, N, THREADS, 0, g.stream, out, mean, rstd, inp, weight, bias, C, eps);
  launched("layernorm_forward");
}

void cuda_layernorm_backward(const loom_ops *be, float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                             const float *weight, const float *mean, const float *rstd, int N, int C) {
  Backend &g = ctx(be);
  LAUNCH(layernorm_backward_kernel, N, THREADS, 0, g.stream, dinp, dout, inp, weight, mean, rstd, C);
  launched("layernorm_backward");
  norm_param_grads(g, dweight, dbias, dout, inp, mean, rstd, N, C, "layernorm_backward weight grads");
}

// ---- RMSNorm, SwiGLU, RoPE ----------------------------------------------------------

__global__ void rmsnorm_forward_kernel(float *out, float *rstd, const float *inp, const float *weight, int C, float eps) {
  const int n = blockIdx.x;
  const float *x = inp + (size_t)n * C;
  float s = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) s += x[c] * x[c];
  const float r = rsqrtf(block_sum(s) / C + eps);
  for (int c = threadIdx.x; c < C; c += blockDim.x) out[(size_t)n * C + c] = x[c] * r * weight[c];
  if (threadIdx.x == 0) rstd[n] = r;
}

__global__ void rmsnorm_backward_kernel(float *dinp, const float *dout, const float *inp, const float *weight,
                                        const float *rstd, int C) {
  const int n = blockIdx.x;
  const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
  const float r = rstd[n];
  float d = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) d += weight[c] * dy[c] * x[c];
  const float k = r * r * r * block_sum(d) / C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) dinp[(size_t)n * C + c] += r * weight[c] * dy[c] - x[c] * k;
}

void cuda_rmsnorm_forward(const loom_ops *be, float *out, float *rstd, const float *inp, const float *weight, int N, int C,
                          float eps) {
  Backend &g = ctx(be);
  LAUNCH(rmsnorm_forward_kernel, N, THREADS, 0, g.stream, out, rstd, inp, weight, C, eps);
  launched("rmsnorm_forward");
}

void cuda_rmsnorm_backward(const loom_ops *be, float *dinp, float *dweight, const float *dout, const float *inp,
                           const float *weight, const float *rstd, int N, int C) {
  Backend &g = ctx(be);
  LAUNCH(rmsnorm_backward_kernel, N, THREADS, 0, g.stream, dinp, dout, inp, weight, rstd, C);
  launched("rmsnorm_backward");
  norm_param_grads(g, dweight, nullptr, dout, inp, nullptr, rstd, N, C, "rmsnorm_backward weight grads");
}

__global__ void swiglu_forward_kernel(float *out, const float *inp, int N, int F, loom_glu glu) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)N * F) return;
  const size_t n = i / F, f = i % F;
  const float *row = inp + n * 2 * F;
  out[i] = loom_glu_act(loom_glu_gate(row[f], glu), glu) * loom_glu_up(row[F + f], glu);
}

__global__ void swiglu_backward_kernel(float *dinp, const float *dout, const float *inp, int N, int F, loom_glu glu) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)N * F) return;
  const size_t n = i / F, f = i % F;
  const float *row = inp + n * 2 * F;
  float *drow = dinp + n * 2 * F;
  const float g = loom_glu_gate(row[f], glu);
  drow[f] += dout[i] * loom_glu_up(row[F + f], glu) * loom_glu_act_grad(g, glu) * loom_glu_gate_passes(row[f], glu);
  drow[F + f] += dout[i] * loom_glu_act(g, glu) * loom_glu_up_passes(row[F + f], glu);
}

void cuda_swiglu_forward(const loom_ops *be, float *out, const float *inp, int N, int F, loom_glu glu) {
  Backend &g = ctx(be);
  LAUNCH(swiglu_forward_kernel, blocks_for((size_t)N * F), THREADS, 0, g.stream, out, inp, N, F, glu);
  launched("swiglu_forward");
}

void cuda_swiglu_backward(const loom_ops *be, float *dinp, const float *dout, const float *inp, int N, int F, loom_glu glu) {
  Backend &g = ctx(be);
  LAUNCH(swiglu_backward_kernel, blocks_for((size_t)N * F), THREADS, 0, g.stream, dinp, dout, inp, N, F, glu);
  launched("swiglu_backward");
}

/* One thread per (row, head, pair). */
__global__ void rope_kernel(float *x, int T, int B, int stride, int heads, int D, int pos_offset, loom_rope rope, double sign) {
  const int half = D / 2;
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)T * B * heads * half) return;
  const int p = (int)(i % half);
  const size_t rh = i / half, row = rh / heads;
  const int t = (int)(row / B);
  float c, s;
  loom_rope_turn(pos_offset + t, p, D, rope, sign, &c, &s);
  float *x1 = x + row * stride + (rh % heads) * D + p, *x2 = x1 + half;
  const float u = *x1, v = *x2;
  *x1 = u * c - v * s;
  *x2 = v * c + u * s;
}

void cuda_rope_forward(const loom_ops *be, float *x, int T, int B, int stride, int heads, int D, int pos_offset, loom_rope rope) {
  Backend &g = ctx(be);
  LAUNCH(rope_kernel, blocks_for((size_t)T * B * heads * (D / 2)), THREADS, 0, g.stream, x, T, B, stride, heads, D, pos_offset,
                                                                                   rope, 1.0);
  launched("rope_forward");
}

void cuda_rope_backward(const loom_ops *be, float *dx, int T, int B, int stride, int heads, int D, int pos_offset,
                        loom_rope rope) {
  Backend &g = ctx(be);
  LAUNCH(rope_kernel, blocks_for((size_t)T * B * heads * (D / 2)), THREADS, 0, g.stream, dx, T, B, stride, heads, D,
                                                                                   pos_offset, rope, -1.0);
  launched("rope_backward");
}

// ---- elementwise ---------------------------------------------------------------

__global__ void gelu_forward_kernel(float *out, const float *inp, size_t n) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = loom_gelu_value_at(inp[i]);
}

__global__ void gelu_backward_kernel(float *dinp, const float *dout, const float *inp, size_t n) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dinp[i] += loom_gelu_grad_at(inp[i]) * dout[i];
}

__global__ void add_kernel(float *out, const float *a, const float *b, size_t n) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

__global__ void accumulate_kernel(float *acc, const float *x, size_t n) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) acc[i] += x[i];
}

__global__ void sumsq_kernel(double *partials, const float *x, size_t n) {
  double acc = 0.0;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    acc += (double)x[i] * x[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

void cuda_gelu_forward(const loom_ops *be, float *out, const float *inp, size_t n) {
  Backend &g = ctx(be);
  if (!n) return;
  LAUNCH(gelu_forward_kernel, blocks_for(n), THREADS, 0, g.stream, out, inp, n);
  launched("gelu_forward");
}
void cuda_gelu_backward(const loom_ops *be, float *dinp, const float *dout, const float *inp, size_t n) {
  Backend &g = ctx(be);
  if (!n) return;
  LAUNCH(gelu_backward_kernel, blocks_for(n), THREADS, 0, g.stream, dinp, dout, inp, n);
  launched("gelu_backward");
}
void cuda_add(const loom_ops *be, float *out, const float *a, const float *b, size_t n) {
  Backend &g = ctx(be);
  if (!n) return;
  LAUNCH(add_kernel, blocks_for(n), THREADS, 0, g.stream, out, a, b, n);
  launched("add");
}
void cuda_accumulate(const loom_ops *be, float *acc, const float *x, size_t n) {
  Backend &g = ctx(be);
  if (!n) return;
  LAUNCH(accumulate_kernel, blocks_for(n), THREADS, 0, g.stream, acc, x, n);
  launched("accumulate");
}

// The blocks summing n squares: one per THREADS elements up to SUMSQ_BLOCKS
// (the blocks past an array's end would only add zeros, exactly).
unsigned sumsq_blocks(size_t n) { return n < (size_t)SUMSQ_BLOCKS * THREADS ? blocks_for(n) : SUMSQ_BLOCKS; }

// Every array's block sums into scratch, then one copy and one host wait,
// each array's blocks added in order (sumsq is a batch of one).
void cuda_sumsq_batch(const loom_ops *be, const float *const *x, const size_t *n, int count, double *out) {
  Backend &g = ctx(be);
  if (count <= 0) return;
  const size_t bytes = (size_t)count * SUMSQ_BLOCKS * sizeof(double);
  double *parts = (double *)grow(g, g.scratch, g.scratch_bytes, bytes, "sumsq_batch");
  for (int i = 0; i < count; i++) LAUNCH(sumsq_kernel, sumsq_blocks(n[i]), THREADS, 0, g.stream, parts + (size_t)i * SUMSQ_BLOCKS, x[i], n[i]);
  launched("sumsq_batch");
  double *host = (double *)malloc(bytes);
  if (!host) {
    fprintf(stderr, "loom: out of host memory summing squares\n");
    abort();
  }
  copy_to_host(g, host, parts, bytes, "sumsq_batch");
  for (int i = 0; i < count; i++) {
    double total = 0.0;
    for (unsigned b = 0; b < sumsq_blocks(n[i]); b++) total += host[(size_t)i * SUMSQ_BLOCKS + b];
    out[i] = total;
  }
  free(host);
}

double cuda_sumsq(const loom_ops *be, const float *x, size_t n) {
  double total = 0.0;
  if (n) cuda_sumsq_batch(be, &x, &n, 1, &total);
  return total;
}

// ---- scaled sign compression -----------------------------------------------------

__global__ void abs_sum_kernel(double *partials, const float *x, size_t n) {
  double acc = 0.0;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    acc += fabs((double)x[i]);
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// One block adds the partials in order and stores the mean as msg[0]'s bits.
__global__ void sign_mean_kernel(uint32_t *msg, const double *partials, int count, size_t n) {
  if (threadIdx.x != 0) return;
  double total = 0.0;
  for (int i = 0; i < count; i++) total += partials[i];
  msg[0] = __float_as_uint(n ? (float)(total / (double)n) : 0.0f);
}

// A warp's ballot is one word of signs (thread i of word w is element 32 w + i).
__global__ void sign_bits_kernel(uint32_t *msg, const float *x, size_t n) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned bits = __ballot_sync(0xffffffffu, i < n && x[i] >= 0.0f);
  if (i % 32 == 0 && i < n) msg[1 + i / 32] = bits;
}

void cuda_sign_pack(const loom_ops *be, uint32_t *msg, const float *x, size_t n) {
  Backend &g = ctx(be);
  LAUNCH(abs_sum_kernel, SUMSQ_BLOCKS, THREADS, 0, g.stream, partials(g), x, n);
  LAUNCH(sign_mean_kernel, 1, 32, 0, g.stream, msg, (double *)g.partials, SUMSQ_BLOCKS, n);
  if (n) LAUNCH(sign_bits_kernel, blocks_for(n), THREADS, 0, g.stream, msg, x, n);
  launched("sign_pack");
}

__global__ void sign_unpack_add_kernel(float *y, const uint32_t *msg, size_t n, float weight) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float step = weight * __uint_as_float(msg[0]);
  y[i] += (msg[1 + i / 32] >> (i % 32) & 1u) ? step : -step;
}

void cuda_sign_unpack_add(const loom_ops *be, float *y, const uint32_t *msg, size_t n, float weight) {
  Backend &g = ctx(be);
  if (!n) return;
  LAUNCH(sign_unpack_add_kernel, blocks_for(n), THREADS, 0, g.stream, y, msg, n, weight);
  launched("sign_unpack_add");
}

// ---- mixture-of-experts rows -----------------------------------------------------
// One thread per element; a combine's element sums its k terms in order and
// its backward's dot product runs over C in order, as the reference does.

__global__ void rows_gather_kernel(float *out, const float *x, const int *rows, int M, int C) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)M * C) return;
  out[i] = x[(size_t)rows[i / C] * C + i % C];
}

__global__ void rows_combine_kernel(float *y, const float *x, const int *slots, const float *w, int N, int k, int C) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)N * C) return;
  const size_t n = i / C, c = i % C;
  float acc = 0.0f;
  for (int j = 0; j < k; j++) {
    const int s = slots[n * k + j];
    if (s >= 0) acc += (w ? w[n * k + j] : 1.0f) * x[(size_t)s * C + c];
  }
  y[i] = acc;
}

__global__ void rows_scatter_kernel(float *dx, const float *dy, const int *slots, const float *w, int N, int k, int C) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)N * k * C) return;
  const size_t nj = i / C, c = i % C;
  const int s = slots[nj];
  if (s >= 0) dx[(size_t)s * C + c] = w[nj] * dy[(nj / k) * C + c];
}

__global__ void rows_weight_grad_kernel(float *dw, const float *dy, const float *x, const int *slots, int N, int k, int C) {
  const size_t nj = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (nj >= (size_t)N * k) return;
  const int s = slots[nj];
  float dot = 0.0f;
  for (int c = 0; s >= 0 && c < C; c++) dot += dy[(nj / k) * C + c] * x[(size_t)s * C + c];
  dw[nj] = dot;
}

void cuda_rows_gather(const loom_ops *be, float *out, const float *x, const int *rows, int M, int C) {
  Backend &g = ctx(be);
  LAUNCH(rows_gather_kernel, blocks_for((size_t)M * C), THREADS, 0, g.stream, out, x, rows, M, C);
  launched("rows_gather");
}

void cuda_rows_combine(const loom_ops *be, float *y, const float *x, const int *slots, const float *w, int N, int k, int C) {
  Backend &g = ctx(be);
  LAUNCH(rows_combine_kernel, blocks_for((size_t)N * C), THREADS, 0, g.stream, y, x, slots, w, N, k, C);
  launched("rows_combine");
}

void cuda_rows_combine_backward(const loom_ops *be, float *dx, float *dw, const float *dy, const float *x, const int *slots,
                                const float *w, int N, int k, int C) {
  Backend &g = ctx(be);
  LAUNCH(rows_scatter_kernel, blocks_for((size_t)N * k * C), THREADS, 0, g.stream, dx, dy, slots, w, N, k, C);
  if (dw) LAUNCH(rows_weight_grad_kernel, blocks_for((size_t)N * k), THREADS, 0, g.stream, dw, dy, x, slots, N, k, C);
  launched("rows_combine_backward");
}

// ---- dropout ---------------------------------------------------------------------

struct DropoutArgs {
  float p;
  uint64_t seed, stream;
  int64_t sample_offset;
  int seq_offset, seq_total, cp, cp_rank;
};

DropoutArgs dropout_args(const loom_dropout *d) {
  return DropoutArgs{d->p, d->seed, d->stream, d->sample_offset, d->seq_offset, d->seq_total, d->cp, d->cp_rank};
}

__global__ void dropout_kernel(float *x, int T, int B, int C, DropoutArgs d) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)T * B * C) return;
  const int c = (int)(i % C), b = (int)(i / C % B), t = (int)(i / ((size_t)C * B));
  const uint64_t index = loom_dropout_index_at(d.sample_offset, d.seq_offset, d.seq_total, d.cp, d.cp_rank, t, b, c, T, C);
  x[i] = loom_dropout_keep_at(d.p, d.seed, d.stream, index) ? x[i] / (1.0f - d.p) : 0.0f;
}

void cuda_dropout(const loom_ops *be, float *x, int T, int B, int C, const loom_dropout *d) {
  Backend &g = ctx(be);
  if (!d || d->p <= 0.0f || (size_t)T * B * C == 0) return;
  LAUNCH(dropout_kernel, blocks_for((size_t)T * B * C), THREADS, 0, g.stream, x, T, B, C, dropout_args(d));
  launched("dropout");
}

// ---- embedding and positions ---------------------------------------------------------

__global__ void embedding_forward_kernel(float *out, const int *tokens, const float *wte, int vocab_start, int rows,
                                         int N, int C) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)N * C) return;
  const int n = (int)(i / C), c = (int)(i % C), tok = tokens[n];
  out[i] = tok >= vocab_start && tok < vocab_start + rows ? wte[(size_t)(tok - vocab_start) * C + c] : 0.0f;
}

__global__ void embedding_forward_bf16_kernel(float *out, const int *tokens, const uint16_t *wte, int vocab_start,
                                              int rows, int N, int C) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)N * C) return;
  const int n = (int)(i / C), c = (int)(i % C), tok = tokens[n];
  out[i] = tok >= vocab_start && tok < vocab_start + rows ? loom_bf16_value(wte[(size_t)(tok - vocab_start) * C + c]) : 0.0f;
}

__global__ void embedding_backward_kernel(float *dwte, const float *dout, const int *tokens, int vocab_start, int rows,
                                          int N, int C) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)N * C) return;
  const int n = (int)(i / C), c = (int)(i % C), tok = tokens[n];
  if (tok >= vocab_start && tok < vocab_start + rows) atomicAdd(&dwte[(size_t)(tok - vocab_start) * C + c], dout[i]);
}

__global__ void position_forward_kernel(float *out, const float *wpe, int T, int B, int C, int pos_offset) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)T * B * C) return;
  const int c = (int)(i % C), t = (int)(i / ((size_t)C * B));
  out[i] += wpe[(size_t)(pos_offset + t) * C + c];
}

// One thread per (t, c), summing over the batch: deterministic, no atomics.
__global__ void position_backward_kernel(float *dwpe, const float *dout, int T, int B, int C, int pos_offset) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)T * C) return;
  const int t = (int)(i / C), c = (int)(i % C);
  float acc = 0.0f;
  for (int b = 0; b < B; b++) acc += dout[((size_t)t * B + b) * C + c];
  dwpe[(size_t)(pos_offset + t) * C + c] += acc;
}

void cuda_embedding_forward(const loom_ops *be, float *out, const int *tokens, const float *wte, int vocab_start, int rows, int T, int B,
                            int C) {
  Backend &g = ctx(be);
  LAUNCH(embedding_forward_kernel, blocks_for((size_t)T * B * C), THREADS, 0, g.stream, out, tokens, wte, vocab_start, rows,
                                                                                   T * B, C);
  launched("embedding_forward");
}
void cuda_embedding_forward_bf16(const loom_ops *be, float *out, const int *tokens, const uint16_t *wte, int vocab_start,
                                 int rows, int T, int B, int C) {
  Backend &g = ctx(be);
  LAUNCH(embedding_forward_bf16_kernel, blocks_for((size_t)T * B * C), THREADS, 0, g.stream, out, tokens, wte, vocab_start,
                                                                                        rows, T * B, C);
  launched("embedding_forward_bf16");
}
void cuda_embedding_backward(const loom_ops *be, float *dwte, const float *dout, const int *tokens, int vocab_start, int rows, int T, int B,
                             int C) {
  Backend &g = ctx(be);
  LAUNCH(embedding_backward_kernel, blocks_for((size_t)T * B * C), THREADS, 0, g.stream, dwte, dout, tokens, vocab_start,
                                                                                    rows, T * B, C);
  launched("embedding_backward");
}
void cuda_position_forward(const loom_ops *be, float *out, const float *wpe, int T, int B, int C, int pos_offset) {
  Backend &g = ctx(be);
  LAUNCH(position_forward_kernel, blocks_for((size_t)T * B * C), THREADS, 0, g.stream, out, wpe, T, B, C, pos_offset);
  launched("position_forward");
}
void cuda_position_backward(const loom_ops *be, float *dwpe, const float *dout, int T, int B, int C, int pos_offset) {
  Backend &g = ctx(be);
  LAUNCH(position_backward_kernel, blocks_for((size_t)T * C), THREADS, 0, g.stream, dwpe, dout, T, B, C, pos_offset);
  launched("position_backward");
}

// ---- cross-entropy pieces ------------------------------------------------------------

__global__ void logsumexp_kernel(float *lse, const float *logits, int V, int width) {
  const float *z = logits + (size_t)blockIdx.x * width;
  float m = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, z[v]);
  m = block_max(m);
  float s = 0.0f;
  for (int v = threadIdx.x; v < V; v += blockDim.x) s += expf(z[v] - m);
  s = block_sum(s);
  if (threadIdx.x == 0) lse[blockIdx.x] = V > 0 ? m + logf(s) : -INFINITY;
}

__global__ void pick_targets_kernel(float *picked, const float *logits, const int *targets, int vocab_start, int N, int V,
                                    int width) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const int col = targets[n] - vocab_start;
  picked[n] = targets[n] >= 0 && col >= 0 && col < V ? logits[(size_t)n * width + col] : 0.0f;
}

__global__ void crossentropy_backward_kernel(float *dlogits, const float *logits, const float *lse, const int *targets,
                                             int vocab_start, float dloss, int N, int V, int width) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)N * width) return;
  const int n = (int)(i / width), v = (int)(i % width);
  const float prob = expf(logits[i] - lse[n]), onehot = vocab_start + v == targets[n] ? 1.0f : 0.0f;
  dlogits[i] = targets[n] < 0 || v >= V ? 0.0f : dloss * (prob - onehot);
}

// One block per row: the first column of the largest value.
__global__ void argmax_kernel(float *val, int *idx, const float *logits, int V, int width) {
  const float *z = logits + (size_t)blockIdx.x * width;
  float best = -INFINITY;
  int at = V;
  for (int v = threadIdx.x; v < V; v += blockDim.x)
    if (z[v] > best) best = z[v], at = v;
  const float top = block_max(best);
  __shared__ int first;
  if (threadIdx.x == 0) first = V;
  __syncthreads();
  if (best == top && V > 0) atomicMin(&first, at);
  __syncthreads();
  if (threadIdx.x == 0) { // no value above -inf (all NaN or -inf): element 0, as loom_row_argmax; never z[V]
    const int at_first = first < V ? first : V > 0 ? 0 : -1;
    idx[blockIdx.x] = at_first;
    val[blockIdx.x] = at_first >= 0 ? z[at_first] : -INFINITY;
  }
}

void cuda_logsumexp(const loom_ops *be, float *lse, const float *logits, int N, int V, int width) {
  Backend &g = ctx(be);
  LAUNCH(logsumexp_kernel, N, THREADS, 0, g.stream, lse, logits, V, width);
  launched("logsumexp");
}
void cuda_pick_targets(const loom_ops *be, float *picked, const float *logits, const int *targets, int vocab_start, int N, int V, int width) {
  Backend &g = ctx(be);
  LAUNCH(pick_targets_kernel, blocks_for(N), THREADS, 0, g.stream, picked, logits, targets, vocab_start, N, V, width);
  launched("pick_targets");
}
void cuda_crossentropy_backward(const loom_ops *be, float *dlogits, const float *logits, const float *lse, const int *targets,
                                int vocab_start, float dloss, int N, int V, int width) {
  Backend &g = ctx(be);
  LAUNCH(crossentropy_backward_kernel, blocks_for((size_t)N * width), THREADS, 0, g.stream, dlogits, logits, lse, targets,
                                                                                       vocab_start, dloss, N, V, width);
  launched("crossentropy_backward");
}
void cuda_argmax(const loom_ops *be, float *val, int *idx, const float *logits, int N, int V, int width) {
  Backend &g = ctx(be);
  LAUNCH(argmax_kernel, N, THREADS, 0, g.stream, val, idx, logits, V, width);
  launched("argmax");
}

__global__ void crossentropy_losses_kernel(float *losses, const float *lse, const float *picked, const int *targets,
                                           int N) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n < N) losses[n] = targets[n] < 0 ? 0.0f : lse[n] - picked[n];
}
__global__ void exp_shifted_kernel(float *x, const float *shift, size_t n) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = expf(x[i] - shift[i]);
}
__global__ void log_shifted_kernel(float *x, const float *shift, size_t n) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = shift[i] + logf(x[i]);
}
void cuda_crossentropy_losses(const loom_ops *be, float *losses, const float *lse, const float *picked, const int *targets, int N) {
  Backend &g = ctx(be);
  LAUNCH(crossentropy_losses_kernel, blocks_for(N), THREADS, 0, g.stream, losses, lse, picked, targets, N);
  launched("crossentropy_losses");
}
void cuda_exp_shifted(const loom_ops *be, float *x, const float *shift, size_t n) {
  Backend &g = ctx(be);
  if (n == 0) return;
  LAUNCH(exp_shifted_kernel, blocks_for(n), THREADS, 0, g.stream, x, shift, n);
  launched("exp_shifted");
}
void cuda_log_shifted(const loom_ops *be, float *x, const float *shift, size_t n) {
  Backend &g = ctx(be);
  if (n == 0) return;
  LAUNCH(log_shifted_kernel, blocks_for(n), THREADS, 0, g.stream, x, shift, n);
  launched("log_shifted");
}

// ---- AdamW on fp32 master weights -----------------------------------------------------

__global__ void adamw_kernel(float *param, const float *grad, float *m, float *v, uint16_t *compute, size_t n, float lr,
                             float beta1, float beta2, float eps, float wd, float c1, float c2, float gs) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float gi = grad[i] * gs;
  const float mi = beta1 * m[i] + (1.0f - beta1) * gi, vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
  m[i] = mi;
  v[i] = vi;
  param[i] -= lr * ((mi / c1) / (sqrtf(vi / c2) + eps) + wd * param[i]);
  if (compute) compute[i] = loom_bf16_round(param[i]);
}

void cuda_adamw(const loom_ops *be, float *param, const float *grad, float *m, float *v, uint16_t *compute, size_t n,
                const loom_adamw_args *a) {
  Backend &g = ctx(be);
  if (!n) return;
  const float c1 = (float)(1.0 - pow(a->beta1, a->step)), c2 = (float)(1.0 - pow(a->beta2, a->step));
  LAUNCH(adamw_kernel, blocks_for(n), THREADS, 0, g.stream, param, grad, m, v, compute, n, a->lr, a->beta1, a->beta2, a->eps,
                                                        a->weight_decay, c1, c2, a->grad_scale);
  launched("adamw");
}

} // namespace loom_cuda
