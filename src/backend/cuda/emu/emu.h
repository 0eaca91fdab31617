// The emulated GPU's internals, shared by its source files (emu_*.cc).
// One process is one device: its memory (emu_memory.cc), its streams and
// events (emu_stream.cc), the SIMT engine that runs kernels
// (emu_simt.cc), and the libraries on top (emu_cublas.cc, emu_nccl.cc).
#ifndef LOOM_EMU_H
#define LOOM_EMU_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <functional>
#include <mutex>

// Whether this build runs under AddressSanitizer (clang's and gcc's ways of saying so).
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LOOM_EMU_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define LOOM_EMU_ASAN 1
#endif

namespace loom_emu {

// ---- errors ----
// A fault in device work (a kernel's, a library's) is sticky, as on a GPU:
// it is printed once, naming what did it, and every later call returns it.
void fault(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
cudaError_t sticky();
// An error a call returns at once (a bad argument, a launch over the limits),
// printed, and kept for cudaGetLastError.
cudaError_t refuse(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// A line on stderr and nothing else (a library's refusal, which returns its own status).
void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// The emulator's one lock: API calls may come from several host threads.
std::recursive_mutex &api_lock();
#define LOOM_EMU_LOCK std::lock_guard<std::recursive_mutex> loom_emu_guard_(::loom_emu::api_lock())

// LOOM_EMU_SEED (default 1): the order threads and blocks take turns in;
// 0 runs them in index order.
uint64_t seed();

// A bf16 value's float (bf16 is fp32's top half, so exactly).
inline float bf16_value(uint16_t b) {
  const uint32_t u = (uint32_t)b << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}

// ---- memory ----
enum Space { SPACE_HOST, SPACE_DEVICE, SPACE_MANAGED };
Space space_of(const void *p);
// Whether [p, p + bytes) lies inside one live device or managed allocation.
bool inside_allocation(const void *p, size_t bytes);
// Describes where p lies ("3 KiB into a 64 KiB allocation at 0x..."), into out[len].
void describe(const void *p, char *out, size_t len);
// The device's memory: LOOM_EMU_MEMORY_MIB, 16 GiB by default.
size_t device_memory();
void *device_alloc(size_t bytes);  // NULL when the device is full
void *managed_alloc(size_t bytes); // NULL when out of memory
// Frees a live allocation; false if p is not the start of one.
bool release(void *p);
// While one lives, device memory is readable and writable (device work runs
// inside one); otherwise the host faults on it.
struct DeviceAccess {
  DeviceAccess();
  ~DeviceAccess();
};
// Whether a kernel wrote outside its allocations (their redzones), naming the first.
bool redzones_intact(char *what, size_t len);
// Every live allocation's bytes, for the race check: save, restore, compare.
struct Snapshot;
Snapshot *snapshot_take();
void snapshot_restore(const Snapshot *s);
// The first difference between s and memory now beyond float rounding, into out; false if none.
bool snapshot_differs(const Snapshot *s, char *out, size_t len);
void snapshot_free(Snapshot *s);

// ---- streams ----
// One piece of queued work: step() does what it can and says whether it is done.
void enqueue(cudaStream_t s, const char *what, std::function<bool()> step);
// Runs queued work on every stream (in LOOM_EMU_SEED's order: the newest
// stream first, so work queued on another stream without an event between
// them comes out wrong) until done() holds. `what` names the wait.
void wait_until(const std::function<bool()> &done, const char *what);
// One pass over every stream; whether anything ran.
bool progress();
// Whether nothing is queued on any stream.
bool idle();

// ---- kernels ----
// Runs one launch's blocks (inside device work); false after a fault.
struct Launch;
bool run_launch(Launch *l);

} // namespace loom_emu

#endif
