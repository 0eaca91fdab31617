// The CUDA backend's GEMMs: matmuls (fp32 and bf16), the experts' grouped GEMMs, the general GEMM and
// Gram-Schmidt of gradient compression, and bf16 conversions.
#include "backend/cuda/cuda_ops.cuh"

namespace loom_cuda {

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

} // namespace loom_cuda
