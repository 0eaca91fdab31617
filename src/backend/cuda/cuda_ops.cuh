// What the CUDA backend's op files share (cuda_ops.cu, cuda_gemm.cu,
// cuda_attention.cu, cuda_kernels.cu): block reductions, the context's
// work buffers, and every op the table in cuda_ops.cu points at.
#ifndef LOOM_CUDA_OPS_CUH
#define LOOM_CUDA_OPS_CUH

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

constexpr int SUMSQ_BLOCKS = 256; // partial sums of sumsq and sign_pack

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
__device__ inline float block_max(float v) { return block_reduce(v, Max(), -INFINITY); }

void cuda_bias_forward(const loom_ops *be, float *out, const float *bias, int N, int OC);
void cuda_bias_backward(const loom_ops *be, float *dbias, const float *dout, int N, int OC);
void gemm_bf16(Backend &g, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const uint16_t *a, int lda, const uint16_t *b, int ldb, float beta, float *c, const char *what);
void cuda_matmul_forward(const loom_ops *be, float *out, const float *inp, const float *weight, const float *bias, int N, int C, int OC);
void cuda_matmul_backward(const loom_ops *be, float *dinp, float *dweight, float *dbias, const float *dout, const float *inp, const float *weight, int N, int C, int OC);
void cuda_grouped_matmul_forward(const loom_ops *be, float *out, const float *inp, const float *weight, const int *counts, int experts, int C, int OC);
void cuda_grouped_matmul_backward(const loom_ops *be, float *dinp, float *dweight, const float *dout, const float *inp, const float *weight, const int *counts, int experts, int C, int OC);
void cuda_gemm(const loom_ops *be, bool ta, bool tb, int M, int N, int K, float alpha, const float *a, const float *b, float beta, float *c);
void cuda_orthonormalize(const loom_ops *be, float *x, int n, int r);
void cuda_round_bf16(const loom_ops *be, float *x, size_t n);
void cuda_to_bf16(const loom_ops *be, uint16_t *out, const float *in, size_t n);
void cuda_from_bf16(const loom_ops *be, float *out, const uint16_t *in, size_t n);
void cuda_matmul_forward_bf16(const loom_ops *be, float *out, loom_bf16_operand inp, const uint16_t *weight, const float *bias, int N, int C, int OC);
void cuda_matmul_backward_bf16(const loom_ops *be, float *dinp, float *dweight, float *dbias, loom_bf16_operand dout, loom_bf16_operand inp, const uint16_t *weight, int N, int C, int OC);
void cuda_attention_block_forward(const loom_ops *be, float *out, float *lse, const float *q, const float *kv, int Tq, int Tk, const int *q_pos, const int *k_pos, const loom_attn_shape *s, const loom_dropout *drop, bool first);
void cuda_attention_sink_forward(const loom_ops *be, float *out, float *lse, const float *sinks, const loom_attn_shape *s);
void cuda_attention_sink_backward(const loom_ops *be, float *dsinks, const float *dout, const float *out, const float *lse, const float *sinks, const loom_attn_shape *s);
void cuda_attention_block_backward(const loom_ops *be, float *dq, float *dkv, const float *dout, const float *out, const float *q, const float *kv, int Tq, int Tk, const int *q_pos, const int *k_pos, const float *lse, const loom_attn_shape *s, const loom_dropout *drop);
void cuda_attention_forward(const loom_ops *be, float *out, float *lse, const float *qkv, const loom_attn_shape *s, const loom_dropout *drop);
void cuda_attention_backward(const loom_ops *be, float *dqkv, const float *dout, const float *out, const float *qkv, const float *lse, const loom_attn_shape *s, const loom_dropout *drop);
void cuda_layernorm_forward(const loom_ops *be, float *out, float *mean, float *rstd, const float *inp, const float *weight, const float *bias, int N, int C, float eps);
void cuda_layernorm_backward(const loom_ops *be, float *dinp, float *dweight, float *dbias, const float *dout, const float *inp, const float *weight, const float *mean, const float *rstd, int N, int C);
void cuda_rmsnorm_forward(const loom_ops *be, float *out, float *rstd, const float *inp, const float *weight, int N, int C, float eps);
void cuda_rmsnorm_backward(const loom_ops *be, float *dinp, float *dweight, const float *dout, const float *inp, const float *weight, const float *rstd, int N, int C);
void cuda_swiglu_forward(const loom_ops *be, float *out, const float *inp, int N, int F, loom_glu glu);
void cuda_swiglu_backward(const loom_ops *be, float *dinp, const float *dout, const float *inp, int N, int F, loom_glu glu);
void cuda_rope_forward(const loom_ops *be, float *x, int T, int B, int stride, int heads, int D, int pos_offset, loom_rope rope);
void cuda_rope_backward(const loom_ops *be, float *dx, int T, int B, int stride, int heads, int D, int pos_offset, loom_rope rope);
void cuda_gelu_forward(const loom_ops *be, float *out, const float *inp, size_t n);
void cuda_gelu_backward(const loom_ops *be, float *dinp, const float *dout, const float *inp, size_t n);
void cuda_add(const loom_ops *be, float *out, const float *a, const float *b, size_t n);
void cuda_accumulate(const loom_ops *be, float *acc, const float *x, size_t n);
void cuda_sumsq_batch(const loom_ops *be, const float *const *x, const size_t *n, int count, double *out);
double cuda_sumsq(const loom_ops *be, const float *x, size_t n);
void cuda_sign_pack(const loom_ops *be, uint32_t *msg, const float *x, size_t n);
void cuda_sign_unpack_add(const loom_ops *be, float *y, const uint32_t *msg, size_t n, float weight);
void cuda_rows_gather(const loom_ops *be, float *out, const float *x, const int *rows, int M, int C);
void cuda_rows_combine(const loom_ops *be, float *y, const float *x, const int *slots, const float *w, int N, int k, int C);
void cuda_rows_combine_backward(const loom_ops *be, float *dx, float *dw, const float *dy, const float *x, const int *slots, const float *w, int N, int k, int C);
void cuda_dropout(const loom_ops *be, float *x, int T, int B, int C, const loom_dropout *d);
void cuda_embedding_forward(const loom_ops *be, float *out, const int *tokens, const float *wte, int vocab_start, int rows, int T, int B, int C);
void cuda_embedding_forward_bf16(const loom_ops *be, float *out, const int *tokens, const uint16_t *wte, int vocab_start, int rows, int T, int B, int C);
void cuda_embedding_backward(const loom_ops *be, float *dwte, const float *dout, const int *tokens, int vocab_start, int rows, int T, int B, int C);
void cuda_position_forward(const loom_ops *be, float *out, const float *wpe, int T, int B, int C, int pos_offset);
void cuda_position_backward(const loom_ops *be, float *dwpe, const float *dout, int T, int B, int C, int pos_offset);
void cuda_logsumexp(const loom_ops *be, float *lse, const float *logits, int N, int V, int width);
void cuda_pick_targets(const loom_ops *be, float *picked, const float *logits, const int *targets, int vocab_start, int N, int V, int width);
void cuda_crossentropy_backward(const loom_ops *be, float *dlogits, const float *logits, const float *lse, const int *targets, int vocab_start, float dloss, int N, int V, int width);
void cuda_argmax(const loom_ops *be, float *val, int *idx, const float *logits, int N, int V, int width);
void cuda_crossentropy_losses(const loom_ops *be, float *losses, const float *lse, const float *picked, const int *targets, int N);
void cuda_exp_shifted(const loom_ops *be, float *x, const float *shift, size_t n);
void cuda_log_shifted(const loom_ops *be, float *x, const float *shift, size_t n);
void cuda_adamw(const loom_ops *be, float *param, const float *grad, float *m, float *v, uint16_t *compute, size_t n, const loom_adamw_args *a);
float cuda_fp8_amax(const loom_ops *be, loom_bf16_operand x, size_t n);
void cuda_fp8_quantize(const loom_ops *be, uint8_t *codes, float *scale_inv, loom_bf16_operand x, int R, int C, bool transpose, const loom_fp8_quant *q);
void cuda_fp8_gemm(const loom_ops *be, float *c, bool accumulate, const loom_fp8_matrix *a, const loom_fp8_matrix *b, int M, int N, int K);
unsigned sumsq_blocks(size_t n);
float *scratch(Backend &g, size_t floats);
double *partials(Backend &g);

} // namespace loom_cuda

#endif
