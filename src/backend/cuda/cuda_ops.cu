// The CUDA backend's op table (see cuda_backend.h). Kernels follow the
// reference backend's semantics op for op; the shared arithmetic (GELU,
// Philox dropout masks) comes from backend/op_math.h, so masks are
// bit-identical to the CPU's.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>
#include <vector>
extern "C" {
#include "backend/op_math.h"
}
#include "backend/cuda/cuda_context.cuh"

namespace loom_cuda {

template <typename F> bool load(Blas &b, void *lib, const char *name, F *out) {
  *out = (F)dlsym(lib, name);
  if (!*out) snprintf(b.error, sizeof b.error, "cuBLAS lacks %s", name);
  return *out != nullptr;
}

// cuBLAS's entry points, or ok false and error saying why. dlopen counts
// references, so each context loading its own costs nothing after the first.
Blas load_blas() {
  Blas b;
  const char *names[] = {LOOM_CUBLAS_LIBRARY, "libcublas.so"};
  void *lib = nullptr;
  for (const char *name : names)
    if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
  if (!lib) {
    snprintf(b.error, sizeof b.error, "cannot load cuBLAS (%s): %s", names[0], dlerror());
    return b;
  }
  b.ok = load(b, lib, "cublasCreate_v2", &b.create) && load(b, lib, "cublasDestroy_v2", &b.destroy) &&
         load(b, lib, "cublasSetStream_v2", &b.set_stream) && load(b, lib, "cublasSetMathMode", &b.set_math_mode) &&
         load(b, lib, "cublasSgemm_v2", &b.sgemm) &&
         load(b, lib, "cublasSgemmStridedBatched", &b.sgemm_strided_batched) &&
         load(b, lib, "cublasGemmEx", &b.gemm_ex);
  b.gemm_grouped = (decltype(b.gemm_grouped))dlsym(lib, "cublasGemmGroupedBatchedEx"); /* optional */
  return b;
}

float *scratch(Backend &g, size_t floats) {
  return (float *)grow(g, g.scratch, g.scratch_bytes, floats * sizeof(float), "attention scratch");
}

constexpr int SUMSQ_BLOCKS = 256; // partial sums of sumsq and sign_pack

double *partials(Backend &g) {
  return (double *)grow(g, g.partials, g.partials_bytes, SUMSQ_BLOCKS * sizeof(double), "block sums");
}

struct Sum {
  template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Block-wide reduction of one value per thread (blockDim.x a multiple of 32,
// at most 1024); `identity` fills the lanes of missing warps. Every thread gets the result.
template <typename T, typename Op> __device__ T block_reduce(T v, Op op, T identity) {
  __shared__ T warp_part[32];
  __shared__ T total;
  for (int off = 16; off > 0; off /= 2) v = op(v, __shfl_down_sync(0xffffffffu, v, off));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_part[warp] = v;
  __syncthreads();
  v = threadIdx.x < (blockDim.x + 31) / 32 ? warp_part[threadIdx.x] : identity;
  if (warp == 0)
    for (int off = 16; off > 0; off /= 2) v = op(v, __shfl_down_sync(0xffffffffu, v, off));
  if (threadIdx.x == 0) total = v;
  __syncthreads();
  const T out = total;
  __syncthreads();
  return out;
}

template <typename T> __device__ T block_sum(T v) { return block_reduce(v, Sum(), T(0)); }
__device__ float block_max(float v) { return block_reduce(v, Max(), -INFINITY); }

// ---- matmul ----------------------------------------------------------------

__global__ void bias_add_kernel(float *out, const float *bias, int N, int OC) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < (size_t)N * OC) out[i] += bias[i % OC];
}

// dbias[o] += sum over n of dout[n, o]: one block per column.
__device__ __forceinline__ float widened(float x) { return x; }
__device__ __forceinline__ float widened(uint16_t x) { return loom_bf16_value(x); }

// dbias[o] += the sum of column o of dout[N, OC], fp32 or bf16 bits.
template <typename T>
__global__ void column_sum_kernel(float *dbias, const T *dout, int N, int OC) {
  const int o = blockIdx.x;
  float acc = 0.0f;
  for (int n = threadIdx.x; n < N; n += blockDim.x) acc += widened(dout[(size_t)n * OC + o]);
  acc = block_sum(acc);
  if (threadIdx.x == 0) dbias[o] += acc;
}

void cuda_bias_forward(const loom_ops *be, float *out, const float *bias, int N, int OC) {
  Backend &g = ctx(be);
  LAUNCH(bias_add_kernel, blocks_for((size_t)N * OC), THREADS, 0, g.stream, out, bias, N, OC);
  launched("bias_forward");
}

void cuda_bias_backward(const loom_ops *be, float *dbias, const float *dout, int N, int OC) {
  Backend &g = ctx(be);
  LAUNCH(column_sum_kernel, OC, THREADS, 0, g.stream, dbias, dout, N, OC);
  launched("bias_backward");
}

// The matmuls are column-major cuBLAS calls on row-major data: row-major
// out[N,OC] = inp[N,C] @ weight[OC,C]^T is column-major out^T = weight^T-view x inp.
// One GEMM c[m,n] (column-major, ldc m) += or = op(a) op(b), in fp32 or, with
// bf16 GEMMs on, from bf16 copies of a and b on tensor cores with fp32
// accumulation (cuBLAS's CUBLAS_COMPUTE_32F); c stays fp32 either way.
struct Operand {
  const float *x;
  size_t elems;
  int ld;
  const uint16_t *bits = nullptr; // a bf16 operand already in bits, read in place
};

// bf16 copies of up to two operands, in the context's operand buffer (an
// operand given in bits is read where it is).
void to_bf16_pair(Backend &g, const Operand &a, const Operand &b, const uint16_t **a16, const uint16_t **b16);

// c[m,n] (fp32, column-major, ldc m) = op(a) op(b) + beta c from bf16 a and b, accumulating in fp32.
void gemm_bf16(Backend &g, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const uint16_t *a, int lda,
               const uint16_t *b, int ldb, float beta, float *c, const char *what) {
  const float one = 1.0f;
  check_blas(g.lib.gemm_ex(g.blas, ta, tb, m, n, k, &one, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &beta, c, CUDA_R_32F, m,
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             what);
}

void gemm_f32(Backend &g, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const Operand &a,
              const Operand &b, float beta, float *c, const char *what) {
  const float one = 1.0f;
  if (!g.bf16_gemms) {
    check_blas(g.lib.sgemm(g.blas, ta, tb, m, n, k, &one, a.x, a.ld, b.x, b.ld, &beta, c, m), what);
    return;
  }
  const uint16_t *a16, *b16;
  to_bf16_pair(g, a, b, &a16, &b16);
  gemm_bf16(g, ta, tb, m, n, k, a16, a.ld, b16, b.ld, beta, c, what);
}

void cuda_matmul_forward(const loom_ops *be, float *out, const float *inp, const float *weight, const float *bias, int N, int C, int OC) {
  Backend &g = ctx(be);
  const Operand w = {weight, (size_t)OC * C, C}, x = {inp, (size_t)N * C, C};
  gemm_f32(g, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, w, x, 0.0f, out, "matmul_forward");
  if (bias) cuda_bias_forward(be, out, bias, N, OC);
}

void cuda_matmul_backward(const loom_ops *be, float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                          const float *weight, int N, int C, int OC) {
  Backend &g = ctx(be);
  const Operand w = {weight, (size_t)OC * C, C}, x = {inp, (size_t)N * C, C}, dy = {dout, (size_t)N * OC, OC};
  if (dinp) // dinp[N,C] += dout[N,OC] @ weight[OC,C]
    gemm_f32(g, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, w, dy, 1.0f, dinp, "matmul_backward dinp");
  if (dweight) // dweight[OC,C] += dout^T @ inp
    gemm_f32(g, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, x, dy, 1.0f, dweight, "matmul_backward dweight");
  if (dbias) cuda_bias_backward(be, dbias, dout, N, OC);
}

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
  __device__ const float *kv(const float *base, const AttnArgs &a, int t, int b, int part, int g) const {
    return base + ((size_t)t * a.B + b) * kvw + ((size_t)part * K + g) * a.D;
  }
};

inline BlockRows block_rows(const loom_attn_shape *s, int Tq, int Tk) {
  return BlockRows{Tq, Tk, s->kv_heads, loom_attn_qkv_width(s), 2 * (size_t)s->kv_heads * s->head_dim};
}

// A thread per dimension, rounded up to whole warps.
inline unsigned dim_threads(int D) { return (unsigned)((D + 31) / 32 * 32); }

__device__ inline float row_dot(const float *x, const float *y, int D) {
  const int d = threadIdx.x;
  return block_sum(d < D ? x[d] * y[d] : 0.0f);
}

__global__ void attention_block_forward_kernel(float *out, float *lse, const float *q, const float *kv, const int *pos,
                                               BlockRows r, AttnArgs a, bool first) {
  const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, d = threadIdx.x, D = a.D, g = h / (a.H / r.K);
  const int *k_pos = pos + r.Tq, qp = pos[t];
  const float scale = rsqrtf((float)D), *x = r.q(q, a, t, b, h);
  float *o = out + ((size_t)t * a.B + b) * a.H * D + (size_t)h * D, *l = lse + ((size_t)b * a.H + h) * r.Tq + t;
  const float old = first ? -INFINITY : *l;
  __syncthreads(); // every thread has read *l before thread 0 writes it
  float maxv = -INFINITY, sum = 0.0f, acc = 0.0f;
  for (int tk = 0; tk < r.Tk; tk++)
    if (k_pos[tk] <= qp) maxv = fmaxf(maxv, row_dot(x, r.kv(kv, a, tk, b, 0, g), D) * scale);
  if (maxv == -INFINITY) { // no key of this block is before the query
    if (first && d < D) o[d] = 0.0f;
    if (first && d == 0) *l = -INFINITY;
    return;
  }
  for (int tk = 0; tk < r.Tk; tk++)
    if (k_pos[tk] <= qp) sum += expf(row_dot(x, r.kv(kv, a, tk, b, 0, g), D) * scale - maxv);
  const float blk = maxv + logf(sum);
  for (int tk = 0; tk < r.Tk; tk++) {
    if (k_pos[tk] > qp) continue;
    const float p = expf(row_dot(x, r.kv(kv, a, tk, b, 0, g), D) * scale - blk) * keep_factor(a, b, h, qp, k_pos[tk]);
    if (d < D) acc += p * r.kv(kv, a, tk, b, 1, g)[d];
  }
  const float merged = old > blk ? old + log1pf(expf(blk - old)) : blk + log1pf(expf(old - blk));
  const float keep = old == -INFINITY ? 0.0f : expf(old - merged), add = expf(blk - merged);
  if (d < D) o[d] = old == -INFINITY ? add * acc : keep * o[d] + add * acc; /* o unread first: it may hold a NaN */
  if (d == 0) *l = merged;
}

// dq of one query row and head: its block's keys, p from the merged log-sum-exp, dS = p (dP keep - dout . out) scale.
__global__ void attention_block_dq_kernel(float *dq, const float *dout, const float *out, const float *q, const float *kv,
                                          const float *lse, const int *pos, BlockRows r, AttnArgs a) {
  const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, d = threadIdx.x, D = a.D, g = h / (a.H / r.K);
  const int *k_pos = pos + r.Tq, qp = pos[t];
  const float l = lse[((size_t)b * a.H + h) * r.Tq + t];
  if (l == -INFINITY) return;
  const float scale = rsqrtf((float)D), *x = r.q(q, a, t, b, h);
  const size_t at = ((size_t)t * a.B + b) * a.H * D + (size_t)h * D;
  const float delta = row_dot(dout + at, out + at, D);
  float acc = 0.0f;
  for (int tk = 0; tk < r.Tk; tk++) {
    if (k_pos[tk] > qp) continue;
    const float *k = r.kv(kv, a, tk, b, 0, g);
    const float p = expf(row_dot(x, k, D) * scale - l), keep = keep_factor(a, b, h, qp, k_pos[tk]);
    const float ds = p * (row_dot(dout + at, r.kv(kv, a, tk, b, 1, g), D) * keep - delta) * scale;
    if (d < D) acc += ds * k[d];
  }
  if (d < D) dq[((size_t)t * a.B + b) * r.w3 + (size_t)h * D + d] += acc;
}

// dk and dv of one key row and key/value head: every query row of the heads it serves that sees it.
__global__ void attention_block_dkv_kernel(float *dkv, const float *dout, const float *out, const float *q, const float *kv,
                                           const float *lse, const int *pos, BlockRows r, AttnArgs a) {
  const int tk = blockIdx.x, g = blockIdx.y, b = blockIdx.z, d = threadIdx.x, D = a.D, group = a.H / r.K;
  const int kp = pos[r.Tq + tk];
  const float scale = rsqrtf((float)D), *k = r.kv(kv, a, tk, b, 0, g), *v = r.kv(kv, a, tk, b, 1, g);
  float dk = 0.0f, dv = 0.0f;
  for (int h = g * group; h < (g + 1) * group; h++)
    for (int t = 0; t < r.Tq; t++) {
      const float l = lse[((size_t)b * a.H + h) * r.Tq + t];
      if (pos[t] < kp || l == -INFINITY) continue;
      const float *x = r.q(q, a, t, b, h);
      const size_t at = ((size_t)t * a.B + b) * a.H * D + (size_t)h * D;
      const float p = expf(row_dot(x, k, D) * scale - l), keep = keep_factor(a, b, h, pos[t], kp);
      const float ds = p * (row_dot(dout + at, v, D) * keep - row_dot(dout + at, out + at, D)) * scale;
      if (d < D) dv += p * keep * dout[at + d], dk += ds * x[d];
    }
  if (d < D) {
    dkv[((size_t)tk * a.B + b) * r.kvw + (size_t)g * D + d] += dk;
    dkv[((size_t)tk * a.B + b) * r.kvw + ((size_t)r.K + g) * D + d] += dv;
  }
}

void cuda_attention_block_forward(const loom_ops *be, float *out, float *lse, const float *q, const float *kv, int Tq, int Tk,
                                  const int *q_pos, const int *k_pos, const loom_attn_shape *s, const loom_dropout *drop,
                                  bool first) {
  Backend &g = ctx(be);
  check_shape(s);
  if (Tq == 0) return;
  const int *pos = device_positions(g, q_pos, Tq, k_pos, Tk);
  LAUNCH(attention_block_forward_kernel, dim3((unsigned)Tq, (unsigned)s->heads, (unsigned)s->B), dim_threads(s->head_dim), 0,
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
  LAUNCH(attention_block_dq_kernel, dim3((unsigned)Tq, (unsigned)s->heads, (unsigned)s->B), dim_threads(s->head_dim), 0,
         g.stream, dq, dout, out, q, kv, lse, pos, r, a);
  LAUNCH(attention_block_dkv_kernel, dim3((unsigned)Tk, (unsigned)s->kv_heads, (unsigned)s->B), dim_threads(s->head_dim), 0,
         g.stream, dkv, dout, out, q, kv, lse, pos, r, a);
  launched("attention_block_backward");
}

// ---- the experts' grouped GEMMs ----------------------------------------------

// One expert's product in a grouped GEMM: c[m,n] (column-major, ldc m) = beta c + op(a) op(b).
struct Group {
  int m, n, k;
  const float *a, *b;
  int lda, ldb;
  float *c;
};

// The groups as one cuBLAS grouped GEMM (cublasGemmGroupedBatchedEx), each
// a group of one: its operand pointers copied to the context's pointer
// buffer on the stream (cuBLAS reads them from the device), the rest from
// the host. fp32 operands and accumulation, as gemm_f32's sgemm.
void gemm_grouped(Backend &g, cublasOperation_t ta, cublasOperation_t tb, const std::vector<Group> &gs, float beta,
                  const char *what) {
  const int count = (int)gs.size();
  if (count == 0) return;
  std::vector<cublasOperation_t> opa(count, ta), opb(count, tb);
  std::vector<int> m(count), n(count), k(count), lda(count), ldb(count), ldc(count), one(count, 1);
  std::vector<float> alpha(count, 1.0f), betas(count, beta);
  std::vector<const void *> ptrs(3 * (size_t)count); // a's, b's, then c's
  for (int i = 0; i < count; i++) {
    m[i] = gs[i].m, n[i] = gs[i].n, k[i] = gs[i].k, lda[i] = gs[i].lda, ldb[i] = gs[i].ldb, ldc[i] = gs[i].m;
    ptrs[i] = gs[i].a, ptrs[count + i] = gs[i].b, ptrs[2 * (size_t)count + i] = gs[i].c;
  }
  const size_t bytes = ptrs.size() * sizeof(void *);
  void **dev = (void **)grow(g, g.pointers, g.pointer_bytes, bytes, "grouped GEMM pointers");
  check(cudaMemcpyAsync(dev, ptrs.data(), bytes, cudaMemcpyHostToDevice, g.stream), what); // staged: ptrs may go
  check_blas(g.lib.gemm_grouped(g.blas, opa.data(), opb.data(), m.data(), n.data(), k.data(), alpha.data(),
                                (const void *const *)dev, CUDA_R_32F, lda.data(), (const void *const *)(dev + count),
                                CUDA_R_32F, ldb.data(), betas.data(), dev + 2 * (size_t)count, CUDA_R_32F, ldc.data(),
                                count, one.data(), CUBLAS_COMPUTE_32F),
             what);
}

// Whether the experts' GEMMs go as one grouped GEMM: fp32 GEMMs and a cuBLAS that has it.
bool grouped(const Backend &g) { return g.lib.gemm_grouped && !g.bf16_gemms; }

// The experts with rows: each call of fn(e, first row) in expert order.
template <typename F> void for_experts(const int *counts, int experts, F fn) {
  size_t row = 0;
  for (int e = 0; e < experts; row += (size_t)counts[e], e++)
    if (counts[e] > 0) fn(e, row);
}

void cuda_grouped_matmul_forward(const loom_ops *be, float *out, const float *inp, const float *weight, const int *counts,
                                 int experts, int C, int OC) {
  Backend &g = ctx(be);
  if (!grouped(g)) {
    loom_grouped_matmul_by_expert(be, out, inp, weight, counts, experts, C, OC);
    return;
  }
  std::vector<Group> gs; // out_e^T[OC, N_e] = weight_e^T-view x inp_e, as cuda_matmul_forward
  for_experts(counts, experts, [&](int e, size_t row) {
    gs.push_back({OC, counts[e], C, weight + (size_t)e * OC * C, inp + row * C, C, C, out + row * OC});
  });
  gemm_grouped(g, CUBLAS_OP_T, CUBLAS_OP_N, gs, 0.0f, "grouped_matmul_forward");
}

void cuda_grouped_matmul_backward(const loom_ops *be, float *dinp, float *dweight, const float *dout, const float *inp,
                                  const float *weight, const int *counts, int experts, int C, int OC) {
  Backend &g = ctx(be);
  if (!grouped(g)) {
    loom_grouped_matmul_backward_by_expert(be, dinp, dweight, dout, inp, weight, counts, experts, C, OC);
    return;
  }
  std::vector<Group> gs;
  if (dinp) { // dinp_e[N_e,C] += dout_e[N_e,OC] @ weight_e[OC,C]
    for_experts(counts, experts, [&](int e, size_t row) {
      gs.push_back({C, counts[e], OC, weight + (size_t)e * OC * C, dout + row * OC, C, OC, dinp + row * C});
    });
    gemm_grouped(g, CUBLAS_OP_N, CUBLAS_OP_N, gs, 1.0f, "grouped_matmul_backward dinp");
  }
  gs.clear();
  if (dweight) { // dweight_e[OC,C] += dout_e^T @ inp_e
    for_experts(counts, experts, [&](int e, size_t row) {
      gs.push_back({C, OC, counts[e], inp + row * C, dout + row * OC, C, OC, dweight + (size_t)e * OC * C});
    });
    gemm_grouped(g, CUBLAS_OP_N, CUBLAS_OP_T, gs, 1.0f, "grouped_matmul_backward dweight");
  }
}

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

__global__ void swiglu_forward_kernel(float *out, const float *inp, int N, int F) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)N * F) return;
  const size_t n = i / F, f = i % F;
  const float *row = inp + n * 2 * F;
  out[i] = loom_silu_at(row[f]) * row[F + f];
}

__global__ void swiglu_backward_kernel(float *dinp, const float *dout, const float *inp, int N, int F) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)N * F) return;
  const size_t n = i / F, f = i % F;
  const float *row = inp + n * 2 * F;
  float *drow = dinp + n * 2 * F;
  drow[f] += dout[i] * row[F + f] * loom_silu_grad_at(row[f]);
  drow[F + f] += dout[i] * loom_silu_at(row[f]);
}

void cuda_swiglu_forward(const loom_ops *be, float *out, const float *inp, int N, int F) {
  Backend &g = ctx(be);
  LAUNCH(swiglu_forward_kernel, blocks_for((size_t)N * F), THREADS, 0, g.stream, out, inp, N, F);
  launched("swiglu_forward");
}

void cuda_swiglu_backward(const loom_ops *be, float *dinp, const float *dout, const float *inp, int N, int F) {
  Backend &g = ctx(be);
  LAUNCH(swiglu_backward_kernel, blocks_for((size_t)N * F), THREADS, 0, g.stream, dinp, dout, inp, N, F);
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
  const double a = sign * loom_rope_angle(pos_offset + t, p, D, rope);
  const float c = (float)cos(a), s = (float)sin(a);
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

// ---- general GEMM and Gram-Schmidt (gradient compression) -------------------------

// Row-major c[M,N] = alpha op(a) op(b) + beta c is column-major c^T = op(b)^T op(a)^T.
void cuda_gemm(const loom_ops *be, bool ta, bool tb, int M, int N, int K, float alpha, const float *a, const float *b,
               float beta, float *c) {
  Backend &g = ctx(be);
  if (M == 0 || N == 0) return;
  check_blas(g.lib.sgemm(g.blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, b,
                         tb ? K : N, a, ta ? M : K, &beta, c, N),
             "gemm");
}

// One block walks the columns in order, as the host version does; the dot
// products are block reductions in double.
__device__ double column_dot(const float *x, int n, int r, int a, int b) {
  double dot = 0.0;
  for (int k = threadIdx.x; k < n; k += blockDim.x) dot += (double)x[(size_t)k * r + a] * x[(size_t)k * r + b];
  return block_sum(dot);
}

__global__ void orthonormalize_kernel(float *x, int n, int r) {
  for (int j = 0; j < r; j++) {
    const double before = column_dot(x, n, r, j, j);
    for (int pass = 0; pass < 2; pass++)
      for (int i = 0; i < j; i++) {
        const double dot = column_dot(x, n, r, i, j);
        for (int k = threadIdx.x; k < n; k += blockDim.x) x[(size_t)k * r + j] -= (float)(dot * x[(size_t)k * r + i]);
        __syncthreads();
      }
    const double scale = loom_orthonormal_scale(before, column_dot(x, n, r, j, j));
    for (int k = threadIdx.x; k < n; k += blockDim.x) x[(size_t)k * r + j] = (float)(x[(size_t)k * r + j] * scale);
    __syncthreads();
  }
}

void cuda_orthonormalize(const loom_ops *be, float *x, int n, int r) {
  Backend &g = ctx(be);
  if (n == 0 || r == 0) return;
  LAUNCH(orthonormalize_kernel, 1, THREADS, 0, g.stream, x, n, r);
  launched("orthonormalize");
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
  for (int tk = threadIdx.x; tk <= tq; tk += blockDim.x) m = fmaxf(m, p[tk]);
  m = block_max(m);
  float s = 0.0f;
  for (int tk = threadIdx.x; tk <= tq; tk += blockDim.x) s += expf(p[tk] - m);
  s = block_sum(s);
  if (threadIdx.x == 0) lse[row] = m + logf(s);
  for (int tk = threadIdx.x; tk < a.T; tk += blockDim.x) {
    const float prob = tk <= tq ? expf(p[tk] - m) / s : 0.0f;
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
    const float prob = tk <= tq ? expf(p[tk] - l) : 0.0f;
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
    dot += p[tk] * dp[tk];
  }
  dot = block_sum(dot);
  for (int tk = threadIdx.x; tk < a.T; tk += blockDim.x) dp[tk] = tk <= tq ? p[tk] * (dp[tk] - dot) * scale : 0.0f;
}

unsigned row_threads(int T) { return T >= 256 ? 256u : (unsigned)((T + 31) / 32 * 32); }

// Grouped-query attention: query head h = g * group + j reads key/value head g.
// Each batched GEMM runs over the K key/value heads for one j, so its batch
// members write distinct heads; the j loop accumulates dk and dv in order.
// scores[b, h] = scale * q k^T for every (b, h), into att (column-major: k^T-view x q).
void attention_scores(Backend &g, float *att, const float *qkv, const loom_attn_shape *s) {
  const int T = s->T, H = s->heads, D = s->head_dim, K = s->kv_heads, group = H / K;
  const long long w3 = (long long)loom_attn_qkv_width(s), ldq = (long long)s->B * w3, TT = (long long)T * T;
  const float scale = 1.0f / sqrtf((float)D), zero = 0.0f;
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
  const int T = a.T, H = a.H, D = a.D, K = s->kv_heads, group = H / K;
  const long long w3 = (long long)loom_attn_qkv_width(s), ldq = (long long)a.B * w3, ldo = (long long)a.B * H * D,
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
      check_blas(g.lib.sgemm_strided_batched(g.blas, CUBLAS_OP_N, CUBLAS_OP_N, D, T, T, &one, v, (int)ldq, D,
                                           probs + ((size_t)b * H + j) * TT, T, group * TT, &zero,
                                           out + (size_t)b * H * D + (size_t)j * D, (int)ldo, (long long)group * D, K),
                 "attention output");
    }
}

void cublas_attention_backward(Backend &g, float *dqkv, const float *dout, const float *qkv, const float *lse,
                               const loom_attn_shape *s, const loom_dropout *drop) {
  if (no_rows(s)) return;
  const AttnArgs a = attn_args(s, drop);
  const int T = a.T, H = a.H, D = a.D, K = s->kv_heads, group = H / K;
  const long long w3 = (long long)loom_attn_qkv_width(s), ldq = (long long)a.B * w3, ldo = (long long)a.B * H * D,
                  TT = (long long)T * T, qstride = (long long)group * D;
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
      const float *v = qkv + vat, *dy = dout + (size_t)b * H * D + (size_t)j * D;
      float *dv = dqkv + vat, *dp = datt + ((size_t)b * H + j) * TT;
      // dP' = dy v^T (column-major: v^T-view x dy)
      check_blas(g.lib.sgemm_strided_batched(g.blas, CUBLAS_OP_T, CUBLAS_OP_N, T, T, D, &one, v, (int)ldq, D, dy, (int)ldo,
                                           qstride, &zero, dp, T, group * TT, K),
                 "attention dP");
      // dv += P'^T dy
      check_blas(g.lib.sgemm_strided_batched(g.blas, CUBLAS_OP_N, CUBLAS_OP_T, D, T, T, &one, dy, (int)ldo, qstride,
                                           probs + ((size_t)b * H + j) * TT, T, group * TT, &one, dv, (int)ldq, D, K),
                 "attention dv");
    }
  LAUNCH(softmax_backward_kernel, a.B * H * T, row_threads(T), 0, g.stream, datt, att, a, 1.0f / sqrtf((float)D));
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
  if (g.attention == LOOM_CUDA_ATTENTION_CUBLAS || !flash_attention_fits(g, s->head_dim))
    cublas_attention_forward(g, out, lse, qkv, s, drop);
  else flash_attention_forward(g, out, lse, qkv, attn_args(s, drop), s->kv_heads);
}

void cuda_attention_backward(const loom_ops *be, float *dqkv, const float *dout, const float *out, const float *qkv,
                             const float *lse, const loom_attn_shape *s, const loom_dropout *drop) {
  check_shape(s);
  Backend &g = ctx(be);
  if (g.attention == LOOM_CUDA_ATTENTION_CUBLAS || !flash_attention_fits(g, s->head_dim))
    cublas_attention_backward(g, dqkv, dout, qkv, lse, s, drop);
  else flash_attention_backward(g, dqkv, dout, out, qkv, lse, attn_args(s, drop), s->kv_heads);
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

// ---- bf16 ------------------------------------------------------------------------------

// The rounding is op_math.h's, shared with the CPU backends bit for bit.
__global__ void to_bf16_kernel(uint16_t *out, const float *in, size_t n) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = loom_bf16_round(in[i]);
}

__global__ void from_bf16_kernel(float *out, const uint16_t *in, size_t n) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = loom_bf16_value(in[i]);
}

__global__ void round_bf16_kernel(float *x, size_t n) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = loom_bf16_value(loom_bf16_round(x[i]));
}

void to_bf16_pair(Backend &g, const Operand &a, const Operand &b, const uint16_t **a16, const uint16_t **b16) {
  const size_t a_elems = a.bits ? 0 : a.elems, b_elems = b.bits ? 0 : b.elems;
  uint16_t *buf = (uint16_t *)grow(g, g.operands, g.operand_bytes, (a_elems + b_elems) * sizeof(uint16_t), "bf16 GEMM operands");
  if (a_elems) LAUNCH(to_bf16_kernel, blocks_for(a_elems), THREADS, 0, g.stream, buf, a.x, a_elems);
  if (b_elems) LAUNCH(to_bf16_kernel, blocks_for(b_elems), THREADS, 0, g.stream, buf + a_elems, b.x, b_elems);
  launched("bf16 GEMM operands");
  *a16 = a.bits ? a.bits : buf;
  *b16 = b.bits ? b.bits : buf + a_elems;
}

void cuda_round_bf16(const loom_ops *be, float *x, size_t n) {
  Backend &g = ctx(be);
  if (!n) return;
  LAUNCH(round_bf16_kernel, blocks_for(n), THREADS, 0, g.stream, x, n);
  launched("round_bf16");
}

void cuda_to_bf16(const loom_ops *be, uint16_t *out, const float *in, size_t n) {
  Backend &g = ctx(be);
  if (!n) return;
  LAUNCH(to_bf16_kernel, blocks_for(n), THREADS, 0, g.stream, out, in, n);
  launched("to_bf16");
}

void cuda_from_bf16(const loom_ops *be, float *out, const uint16_t *in, size_t n) {
  Backend &g = ctx(be);
  if (!n) return;
  LAUNCH(from_bf16_kernel, blocks_for(n), THREADS, 0, g.stream, out, in, n);
  launched("from_bf16");
}

// bf16 runs' linears: the weight is bf16 already; inp and dout are read in
// place when they are bits, else (bf16 values in fp32) get bf16 copies in the
// operand buffer, exactly.
static Operand operand_of(loom_bf16_operand x, size_t elems, int ld) {
  if (!loom_bf16_operand_set(x)) return Operand{nullptr, 0, 0};
  Operand o = {x.f32, elems, ld};
  o.bits = x.bf16;
  return o;
}

void cuda_matmul_forward_bf16(const loom_ops *be, float *out, loom_bf16_operand inp, const uint16_t *weight,
                              const float *bias, int N, int C, int OC) {
  Backend &g = ctx(be);
  const uint16_t *x16, *none;
  to_bf16_pair(g, operand_of(inp, (size_t)N * C, C), Operand{nullptr, 0, 0}, &x16, &none);
  gemm_bf16(g, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, weight, C, x16, C, 0.0f, out, "matmul_forward_bf16");
  if (bias) cuda_bias_forward(be, out, bias, N, OC);
}

void cuda_matmul_backward_bf16(const loom_ops *be, float *dinp, float *dweight, float *dbias, loom_bf16_operand dout,
                               loom_bf16_operand inp, const uint16_t *weight, int N, int C, int OC) {
  Backend &g = ctx(be);
  const Operand dy = operand_of(dout, (size_t)N * OC, OC);
  const Operand x = dweight ? operand_of(inp, (size_t)N * C, C) : Operand{nullptr, 0, 0};
  const uint16_t *dy16, *x16;
  to_bf16_pair(g, dy, x, &dy16, &x16);
  if (dinp) // dinp[N,C] += dout[N,OC] @ weight[OC,C]
    gemm_bf16(g, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, weight, C, dy16, OC, 1.0f, dinp, "matmul_backward_bf16 dinp");
  if (dweight) // dweight[OC,C] += dout^T @ inp
    gemm_bf16(g, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, x16, C, dy16, OC, 1.0f, dweight, "matmul_backward_bf16 dweight");
  if (dbias) {
    if (dout.bf16) LAUNCH(column_sum_kernel, OC, THREADS, 0, g.stream, dbias, dout.bf16, N, OC);
    else LAUNCH(column_sum_kernel, OC, THREADS, 0, g.stream, dbias, dout.f32, N, OC);
    launched("bias_backward");
  }
}

loom_ops make_ops() {
  loom_ops o;
  memset(&o, 0, sizeof o);
  o.name = "cuda";
  o.matmul_forward = cuda_matmul_forward;
  o.matmul_backward = cuda_matmul_backward;
  o.layernorm_forward = cuda_layernorm_forward;
  o.layernorm_backward = cuda_layernorm_backward;
  o.rmsnorm_forward = cuda_rmsnorm_forward;
  o.rmsnorm_backward = cuda_rmsnorm_backward;
  o.swiglu_forward = cuda_swiglu_forward;
  o.swiglu_backward = cuda_swiglu_backward;
  o.rope_forward = cuda_rope_forward;
  o.rope_backward = cuda_rope_backward;
  o.gelu_forward = cuda_gelu_forward;
  o.gelu_backward = cuda_gelu_backward;
  o.attention_forward = cuda_attention_forward;
  o.attention_backward = cuda_attention_backward;
  o.attention_block_forward = cuda_attention_block_forward;
  o.attention_block_backward = cuda_attention_block_backward;
  o.embedding_forward = cuda_embedding_forward;
  o.embedding_forward_bf16 = cuda_embedding_forward_bf16;
  o.embedding_backward = cuda_embedding_backward;
  o.position_forward = cuda_position_forward;
  o.position_backward = cuda_position_backward;
  o.bias_forward = cuda_bias_forward;
  o.bias_backward = cuda_bias_backward;
  o.logsumexp = cuda_logsumexp;
  o.pick_targets = cuda_pick_targets;
  o.crossentropy_backward = cuda_crossentropy_backward;
  o.crossentropy_losses = cuda_crossentropy_losses;
  o.exp_shifted = cuda_exp_shifted;
  o.log_shifted = cuda_log_shifted;
  o.argmax = cuda_argmax;
  o.add = cuda_add;
  o.accumulate = cuda_accumulate;
  o.sumsq = cuda_sumsq;
  o.sumsq_batch = cuda_sumsq_batch;
  o.gemm = cuda_gemm;
  o.orthonormalize = cuda_orthonormalize;
  o.sign_pack = cuda_sign_pack;
  o.sign_unpack_add = cuda_sign_unpack_add;
  o.grouped_matmul_forward = cuda_grouped_matmul_forward; /* one cuBLAS grouped GEMM over the experts with rows */
  o.grouped_matmul_backward = cuda_grouped_matmul_backward;
  o.rows_gather = cuda_rows_gather;
  o.rows_combine = cuda_rows_combine;
  o.rows_combine_backward = cuda_rows_combine_backward;
  o.dropout_forward = cuda_dropout;
  o.dropout_backward = cuda_dropout;
  o.to_bf16 = cuda_to_bf16;
  o.from_bf16 = cuda_from_bf16;
  o.round_bf16 = cuda_round_bf16;
  o.matmul_forward_bf16 = cuda_matmul_forward_bf16;
  o.matmul_backward_bf16 = cuda_matmul_backward_bf16;
  o.adamw = cuda_adamw;
  return o;
}

// The same ops, each followed by a wait for the stream: for models whose
// buffers are managed memory that host code also reads and writes between
// ops (loom_cuda_open(true)).
template <typename Sig, Sig F> struct Synced;
template <typename R, typename... A, R (*F)(const loom_ops *, A...)> struct Synced<R (*)(const loom_ops *, A...), F> {
  static R call(const loom_ops *be, A... a) {
    if constexpr (std::is_void_v<R>) {
      F(be, a...);
      host_wait(ctx(be), "synced op");
    } else {
      R r = F(be, a...);
      host_wait(ctx(be), "synced op");
      return r;
    }
  }
};
#define SYNCED(f) Synced<decltype(&f), &f>::call

loom_ops make_synced_ops() {
  loom_ops o = make_ops();
  o.name = "cuda-synced";
  o.matmul_forward = SYNCED(cuda_matmul_forward);
  o.matmul_backward = SYNCED(cuda_matmul_backward);
  o.layernorm_forward = SYNCED(cuda_layernorm_forward);
  o.layernorm_backward = SYNCED(cuda_layernorm_backward);
  o.gelu_forward = SYNCED(cuda_gelu_forward);
  o.gelu_backward = SYNCED(cuda_gelu_backward);
  o.rmsnorm_forward = SYNCED(cuda_rmsnorm_forward);
  o.rmsnorm_backward = SYNCED(cuda_rmsnorm_backward);
  o.swiglu_forward = SYNCED(cuda_swiglu_forward);
  o.swiglu_backward = SYNCED(cuda_swiglu_backward);
  o.rope_forward = SYNCED(cuda_rope_forward);
  o.rope_backward = SYNCED(cuda_rope_backward);
  o.attention_forward = SYNCED(cuda_attention_forward);
  o.attention_backward = SYNCED(cuda_attention_backward);
  o.attention_block_forward = SYNCED(cuda_attention_block_forward);
  o.attention_block_backward = SYNCED(cuda_attention_block_backward);
  o.embedding_forward = SYNCED(cuda_embedding_forward);
  o.embedding_forward_bf16 = SYNCED(cuda_embedding_forward_bf16);
  o.embedding_backward = SYNCED(cuda_embedding_backward);
  o.position_forward = SYNCED(cuda_position_forward);
  o.position_backward = SYNCED(cuda_position_backward);
  o.bias_forward = SYNCED(cuda_bias_forward);
  o.bias_backward = SYNCED(cuda_bias_backward);
  o.logsumexp = SYNCED(cuda_logsumexp);
  o.pick_targets = SYNCED(cuda_pick_targets);
  o.crossentropy_backward = SYNCED(cuda_crossentropy_backward);
  o.crossentropy_losses = SYNCED(cuda_crossentropy_losses);
  o.exp_shifted = SYNCED(cuda_exp_shifted);
  o.log_shifted = SYNCED(cuda_log_shifted);
  o.argmax = SYNCED(cuda_argmax);
  o.add = SYNCED(cuda_add);
  o.accumulate = SYNCED(cuda_accumulate);
  o.sumsq = cuda_sumsq;
  o.sumsq_batch = cuda_sumsq_batch; // waits already
  o.gemm = SYNCED(cuda_gemm);
  o.orthonormalize = SYNCED(cuda_orthonormalize);
  o.sign_pack = SYNCED(cuda_sign_pack);
  o.sign_unpack_add = SYNCED(cuda_sign_unpack_add);
  o.grouped_matmul_forward = SYNCED(cuda_grouped_matmul_forward);
  o.grouped_matmul_backward = SYNCED(cuda_grouped_matmul_backward);
  o.rows_gather = SYNCED(cuda_rows_gather);
  o.rows_combine = SYNCED(cuda_rows_combine);
  o.rows_combine_backward = SYNCED(cuda_rows_combine_backward);
  o.dropout_forward = SYNCED(cuda_dropout);
  o.dropout_backward = SYNCED(cuda_dropout);
  o.to_bf16 = SYNCED(cuda_to_bf16);
  o.from_bf16 = SYNCED(cuda_from_bf16);
  o.round_bf16 = SYNCED(cuda_round_bf16);
  o.matmul_forward_bf16 = SYNCED(cuda_matmul_forward_bf16);
  o.matmul_backward_bf16 = SYNCED(cuda_matmul_backward_bf16);
  o.adamw = SYNCED(cuda_adamw);
  return o;
}


// Opens a context on the calling thread's current device.
Backend *open_backend(bool synced) {
  Blas lib = load_blas();
  if (!lib.ok) {
    fprintf(stderr, "loom: %s\n", lib.error);
    abort();
  }
  Backend *g = new Backend;
  g->lib = lib;
  check(cudaGetDevice(&g->device), "cudaGetDevice");
  check(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking), "stream");
  check_blas(lib.create(&g->blas), "cublasCreate");
  check_blas(lib.set_stream(g->blas, g->stream), "cublasSetStream");
  check_blas(lib.set_math_mode(g->blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  g->mem = make_allocator(*g, synced);
  g->ops = synced ? make_synced_ops() : make_ops();
  g->ops.mem = &g->mem;
  g->ops.state = g;
  return g;
}

} // namespace loom_cuda

using namespace loom_cuda;

extern "C" {

bool loom_cuda_available(void) {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0 && load_blas().ok;
}

bool loom_cuda_emulated(void) {
#ifdef LOOM_CUDA_EMULATED // (the emulated GPU's cuda_runtime.h)
  return true;
#else
  return false;
#endif
}

void loom_cuda_unavailable_reason(char *out, size_t len) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  const Blas lib = e == cudaSuccess && count > 0 ? load_blas() : Blas{};
  snprintf(out, len, "%s",
           e != cudaSuccess ? cudaGetErrorString(e)
           : count == 0     ? "no CUDA device is visible to this process"
           : lib.ok         ? ""
                            : lib.error);
}

int loom_cuda_select_device(int ordinal) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return -1;
  check(cudaSetDevice(ordinal % count), "cudaSetDevice");
  return ordinal % count;
}

const loom_ops *loom_cuda_open(bool synced) { return &open_backend(synced)->ops; }

void loom_cuda_close(const loom_ops *be) {
  if (!be) return;
  Backend *g = &ctx(be);
  check(cudaStreamSynchronize(g->stream), "close"); // not host_wait: its hook's communicators may be gone
  g->lib.destroy(g->blas);
  loom_block_cache_delete(g->cache); // the scratch buffers, and any block still handed out
  cudaStreamDestroy(g->stream);
  delete g;
}

int loom_cuda_device(const loom_ops *be) { return ctx(be).device; }

void loom_cuda_set_tf32(const loom_ops *be, bool on) {
  Backend &g = ctx(be);
  check_blas(g.lib.set_math_mode(g.blas, on ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
}

void loom_cuda_set_bf16_gemms(const loom_ops *be, bool on) { ctx(be).bf16_gemms = on; }

void loom_cuda_set_attention(const loom_ops *be, loom_cuda_attention kind) { ctx(be).attention = kind; }

void loom_cuda_set_host_wait(const loom_ops *be, void (*wait)(void *stream, const char *what)) { ctx(be).wait_hook = wait; }

loom_block_cache_stats loom_cuda_memory_stats(const loom_ops *be) { return loom_block_cache_stats_of(ctx(be).cache); }

void *loom_cuda_stream(const loom_ops *be) { return ctx(be).stream; }

void loom_cuda_sync(const loom_ops *be) { host_wait(ctx(be), "sync"); }

void *loom_cuda_malloc(size_t bytes) {
  void *p = nullptr;
  check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
  return p;
}

void loom_cuda_free(void *p) { check(cudaFree(p), "cudaFree"); }

void loom_cuda_to_device(const loom_ops *be, void *dst, const void *src, size_t bytes) {
  Backend &g = ctx(be);
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g.stream), "to_device");
  host_wait(g, "to_device");
}

void loom_cuda_to_host(const loom_ops *be, void *dst, const void *src, size_t bytes) {
  Backend &g = ctx(be);
  copy_to_host(g, dst, src, bytes, "to_host");
}

} // extern "C"

// bf16 values in [-1, 1] from a hash of (seed, i), for the GEMM benchmark.
__global__ void bench_fill_kernel(uint16_t *x, size_t n, uint32_t seed) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  uint32_t h = (uint32_t)i * 2654435761u ^ seed * 40503u;
  h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
  const float v = (float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
  uint32_t bits;
  memcpy(&bits, &v, 4);
  x[i] = (uint16_t)(bits >> 16);
}

extern "C" {

double loom_cuda_bf16_gemm_tflops(const loom_ops *be, int m, int n, int k, int iters) {
  Backend &g = ctx(be);
  uint16_t *a = (uint16_t *)loom_cuda_malloc((size_t)m * k * 2), *b = (uint16_t *)loom_cuda_malloc((size_t)k * n * 2);
  float *c = (float *)loom_cuda_malloc((size_t)m * n * 4);
  /* Values in [-1, 1], not zeros: tensor cores draw less power multiplying zeros, which would flatter the peak. */
  LAUNCH(bench_fill_kernel, blocks_for((size_t)m * k), THREADS, 0, g.stream, a, (size_t)m * k, 1u);
  LAUNCH(bench_fill_kernel, blocks_for((size_t)k * n), THREADS, 0, g.stream, b, (size_t)k * n, 2u);
  launched("gemm bench fill");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  double best = 0.0;
  for (int it = -1; it < iters; it++) { // one warm-up
    check(cudaEventRecord(start, g.stream), "event");
    gemm_bf16(g, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, a, m, b, k, 0.0f, c, "gemm bench");
    check(cudaEventRecord(stop, g.stream), "event");
    check(cudaEventSynchronize(stop), "event");
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, start, stop), "event");
    const double tflops = 2.0 * m * n * k / (ms * 1e-3) / 1e12;
    if (it >= 0 && tflops > best) best = tflops;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  loom_cuda_free(a);
  loom_cuda_free(b);
  loom_cuda_free(c);
  return best;
}

void loom_cuda_device_name(const loom_ops *be, char *out, size_t len) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, ctx(be).device) != cudaSuccess) snprintf(out, len, "unknown CUDA device");
  else snprintf(out, len, "%s", prop.name);
}

double loom_cuda_bf16_peak_tflops(const loom_ops *be) {
  char name[256];
  loom_cuda_device_name(be, name, sizeof name);
  const bool hopper = strstr(name, "H100") || strstr(name, "H200") || strstr(name, "H800") || strstr(name, "GH200");
  if (hopper && strstr(name, "PCIe")) return 756.0; // the PCIe cards' lower clock and power
  if (hopper && strstr(name, "NVL")) return 835.0;  // H100 NVL, H200 NVL
  if (hopper) return 989.0;                         // SXM
  if (strstr(name, "A100") || strstr(name, "A800")) return 312.0;
  return 0.0;
}

} // extern "C"
