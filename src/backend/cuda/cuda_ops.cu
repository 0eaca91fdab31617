// The CUDA backend's op table (see cuda_backend.h). Kernels follow the
// reference backend's semantics op for op; the shared arithmetic (GELU,
// Philox dropout masks) comes from backend/op_math.h, so masks are
// bit-identical to the CPU's.
#include <dlfcn.h>
#include "backend/cuda/cuda_ops.cuh"

namespace loom_cuda {

template <typename F> bool load(Blas &b, void *lib, const char *name, F *out) {
  *out = (F)dlsym(lib, name);
  if (!*out) snprintf(b.error, sizeof b.error, "cuBLAS lacks %s", name);
  return *out != nullptr;
}

// cuBLASLt's FP8 entry points (optional: ok false without them).
BlasLt load_lt() {
  BlasLt t;
  void *lib = dlopen(LOOM_CUBLASLT_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  if (!lib) lib = dlopen("libcublasLt.so", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return t;
#define LT(field, name) (t.field = (decltype(t.field))dlsym(lib, name)) != nullptr
  t.ok = LT(create, "cublasLtCreate") && LT(destroy, "cublasLtDestroy") && LT(desc_create, "cublasLtMatmulDescCreate") &&
         LT(desc_destroy, "cublasLtMatmulDescDestroy") && LT(desc_set, "cublasLtMatmulDescSetAttribute") &&
         LT(layout_create, "cublasLtMatrixLayoutCreate") && LT(layout_destroy, "cublasLtMatrixLayoutDestroy") &&
         LT(pref_create, "cublasLtMatmulPreferenceCreate") && LT(pref_destroy, "cublasLtMatmulPreferenceDestroy") &&
         LT(pref_set, "cublasLtMatmulPreferenceSetAttribute") && LT(heuristic, "cublasLtMatmulAlgoGetHeuristic") &&
         LT(matmul, "cublasLtMatmul");
#undef LT
  return t;
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
  b.lt = load_lt();
  return b;
}

float *scratch(Backend &g, size_t floats) {
  return (float *)grow(g, g.scratch, g.scratch_bytes, floats * sizeof(float), "attention scratch");
}

double *partials(Backend &g) {
  return (double *)grow(g, g.partials, g.partials_bytes, SUMSQ_BLOCKS * sizeof(double), "block sums");
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
  o.attention_sink_forward = cuda_attention_sink_forward;
  o.attention_sink_backward = cuda_attention_sink_backward;
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
  o.fp8_amax = cuda_fp8_amax;
  o.fp8_quantize = cuda_fp8_quantize;
  o.fp8_gemm = cuda_fp8_gemm;
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
  o.attention_sink_forward = SYNCED(cuda_attention_sink_forward);
  o.attention_sink_backward = SYNCED(cuda_attention_sink_backward);
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
  o.fp8_amax = cuda_fp8_amax; // waits already
  o.fp8_quantize = SYNCED(cuda_fp8_quantize);
  o.fp8_gemm = SYNCED(cuda_fp8_gemm);
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
  cudaDeviceProp prop;
  const int sm = cudaGetDeviceProperties(&prop, g->device) == cudaSuccess ? prop.major * 10 + prop.minor : 0;
  if (lib.lt.ok && sm >= 89 && lib.lt.create(&g->lt) != CUBLAS_STATUS_SUCCESS) g->lt = nullptr; // FP8 tensor cores: sm_89 on
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
  if (g->lt) g->lib.lt.destroy(g->lt);
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

long loom_cuda_fp8_lt_matmuls(const loom_ops *be) { return ctx(be).lt_matmuls; }

size_t loom_cuda_memory_bytes(const loom_ops *be) {
  cudaDeviceProp prop;
  return cudaGetDeviceProperties(&prop, ctx(be).device) == cudaSuccess ? prop.totalGlobalMem : 0;
}

int loom_cuda_compute_capability(const loom_ops *be) {
  cudaDeviceProp prop;
  return cudaGetDeviceProperties(&prop, ctx(be).device) == cudaSuccess ? prop.major * 10 + prop.minor : 0;
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
