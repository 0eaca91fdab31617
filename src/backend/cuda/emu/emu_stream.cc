// The emulated GPU's streams, and its errors. Work queued on a stream does
// not run when it is queued: it runs when the host waits for something
// (a stream or event synchronisation, a blocking copy, a query), and then
// every stream runs as far as it can, newest stream first, so work on one
// stream that reads another's results with no event between them reads
// them before they are made. Deterministic: one host thread drives it all.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <deque>
#include <string>
#include <vector>
#include "emu.h"

struct CUstream_st {
  struct Op {
    const char *what;
    std::function<bool()> step;
  };
  std::deque<Op> ops;
};

namespace loom_emu {
namespace {

cudaError_t g_sticky = cudaSuccess;

// Never destroyed: work may still be queued when the process exits.
std::vector<CUstream_st *> &streams() {
  static std::vector<CUstream_st *> *all = new std::vector<CUstream_st *>{new CUstream_st}; // [0]: the legacy default stream
  return *all;
}

void vprint(const char *fmt, va_list ap) {
  fprintf(stderr, "loom emu: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  fflush(stderr);
}

} // namespace

cudaError_t g_last = cudaSuccess; // cudaGetLastError's

std::recursive_mutex &api_lock() {
  static std::recursive_mutex m;
  return m;
}

uint64_t seed() {
  static const uint64_t s = [] {
    const char *v = getenv("LOOM_EMU_SEED");
    return v ? strtoull(v, nullptr, 10) : 1;
  }();
  return s;
}

void fault(cudaError_t e, const char *fmt, ...) {
  if (g_sticky != cudaSuccess) return; // the first fault is the one to read
  va_list ap;
  va_start(ap, fmt);
  vprint(fmt, ap);
  va_end(ap);
  g_sticky = e;
  for (CUstream_st *s : streams()) s->ops.clear(); // a faulted context runs nothing more
}

cudaError_t sticky() { return g_sticky; }

void note(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vprint(fmt, ap);
  va_end(ap);
}

cudaError_t refuse(cudaError_t e, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vprint(fmt, ap);
  va_end(ap);
  g_last = e;
  return e;
}

CUstream_st *stream_of(cudaStream_t s) { return s ? s : streams()[0]; }

void enqueue(cudaStream_t s, const char *what, std::function<bool()> step) {
  LOOM_EMU_LOCK;
  if (g_sticky != cudaSuccess) return;
  stream_of(s)->ops.push_back({what, std::move(step)});
}

bool progress() {
  LOOM_EMU_LOCK;
  std::vector<CUstream_st *> &all = streams();
  const size_t n = all.size();
  bool ran = false;
  DeviceAccess access;
  for (size_t i = 0; i < n && g_sticky == cudaSuccess; i++) {
    CUstream_st *s = all[(n - 1 - i + (seed() ? seed() - 1 : 0)) % n]; // newest first, rotated by the seed
    while (!s->ops.empty() && g_sticky == cudaSuccess) {
      if (!s->ops.front().step()) break;
      if (!s->ops.empty()) s->ops.pop_front(); // (a fault clears every queue)
      ran = true;
    }
  }
  return ran;
}

bool idle() {
  for (CUstream_st *s : streams())
    if (!s->ops.empty()) return false;
  return true;
}

void wait_until(const std::function<bool()> &done, const char *what) {
  LOOM_EMU_LOCK;
  for (int idle_passes = 0; !done() && g_sticky == cudaSuccess;) {
    if (progress()) {
      idle_passes = 0;
      continue;
    }
    if (idle()) { // nothing queued can ever make it true
      fault(cudaErrorUnknown, "%s can never finish: nothing queued on any stream makes it so", what);
      return;
    }
    if (++idle_passes > 64) { // waiting on another rank (emu_nccl.cc): let it run
      const struct timespec nap = {0, 20000};
      nanosleep(&nap, nullptr);
    }
  }
}

} // namespace loom_emu

using namespace loom_emu;

extern "C" {

cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
  LOOM_EMU_LOCK;
  if (!s) return refuse(cudaErrorInvalidValue, "cudaStreamCreateWithFlags: a null stream pointer");
  if (sticky()) return sticky();
  *s = new CUstream_st; // every stream is non-blocking: the legacy default stream's implicit syncs are not emulated
  streams().push_back(*s);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  LOOM_EMU_LOCK;
  if (!s) return refuse(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: the default stream");
  // Work already queued still runs, as CUDA lets it: here, before the handle goes.
  wait_until([s] { return s->ops.empty(); }, "cudaStreamDestroy");
  auto &all = streams();
  for (size_t i = 0; i < all.size(); i++)
    if (all[i] == s) all.erase(all.begin() + (long)i);
  delete s;
  return sticky();
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  LOOM_EMU_LOCK;
  CUstream_st *st = stream_of(s);
  wait_until([st] { return st->ops.empty(); }, "cudaStreamSynchronize");
  return sticky();
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
  LOOM_EMU_LOCK;
  progress();
  if (sticky()) return sticky();
  return stream_of(s)->ops.empty() ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaDeviceSynchronize(void) {
  LOOM_EMU_LOCK;
  wait_until(idle, "cudaDeviceSynchronize");
  return sticky();
}

} // extern "C"
