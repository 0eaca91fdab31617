// The emulated GPU's runtime API: one device with an H100's (sm_90's)
// limits, its memory calls and copies, and events. Copies check their
// direction against the pointers' kinds and their ranges against the
// allocations they touch. A copy from pageable host memory is staged when
// it is queued (the caller may reuse the buffer at once); a copy into
// pageable host memory blocks the host until it is done, and with it all
// the stream's earlier work, as the CUDA documentation says.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <map>
#include <memory>
#include <vector>
#include "emu.h"

namespace loom_emu {
extern cudaError_t g_last;
CUstream_st *stream_of(cudaStream_t s);
}
using namespace loom_emu;

struct EventState {
  uint64_t recorded = 0, reached = 0; // records queued, and the last one the device reached
  double ms = 0.0;                    // when the device reached it
};
struct CUevent_st {
  std::shared_ptr<EventState> state = std::make_shared<EventState>();
  bool timing = true;
};

namespace {

constexpr int SM90_THREADS = 1024, SM90_SHARED = 48 << 10, SM90_SHARED_OPTIN = 227 << 10;

double now_ms() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int g_device = 0;

// The devices a process sees, LOOM_EMU_DEVICES (default 8, an HGX node's):
// each rank on a host picks its own, as on a GPU node, and whichever it
// picks, the device is this process's own (its memory and streams).
int device_count() {
  static const int n = [] {
    const char *v = getenv("LOOM_EMU_DEVICES");
    return v && atoi(v) > 0 && atoi(v) <= 1024 ? atoi(v) : 8;
  }();
  return n;
}

// Checks one side of a copy: its kind and, on the device, its range.
cudaError_t check_side(const char *call, const char *side, const void *p, size_t bytes, bool device_side) {
  if (!p) return refuse(cudaErrorInvalidValue, "%s: a null %s pointer with %zu bytes to copy", call, side, bytes);
  const Space s = space_of(p);
  if (device_side && s == SPACE_HOST)
    return refuse(cudaErrorInvalidValue, "%s: the %s %p is host memory, and the copy's kind says device", call, side, p);
  if (!device_side && s == SPACE_DEVICE)
    return refuse(cudaErrorInvalidValue, "%s: the %s %p is device memory, and the copy's kind says host", call, side, p);
  if (s != SPACE_HOST && !inside_allocation(p, bytes)) {
    char where[160];
    describe(p, where, sizeof where);
    return refuse(cudaErrorInvalidValue, "%s: %zu bytes at %p (%s) run past the end of its allocation", call, bytes, p,
                  where);
  }
  return cudaSuccess;
}

// The copy's kind resolved from the pointers (cudaMemcpyDefault) and checked against them.
cudaError_t check_copy(const char *call, void *dst, size_t dst_bytes, const void *src, size_t src_bytes,
                       cudaMemcpyKind &kind) {
  if (kind == cudaMemcpyDefault) {
    const bool d = space_of(dst) != SPACE_HOST, s = space_of(src) != SPACE_HOST;
    kind = d && s ? cudaMemcpyDeviceToDevice : d ? cudaMemcpyHostToDevice : s ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost;
  }
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault)
    return refuse(cudaErrorInvalidMemcpyDirection, "%s: no such copy kind %d", call, (int)kind);
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  const cudaError_t e = check_side(call, "destination", dst, dst_bytes, dst_device);
  return e ? e : check_side(call, "source", src, src_bytes, src_device);
}

// One copy (rows of width bytes), queued; staged from pageable host memory, waited for into it.
cudaError_t copy_rows(const char *call, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                      size_t rows, cudaMemcpyKind kind, cudaStream_t stream) {
  LOOM_EMU_LOCK;
  if (sticky()) return sticky();
  if (!width || !rows) return cudaSuccess;
  if (dpitch < width || spitch < width)
    return refuse(cudaErrorInvalidValue, "%s: a pitch (%zu, %zu) below the width %zu", call, dpitch, spitch, width);
  const size_t dspan = dpitch * (rows - 1) + width, sspan = spitch * (rows - 1) + width;
  cudaMemcpyKind resolved = kind;
  const cudaError_t e = check_copy(call, dst, dspan, src, sspan, resolved);
  if (e) return e;
  std::shared_ptr<std::vector<char>> staged;
  const char *from = (const char *)src;
  if (space_of(src) == SPACE_HOST) { // pageable: the driver has it before the call returns
    staged = std::make_shared<std::vector<char>>(sspan);
    memcpy(staged->data(), src, sspan);
    from = staged->data();
  }
  auto done = std::make_shared<bool>(false);
  enqueue(stream, call, [=] {
    (void)staged; // kept until the copy has run
    for (size_t r = 0; r < rows; r++) memmove((char *)dst + r * dpitch, from + r * spitch, width);
    *done = true;
    return true;
  });
  if (space_of(dst) == SPACE_HOST) wait_until([done] { return *done; }, call); // into pageable memory: blocks
  return sticky();
}

} // namespace

extern "C" {

const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "cudaSuccess";
  case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
  case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
  case cudaErrorInitializationError: return "cudaErrorInitializationError";
  case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
  case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
  case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
  case cudaErrorNoDevice: return "cudaErrorNoDevice";
  case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
  case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
  case cudaErrorNotReady: return "cudaErrorNotReady";
  case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
  case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
  case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  default: return "cudaErrorUnknown";
  }
}

const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInvalidConfiguration: return "invalid configuration argument";
  case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
  case cudaErrorInvalidDevice: return "invalid device ordinal";
  case cudaErrorInvalidResourceHandle: return "invalid resource handle";
  case cudaErrorNotReady: return "device not ready";
  case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
  case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
  case cudaErrorLaunchFailure: return "unspecified launch failure";
  default: return "unknown error";
  }
}

cudaError_t cudaGetLastError(void) {
  LOOM_EMU_LOCK;
  const cudaError_t e = sticky() ? sticky() : g_last;
  g_last = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return sticky() ? sticky() : g_last; }

cudaError_t cudaGetDeviceCount(int *count) {
  if (!count) return cudaErrorInvalidValue;
  *count = device_count();
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count())
    return refuse(cudaErrorInvalidDevice, "cudaSetDevice(%d): the emulator shows %d devices (LOOM_EMU_DEVICES)", device,
                  device_count());
  g_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
  if (!device) return cudaErrorInvalidValue;
  *device = g_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
  if (!prop || device < 0 || device >= device_count()) return cudaErrorInvalidDevice;
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "loom emulated GPU (sm_90 limits, on the CPU)");
  prop->totalGlobalMem = device_memory();
  prop->sharedMemPerBlock = SM90_SHARED;
  prop->sharedMemPerBlockOptin = SM90_SHARED_OPTIN;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = SM90_THREADS;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
  if (!value || device < 0 || device >= device_count()) return cudaErrorInvalidDevice;
  switch (attr) {
  case cudaDevAttrMaxThreadsPerBlock: *value = SM90_THREADS; return cudaSuccess;
  case cudaDevAttrMaxSharedMemoryPerBlock: *value = SM90_SHARED; return cudaSuccess;
  case cudaDevAttrWarpSize: *value = 32; return cudaSuccess;
  case cudaDevAttrMultiProcessorCount: *value = 1; return cudaSuccess;
  case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = SM90_SHARED_OPTIN; return cudaSuccess;
  }
  return refuse(cudaErrorInvalidValue, "cudaDeviceGetAttribute: attribute %d is not emulated", (int)attr);
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
  LOOM_EMU_LOCK;
  if (!p) return refuse(cudaErrorInvalidValue, "cudaMalloc: a null result pointer");
  if (sticky()) return sticky();
  *p = device_alloc(bytes);
  return *p ? cudaSuccess : (g_last = cudaErrorMemoryAllocation);
}

cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t stream) { return cudaMalloc(p, bytes); }

cudaError_t cudaMallocManaged(void **p, size_t bytes, unsigned flags) {
  LOOM_EMU_LOCK;
  if (!p) return refuse(cudaErrorInvalidValue, "cudaMallocManaged: a null result pointer");
  if (sticky()) return sticky();
  *p = managed_alloc(bytes);
  return *p ? cudaSuccess : (g_last = cudaErrorMemoryAllocation);
}

// cudaFree waits for the whole device first, as CUDA's does.
cudaError_t cudaFree(void *p) {
  LOOM_EMU_LOCK;
  if (!p) return cudaSuccess;
  if (space_of(p) == SPACE_HOST)
    return refuse(cudaErrorInvalidValue, "cudaFree(%p): not memory this device allocated", p);
  wait_until(idle, "cudaFree");
  if (!release(p)) return refuse(cudaErrorInvalidValue, "cudaFree(%p): not the start of a live allocation", p);
  return sticky();
}

cudaError_t cudaFreeAsync(void *p, cudaStream_t stream) {
  LOOM_EMU_LOCK;
  if (!p) return cudaSuccess;
  if (space_of(p) != SPACE_DEVICE || !inside_allocation(p, 0))
    return refuse(cudaErrorInvalidValue, "cudaFreeAsync(%p): not a live device allocation", p);
  enqueue(stream, "cudaFreeAsync", [p] {
    if (!release(p)) fault(cudaErrorInvalidValue, "cudaFreeAsync(%p): freed twice", p);
    return true;
  });
  return sticky();
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
  if (!a) return cudaErrorInvalidValue;
  memset(a, 0, sizeof *a);
  const Space s = space_of(p);
  a->type = s == SPACE_DEVICE ? cudaMemoryTypeDevice : s == SPACE_MANAGED ? cudaMemoryTypeManaged : cudaMemoryTypeUnregistered;
  a->device = s == SPACE_HOST ? -2 : 0;
  a->devicePointer = s == SPACE_HOST ? nullptr : (void *)p;
  a->hostPointer = s == SPACE_DEVICE ? nullptr : (void *)p;
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t stream) {
  return copy_rows("cudaMemcpyAsync", dst, bytes, src, bytes, bytes, 1, kind, stream);
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind kind, cudaStream_t stream) {
  return copy_rows("cudaMemcpy2DAsync", dst, dpitch, src, spitch, width, height, kind, stream);
}

// The synchronous copy: queued on the default stream and waited for.
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
  LOOM_EMU_LOCK;
  const cudaError_t e = copy_rows("cudaMemcpy", dst, bytes, src, bytes, bytes, 1, kind, nullptr);
  if (e) return e;
  return cudaStreamSynchronize(nullptr);
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t stream) {
  LOOM_EMU_LOCK;
  if (sticky()) return sticky();
  if (!bytes) return cudaSuccess;
  const cudaError_t e = check_side("cudaMemsetAsync", "destination", p, bytes, true);
  if (e) return e;
  enqueue(stream, "cudaMemsetAsync", [=] {
    memset(p, value, bytes);
    return true;
  });
  return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int value, size_t bytes) {
  const cudaError_t e = cudaMemsetAsync(p, value, bytes, nullptr);
  return e ? e : cudaStreamSynchronize(nullptr);
}

cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
  if (!e) return refuse(cudaErrorInvalidValue, "cudaEventCreate: a null event pointer");
  *e = new CUevent_st;
  (*e)->timing = !(flags & cudaEventDisableTiming);
  return cudaSuccess;
}

// Destroying an event with a record still queued is allowed; the record still happens.
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (!e) return refuse(cudaErrorInvalidResourceHandle, "cudaEventDestroy: a null event");
  delete e;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  LOOM_EMU_LOCK;
  if (!e) return refuse(cudaErrorInvalidResourceHandle, "cudaEventRecord: a null event");
  std::shared_ptr<EventState> st = e->state;
  const uint64_t n = ++st->recorded;
  enqueue(s, "cudaEventRecord", [st, n] {
    if (n > st->reached) st->reached = n, st->ms = now_ms();
    return true;
  });
  return sticky();
}

// The stream waits for the event's latest record as of this call (none: no wait).
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
  LOOM_EMU_LOCK;
  if (!e) return refuse(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: a null event");
  std::shared_ptr<EventState> st = e->state;
  const uint64_t n = st->recorded;
  enqueue(s, "cudaStreamWaitEvent", [st, n] { return st->reached >= n; });
  return sticky();
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  LOOM_EMU_LOCK;
  if (!e) return refuse(cudaErrorInvalidResourceHandle, "cudaEventQuery: a null event");
  progress();
  if (sticky()) return sticky();
  return e->state->reached >= e->state->recorded ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  LOOM_EMU_LOCK;
  if (!e) return refuse(cudaErrorInvalidResourceHandle, "cudaEventSynchronize: a null event");
  std::shared_ptr<EventState> st = e->state;
  const uint64_t n = st->recorded;
  wait_until([st, n] { return st->reached >= n; }, "cudaEventSynchronize");
  return sticky();
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t stop) {
  if (!ms || !start || !stop) return refuse(cudaErrorInvalidValue, "cudaEventElapsedTime: a null argument");
  if (!start->timing || !stop->timing) return refuse(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event without timing");
  if (start->state->reached < start->state->recorded || stop->state->reached < stop->state->recorded || !start->state->reached)
    return cudaErrorNotReady;
  *ms = (float)(stop->state->ms - start->state->ms);
  return cudaSuccess;
}

} // extern "C"
