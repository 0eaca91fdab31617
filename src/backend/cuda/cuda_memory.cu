// The CUDA backend's allocators (cuda_context.cuh): every block comes from
// the context's block cache, over cudaMallocAsync (device memory, the fast
// path) or cudaMallocManaged (the synchronised correctness path). Fills and copies
// are queued on the compute stream, so a block reused after a release is
// touched only after the work that used it before (one stream orders both).
#include <string.h>
#include "backend/cuda/cuda_context.cuh"

namespace loom_cuda {
namespace {

__global__ void fill32_kernel(uint32_t *d, uint32_t pattern, size_t n) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) d[i] = pattern;
}

// Device memory is stream-ordered (cudaMallocAsync, cudaFreeAsync on the
// compute stream): giving cached blocks back on an allocation miss never
// waits for the whole device, as cudaFree would, which could wait forever
// on an NCCL kernel whose peer waits on this rank. A block freed and then
// allocated again on the one stream is reused in its order.
void *raw_device(void *backend, size_t bytes) {
  void *p = nullptr;
  if (cudaMallocAsync(&p, bytes, ((Backend *)backend)->stream) == cudaSuccess) return p;
  cudaGetLastError(); // out of memory is an answer, not a sticky error
  return nullptr;
}

void *raw_managed(void *, size_t bytes) {
  void *p = nullptr;
  if (cudaMallocManaged(&p, bytes, cudaMemAttachGlobal) == cudaSuccess) return p;
  cudaGetLastError();
  return nullptr;
}

void raw_device_release(void *backend, void *p) { cudaFreeAsync(p, ((Backend *)backend)->stream); }
void raw_managed_release(void *, void *p) { cudaFree(p); } // the synchronised path: cudaFree waits for the device

// Managed memory is read by host code between ops: its fills and copies finish before they return.
void settle(Backend &g, const char *what) {
  if (g.mem.host_addressable) host_wait(g, what);
}

void *mem_zalloc(const loom_allocator *mem, size_t bytes, const char *) {
  Backend &g = ctx(mem);
  void *p = loom_block_cache_alloc(g.cache, bytes);
  if (!p) return nullptr;
  check(cudaMemsetAsync(p, 0, bytes, g.stream), "zero fill");
  settle(g, "zero fill");
  return p;
}

void mem_release(const loom_allocator *mem, void *p) {
  if (!p) return;
  if (loom_block_cache_free(ctx(mem).cache, p)) return;
  fprintf(stderr, "loom: CUDA memory at %p released twice, or never allocated by this context\n", p);
  abort();
}

void mem_copy(const loom_allocator *mem, void *dst, const void *src, size_t bytes) {
  Backend &g = ctx(mem);
  if (!bytes || dst == src) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, g.stream), "device copy");
  settle(g, "device copy");
}

void mem_copy_2d(const loom_allocator *mem, void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                 size_t rows) {
  Backend &g = ctx(mem);
  if (!width || !rows) return;
  check(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDefault, g.stream), "device copy_2d");
  settle(g, "device copy_2d");
}

void mem_fill32(const loom_allocator *mem, void *dst, uint32_t pattern, size_t count) {
  Backend &g = ctx(mem);
  if (!count) return;
  LAUNCH(fill32_kernel, blocks_for(count), THREADS, 0, g.stream, (uint32_t *)dst, pattern, count);
  launched("fill32");
  settle(g, "fill32");
}

// The runtime reads what it asked for at once (a loss, a norm, a checkpoint piece): wait.
void mem_to_host(const loom_allocator *mem, void *host, const void *src, size_t bytes) {
  Backend &g = ctx(mem);
  copy_to_host(g, host, src, bytes, "copy to host");
}

// Pageable host memory is staged by the driver before cudaMemcpyAsync
// returns, so the caller may reuse it at once and the host need not wait for
// the device; pinned memory is read later by DMA, so then the copy must
// finish, as must every copy into managed memory (settle).
void mem_from_host(const loom_allocator *mem, void *dst, const void *host, size_t bytes) {
  Backend &g = ctx(mem);
  if (!bytes) return;
  check(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyDefault, g.stream), "copy from host");
  cudaPointerAttributes a;
  const bool staged = !g.mem.host_addressable && cudaPointerGetAttributes(&a, host) == cudaSuccess &&
                      a.type == cudaMemoryTypeUnregistered;
  cudaGetLastError();
  if (!staged) host_wait(g, "copy from host");
}

bool mem_owns(const loom_allocator *mem, const void *p) { return loom_block_cache_owns(ctx(mem).cache, p); }

loom_memory_counts mem_counts(const loom_allocator *mem) {
  const loom_block_cache_stats s = loom_block_cache_stats_of(ctx(mem).cache);
  return loom_memory_counts{s.in_use, s.peak_in_use};
}

void mem_reset_peak(const loom_allocator *mem) { loom_block_cache_reset_peaks(ctx(mem).cache); }

} // namespace

loom_allocator make_allocator(Backend &g, bool managed) {
  g.cache = loom_block_cache_new(managed ? loom_raw_memory{raw_managed, raw_managed_release, nullptr}
                                         : loom_raw_memory{raw_device, raw_device_release, &g});
  if (!g.cache) {
    fprintf(stderr, "loom: out of host memory opening a CUDA context\n");
    abort();
  }
  loom_allocator m;
  memset(&m, 0, sizeof m);
  m.name = managed ? "cuda-managed" : "cuda-device";
  m.device = LOOM_DEVICE_CUDA;
  m.host_addressable = managed;
  m.state = &g;
  m.zalloc = mem_zalloc;
  m.release = mem_release;
  m.copy = mem_copy;
  m.copy_2d = mem_copy_2d;
  m.fill32 = mem_fill32;
  m.to_host = mem_to_host;
  m.from_host = mem_from_host;
  m.owns = mem_owns;
  m.counts = mem_counts;
  m.reset_peak = mem_reset_peak;
  return m;
}

} // namespace loom_cuda
