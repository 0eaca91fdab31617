// The CUDA backend's context, shared by its source files (not a public
// header: C code sees only cuda_backend.h). One context is one device, one
// compute stream, one cuBLAS handle and one allocator.
#ifndef LOOM_CUDA_CONTEXT_CUH
#define LOOM_CUDA_CONTEXT_CUH

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
extern "C" {
#include "backend/cuda/cuda_backend.h"
#include "backend/op_math.h"
#include "core/block_cache.h"
}

namespace loom_cuda {

inline void check(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return;
  fprintf(stderr, "loom: CUDA error in %s: %s\n", what, cudaGetErrorString(e));
  abort();
}

inline void check_blas(cublasStatus_t s, const char *what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  fprintf(stderr, "loom: cuBLAS error %d in %s\n", (int)s, what);
  abort();
}

// cuBLAS is opened at run time, so a CUDA-built loom starts as fast as a CPU
// one, and runs where the CUDA libraries are absent (on the CPU backend).
#define LOOM_STR2(x) #x
#define LOOM_STR(x) LOOM_STR2(x)
#ifndef LOOM_CUBLAS_LIBRARY // the emulated GPU's cublas_v2.h names its own
#define LOOM_CUBLAS_LIBRARY "libcublas.so." LOOM_STR(CUBLAS_VER_MAJOR)
#endif
#ifndef LOOM_CUBLASLT_LIBRARY // and its cublasLt.h
#define LOOM_CUBLASLT_LIBRARY "libcublasLt.so." LOOM_STR(CUBLAS_VER_MAJOR)
#endif
// cuBLASLt's entry points for FP8 matmuls; ok false where it cannot be opened (FP8 GEMMs then run as kernels).
struct BlasLt {
  bool ok = false;
  decltype(&cublasLtCreate) create;
  decltype(&cublasLtDestroy) destroy;
  decltype(&cublasLtMatmulDescCreate) desc_create;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set;
  decltype(&cublasLtMatrixLayoutCreate) layout_create;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
  decltype(&cublasLtMatmul) matmul;
};
struct Blas {
  bool ok = false;
  char error[256] = "";
  decltype(&cublasCreate_v2) create;
  decltype(&cublasDestroy_v2) destroy;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSetMathMode) set_math_mode;
  decltype(&cublasSgemm_v2) sgemm;
  decltype(&cublasSgemmStridedBatched) sgemm_strided_batched;
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
                            const void *, cudaDataType, int, const void *, cudaDataType, int, const void *, void *,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  // cuBLAS 12.5's grouped GEMM, the experts' GEMMs in one call; nullptr in an older cuBLAS (they go one by one).
  decltype(&cublasGemmGroupedBatchedEx) gemm_grouped = nullptr;
  BlasLt lt;
};

// One CUDA context: what every op and transfer of its table runs on. Its op
// table and allocator point back at it through their state.
struct Backend {
  int device = -1;
  cudaStream_t stream = nullptr;
  Blas lib;
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr; // FP8 matmuls (nullptr: cuBLASLt absent, or a GPU before sm_89)
  long lt_matmuls = 0;           // FP8 GEMMs cuBLASLt ran (loom_cuda_fp8_lt_matmuls)
  // Work buffers the context owns, grown on demand (grow()): attention
  // probabilities after dropout, sumsq's block sums, a GEMM's bf16 operands,
  // a grouped GEMM's operand pointers, attention blocks' row positions.
  void *scratch = nullptr, *partials = nullptr, *operands = nullptr, *pointers = nullptr, *positions = nullptr;
  size_t scratch_bytes = 0, partials_bytes = 0, operand_bytes = 0, pointer_bytes = 0, position_bytes = 0;
  bool bf16_gemms = false; // matmuls on bf16 tensor cores (loom_cuda_set_bf16_gemms)
  loom_cuda_attention attention = LOOM_CUDA_ATTENTION_FUSED;
  int shared_optin = 0;       // the device's opt-in shared memory per block, once asked
  bool flash_refused = false; // a head dim the fused attention could not take has been reported
  void (*wait_hook)(void *stream, const char *what) = nullptr; // loom_cuda_set_host_wait
  loom_block_cache *cache = nullptr; // every block the allocator hands out
  loom_ops ops;
  loom_allocator mem;
};

inline Backend &ctx(const loom_ops *be) { return *(Backend *)be->state; }
inline Backend &ctx(const loom_allocator *mem) { return *(Backend *)mem->state; }

constexpr int THREADS = 256;
inline unsigned blocks_for(size_t n) { return (unsigned)((n + THREADS - 1) / THREADS); }
inline void launched(const char *what) { check(cudaGetLastError(), what); }
// Launches kernel over grid (a count of blocks, or a dim3) on stream, or
// nothing when the grid is empty: an op on an empty shape is a no-op, as on
// the CPU, where CUDA would refuse a launch of no blocks.
#define LAUNCH(kernel, grid, threads, shmem, stream, ...)                                   \
  do {                                                                                      \
    const dim3 launch_grid_ = (grid);                                                       \
    if (launch_grid_.x && launch_grid_.y && launch_grid_.z)                                 \
      LOOM_KERNEL_CALL(kernel, launch_grid_, (threads), (shmem), (stream), __VA_ARGS__);    \
  } while (0)
// The emulated GPU's headers (src/backend/cuda/emu/include) define their own
// kernel call and dynamic shared memory; nvcc's are these.
#ifndef LOOM_KERNEL_CALL
#define LOOM_KERNEL_CALL(kernel, grid, threads, shmem, stream, ...) kernel<<<grid, threads, shmem, stream>>>(__VA_ARGS__)
#define LOOM_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#endif

// A causal attention call's shape and dropout keys, as kernels take them.
struct AttnArgs {
  int T, B, H, D; // D: q's and k's head width
  int Dv;         // v's and the output's (loom_attn_v_dim)
  float scale;    // loom_attn_scale
  int64_t sample_offset;
  int head_offset, total_heads;
  float p;
  uint64_t seed, stream;
  int window; // loom_attn_sees's (0: none)
};

inline AttnArgs attn_args(const loom_attn_shape *s, const loom_dropout *d) {
  AttnArgs a{s->T,         s->B, s->heads, s->head_dim, loom_attn_v_dim(s), loom_attn_scale(s), 0, s->head_offset,
             s->total_heads, 0.0f, 0,        0,           s->window};
  if (d && d->p > 0.0f) {
    a.p = d->p;
    a.seed = d->seed;
    a.stream = d->stream;
    a.sample_offset = d->sample_offset;
  }
  return a;
}

// The factor dropout multiplies probability (b, h, tq, tk) by: 1/(1-p) or 0 (op_math.h's mask, as the CPU's).
__device__ inline float keep_factor(const AttnArgs &a, int b, int h, int tq, int tk) {
  if (a.p <= 0.0f) return 1.0f;
  const uint64_t index = loom_attn_dropout_index_at(a.sample_offset, a.head_offset, a.total_heads, a.T, b, h, tq, tk);
  return loom_dropout_keep_at(a.p, a.seed, a.stream, index) ? 1.0f / (1.0f - a.p) : 0.0f;
}

// The fused attention kernels (cuda_flash.cu) under ops.h's flash contract;
// K is the local key/value heads. They run where flash_attention_fits: the
// head dims (q/k's D, v's Dv) within theirs and their shared memory within
// the device's (head dim 256 needs about 193 KiB, which an H100 has and an
// A100 does not; MLA's 192 and 128 about 121 KiB).
bool flash_attention_fits(Backend &g, int D, int Dv);
void flash_attention_forward(Backend &g, float *out, float *lse, const float *qkv, const AttnArgs &a, int K);
void flash_attention_backward(Backend &g, float *dqkv, const float *dout, const float *out, const float *qkv,
                              const float *lse, const AttnArgs &a, int K);

// A context-owned work buffer of at least `bytes`, from the block cache so
// that the memory peak counts it. Growing needs no wait: the old block's
// last users are queued on this stream before anything a later owner of
// that block queues.
inline void *grow(Backend &g, void *&buf, size_t &have, size_t bytes, const char *what) {
  if (bytes <= have) return buf;
  if (buf) loom_block_cache_free(g.cache, buf);
  buf = loom_block_cache_alloc(g.cache, bytes);
  if (!buf) {
    fprintf(stderr, "loom: CUDA out of memory for %s (%zu bytes)\n", what, bytes);
    abort();
  }
  have = bytes;
  return buf;
}

// Waits on the host for everything queued on the context's stream: every
// place the host blocks on the device goes through it (transfers to the
// host, sumsq, the synchronised ops), except closing the context.
inline void host_wait(Backend &g, const char *what) {
  if (g.wait_hook) g.wait_hook(g.stream, what);
  else check(cudaStreamSynchronize(g.stream), what);
}

// Copies device memory into pageable host memory. Such a copy blocks the
// host inside cudaMemcpyAsync until the stream's earlier work is done, out
// of the watchdog's sight (an NCCL transfer that never matches would hang
// it silently), so the stream is waited for first through host_wait.
inline void copy_to_host(Backend &g, void *host, const void *src, size_t bytes, const char *what) {
  host_wait(g, what);
  if (bytes) check(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, g.stream), what);
  host_wait(g, what);
}

// The context's allocator: CUDA managed memory (host-addressable, for the
// synchronised correctness path) or device memory, both under a block cache.
loom_allocator make_allocator(Backend &g, bool managed);

} // namespace loom_cuda

#endif
