/* The emulated GPU's SIMT built-ins for kernels compiled by the host C++
 * compiler (included by the emulated cuda_runtime.h). A kernel is a plain
 * function; each thread of a block runs it on a fiber of its own, so
 * __syncthreads() is a real barrier over the block's fibers and the warp
 * intrinsics exchange values at a barrier over the lanes their mask names.
 * threadIdx and friends read the running fiber's coordinates. __shared__
 * variables live in one section (loom_emu_shared) that the emulator refills
 * with NaN bytes before each block, as it does a launch's dynamic shared
 * memory, so a read of a shared word no thread of this block wrote shows. */
#ifndef LOOM_EMU_SIMT_H
#define LOOM_EMU_SIMT_H

#include <stdint.h>
#include <string.h>
#include <tuple>
#include <utility>

struct uint3 {
  unsigned x, y, z;
};

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static __attribute__((section("loom_emu_shared")))
/* `extern __shared__ T name[]`, a launch's dynamic shared memory (cuda_context.cuh's seam). */
#define LOOM_DYNAMIC_SHARED(T, name) T *const name = (T *)::loom_emu::dynamic_shared()

extern "C" char __start_loom_emu_shared[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_loom_emu_shared[] __attribute__((weak, visibility("hidden")));

namespace loom_emu {

/* The running fiber's coordinates, set by the emulator before it resumes a thread. */
struct Coordinates {
  uint3 thread, block;
  dim3 block_dim, grid_dim;
};
extern Coordinates here;

/* A kernel launch: body(closure) runs once per thread; destroy(closure) after the last. */
cudaError_t launch_kernel(const char *name, dim3 grid, dim3 block, size_t dynamic_shared, cudaStream_t stream,
                          void (*body)(void *), void *closure, void (*destroy)(void *), char *shared_begin,
                          char *shared_end);

/* <<<grid, block, shared, stream>>>(args...): the arguments are evaluated and
 * copied now, as a launch copies them, and the kernel runs when the stream
 * reaches it. */
template <typename Kernel, typename... Args>
cudaError_t launch(const char *name, dim3 grid, dim3 block, size_t shared, cudaStream_t stream, Kernel kernel,
                   Args... args) {
  using Closure = std::pair<Kernel, std::tuple<Args...>>;
  Closure *c = new Closure(kernel, std::tuple<Args...>(args...));
  return launch_kernel(
      name, grid, block, shared, stream, [](void *p) { std::apply(((Closure *)p)->first, ((Closure *)p)->second); }, c,
      [](void *p) { delete (Closure *)p; }, __start_loom_emu_shared, __stop_loom_emu_shared);
}

void *dynamic_shared();
void sync_block();
enum WarpOp { WARP_SYNC, WARP_SHFL_DOWN, WARP_SHFL_XOR, WARP_BALLOT };
uint64_t warp_exchange(WarpOp op, unsigned mask, uint64_t value, int arg, int width);

template <typename T> inline T shuffle(WarpOp op, unsigned mask, T v, int arg, int width) {
  static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof v);
  bits = warp_exchange(op, mask, bits, arg, width);
  memcpy(&v, &bits, sizeof v);
  return v;
}

} // namespace loom_emu

/* LAUNCH's kernel call (cuda_context.cuh): a generic lambda takes the
 * arguments so that a kernel template deduces its parameters as it would. */
#define LOOM_KERNEL_CALL(kernel, grid, threads, shmem, stream, ...)                                          \
  ::loom_emu::launch(#kernel, (grid), (threads), (shmem), (stream), [](auto... a_) { kernel(a_...); }, __VA_ARGS__)

#define threadIdx (::loom_emu::here.thread)
#define blockIdx (::loom_emu::here.block)
#define blockDim (::loom_emu::here.block_dim)
#define gridDim (::loom_emu::here.grid_dim)
constexpr int warpSize = 32;

inline void __syncthreads() { loom_emu::sync_block(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { loom_emu::warp_exchange(loom_emu::WARP_SYNC, mask, 0, 0, 32); }
template <typename T> inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return loom_emu::shuffle(loom_emu::WARP_SHFL_DOWN, mask, v, (int)delta, width);
}
template <typename T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return loom_emu::shuffle(loom_emu::WARP_SHFL_XOR, mask, v, lane_mask, width);
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return (unsigned)loom_emu::warp_exchange(loom_emu::WARP_BALLOT, mask, predicate != 0, 0, 32);
}

/* The device math loom's kernels call beyond <math.h>. */
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned __float_as_uint(float x) {
  unsigned u;
  memcpy(&u, &x, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

/* Atomics: one block's threads never run at once (they take turns at
 * barriers), and blocks run one after another, so a read-modify-write is atomic. */
template <typename T> inline T atomicAdd(T *p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
inline int atomicMin(int *p, int v) {
  const int old = *p;
  if (v < old) *p = v;
  return old;
}
inline int atomicMax(int *p, int v) {
  const int old = *p;
  if (v > old) *p = v;
  return old;
}

#endif
