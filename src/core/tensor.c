/* Tensor specs and contiguous buffers of named views. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "core/tensor.h"

size_t loom_dtype_size(loom_dtype dtype) {
  switch (dtype) {
  case LOOM_DTYPE_F32: return 4;
  case LOOM_DTYPE_I32: return 4;
  case LOOM_DTYPE_BF16: return 2;
  case LOOM_DTYPE_F64: return 8;
  case LOOM_DTYPE_I64: return 8;
  case LOOM_DTYPE_BYTE: return 1;
  }
  return 0;
}

const char *loom_dtype_name(loom_dtype dtype) {
  switch (dtype) {
  case LOOM_DTYPE_F32: return "f32";
  case LOOM_DTYPE_I32: return "i32";
  case LOOM_DTYPE_BF16: return "bf16";
  case LOOM_DTYPE_F64: return "f64";
  case LOOM_DTYPE_I64: return "i64";
  case LOOM_DTYPE_BYTE: return "byte";
  }
  return "unknown";
}

size_t loom_tensor_numel(const loom_tensor *t) {
  size_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
  return n;
}

size_t loom_tensor_bytes(const loom_tensor *t) {
  return loom_tensor_numel(t) * loom_dtype_size(t->dtype);
}

loom_tensor loom_tensor_spec(const char *name, loom_dtype dtype, int ndim, const int64_t *shape) {
  LOOM_CHECK(ndim >= 0 && ndim <= LOOM_MAX_DIMS, "tensor rank out of range");
  LOOM_CHECK(strlen(name) < LOOM_NAME_LEN, "tensor name too long");
  loom_tensor t;
  memset(&t, 0, sizeof t);
  strcpy(t.name, name);
  t.dtype = dtype;
  t.device = LOOM_DEVICE_CPU;
  t.ndim = ndim;
  for (int d = 0; d < ndim; d++) t.shape[d] = shape[d];
  return t;
}

/* Host blocks carry their size in a header, so what is held is counted
 * exactly; the header keeps malloc's 16-byte alignment. */
enum { HOST_HEADER = 16 };
static _Atomic size_t g_host_in_use, g_host_peak;

static void *host_zalloc(const loom_allocator *mem, size_t bytes, const char *what) {
  if (bytes > SIZE_MAX - HOST_HEADER) return NULL;
  char *block = calloc(bytes + HOST_HEADER, 1);
  if (!block) return NULL;
  memcpy(block, &bytes, sizeof bytes);
  const size_t now = atomic_fetch_add(&g_host_in_use, bytes) + bytes;
  size_t peak = atomic_load(&g_host_peak);
  while (now > peak && !atomic_compare_exchange_weak(&g_host_peak, &peak, now)) {}
  return block + HOST_HEADER;
}
static void host_release(const loom_allocator *mem, void *p) {
  if (!p) return;
  char *block = (char *)p - HOST_HEADER;
  size_t bytes;
  memcpy(&bytes, block, sizeof bytes);
  atomic_fetch_sub(&g_host_in_use, bytes);
  free(block);
}
static loom_memory_counts host_counts(const loom_allocator *mem) {
  return (loom_memory_counts){atomic_load(&g_host_in_use), atomic_load(&g_host_peak)};
}
static void host_reset_peak(const loom_allocator *mem) { atomic_store(&g_host_peak, atomic_load(&g_host_in_use)); }
/* Large copies and fills split across the OpenMP threads: one core alone
 * reaches a fraction of the memory bandwidth, and the others would wait. */
enum { PARALLEL_BYTES = 1 << 20, PIECE = 1 << 18 };

static void host_copy(const loom_allocator *mem, void *dst, const void *src, size_t bytes) {
  const char *s = src;
  char *d = dst;
  if (bytes < PARALLEL_BYTES || (d < s + bytes && s < d + bytes)) { /* small, or overlapping */
    if (bytes) memmove(dst, src, bytes);
    return;
  }
  const size_t pieces = (bytes + PIECE - 1) / PIECE;
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < pieces; i++) {
    const size_t at = i * PIECE;
    memcpy(d + at, s + at, bytes - at < PIECE ? bytes - at : PIECE);
  }
}
static void host_copy_2d(const loom_allocator *mem, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                         size_t width, size_t rows) {
  for (size_t r = 0; r < rows; r++) memcpy((char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, width);
}
static void host_fill32(const loom_allocator *mem, void *dst, uint32_t pattern, size_t count) {
  uint32_t *d = dst;
  if (pattern == 0 && count * sizeof pattern < PARALLEL_BYTES) {
    memset(dst, 0, count * sizeof pattern);
    return;
  }
#pragma omp parallel for simd schedule(static) if (count * sizeof pattern >= PARALLEL_BYTES)
  for (size_t i = 0; i < count; i++) d[i] = pattern;
}
static bool host_owns(const loom_allocator *mem, const void *p) { return true; }

const loom_allocator loom_host_memory = {.name = "host",
                                         .device = LOOM_DEVICE_CPU,
                                         .host_addressable = true,
                                         .zalloc = host_zalloc,
                                         .release = host_release,
                                         .copy = host_copy,
                                         .copy_2d = host_copy_2d,
                                         .fill32 = host_fill32,
                                         .to_host = host_copy,
                                         .from_host = host_copy,
                                         .owns = host_owns,
                                         .counts = host_counts,
                                         .reset_peak = host_reset_peak};

const loom_allocator *loom_allocator_host(void) { return &loom_host_memory; }

static _Thread_local loom_alloc_failed g_alloc_failed;

void *loom_zalloc(const loom_allocator *mem, size_t bytes, const char *what) {
  void *p = mem->zalloc(mem, bytes, what);
  if (!p) g_alloc_failed = (loom_alloc_failed){.what = what ? what : "a buffer", .bytes = bytes};
  return p;
}

loom_alloc_failed loom_alloc_failure(void) { return g_alloc_failed; }

loom_status loom_fail_nomem(loom_error *err, const char *where, ...) {
  char place[256];
  va_list ap;
  va_start(ap, where);
  vsnprintf(place, sizeof place, where, ap);
  va_end(ap);
  const loom_alloc_failed f = g_alloc_failed;
  return loom_fail(err, LOOM_ERR_NOMEM, "out of memory for %s (%zu bytes) %s", f.what ? f.what : "a buffer", f.bytes, place);
}

void *loom_xzalloc(const loom_allocator *mem, size_t bytes, const char *what) {
  void *p = mem->zalloc(mem, bytes, what);
  LOOM_CHECK(p, what);
  return p;
}

static loom_status place(loom_buffer *buf, const loom_tensor *specs, int count, const loom_allocator *mem, bool storage,
                         size_t multiple, const char *what) {
  memset(buf, 0, sizeof *buf);
  if (count <= 0) return LOOM_OK;
  buf->dtype = specs[0].dtype;
  size_t total = 0;
  for (int i = 0; i < count; i++) {
    LOOM_CHECK(specs[i].dtype == buf->dtype, "a buffer holds one dtype");
    total += loom_tensor_numel(&specs[i]);
  }
  const size_t esize = loom_dtype_size(buf->dtype);
  buf->alloc = mem;
  buf->device = mem->device;
  buf->views = malloc((size_t)count * sizeof *buf->views);
  const size_t capacity = (total + multiple - 1) / multiple * multiple;
  buf->base = storage ? loom_zalloc(buf->alloc, (capacity ? capacity : 1) * esize, what) : NULL;
  if (!buf->views || (storage && !buf->base)) {
    free(buf->views);
    if (buf->base) buf->alloc->release(buf->alloc, buf->base);
    memset(buf, 0, sizeof *buf);
    return LOOM_ERR_NOMEM;
  }
  buf->numel = total;
  buf->capacity = storage ? capacity : 0;
  buf->count = count;
  size_t offset = 0;
  for (int i = 0; i < count; i++) {
    buf->views[i] = specs[i];
    buf->views[i].device = buf->device;
    buf->views[i].data = storage ? (char *)buf->base + offset * esize : NULL;
    offset += loom_tensor_numel(&specs[i]);
  }
  return LOOM_OK;
}

loom_status loom_buffer_init(loom_buffer *buf, const loom_tensor *specs, int count, const loom_allocator *mem,
                             const char *what) {
  return place(buf, specs, count, mem, true, 1, what);
}

loom_status loom_buffer_init_padded(loom_buffer *buf, const loom_tensor *specs, int count, const loom_allocator *mem,
                                    size_t multiple, const char *what) {
  LOOM_CHECK(multiple >= 1, "pad to a positive multiple");
  return place(buf, specs, count, mem, true, multiple, what);
}

loom_status loom_buffer_layout(loom_buffer *buf, const loom_tensor *specs, int count, const loom_allocator *mem) {
  return place(buf, specs, count, mem, false, 1, NULL);
}

void loom_buffer_free(loom_buffer *buf) {
  free(buf->views);
  if (buf->base) buf->alloc->release(buf->alloc, buf->base);
  memset(buf, 0, sizeof *buf);
}

loom_tensor *loom_buffer_find(const loom_buffer *buf, const char *name) {
  for (int i = 0; i < buf->count; i++) {
    if (strcmp(buf->views[i].name, name) == 0) return &buf->views[i];
  }
  return NULL;
}

size_t loom_buffer_offset(const loom_buffer *buf, int i) {
  if (buf->base) return (size_t)((char *)buf->views[i].data - (char *)buf->base) / loom_dtype_size(buf->dtype);
  size_t offset = 0; /* a layout without storage: the views lie back to back */
  for (int j = 0; j < i; j++) offset += loom_tensor_numel(&buf->views[j]);
  return offset;
}
