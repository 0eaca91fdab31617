/* Tensors and buffers.
 *
 * A loom_tensor is a named, shaped view of memory it does not own. A
 * loom_buffer is one allocation holding many such views back to back (as
 * llm.c does), so all-reduce, sharding and checkpointing can treat a whole
 * kind of state (parameters, grads, optimizer moments) as one flat
 * (pointer, count) array. */
#ifndef LOOM_TENSOR_H
#define LOOM_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "core/status.h"

#define LOOM_MAX_DIMS 4
#define LOOM_NAME_LEN 64

/* Element types of tensors and of what collectives carry. Values are stored
 * in shard files: append, never renumber. */
typedef enum {
  LOOM_DTYPE_F32 = 0,
  LOOM_DTYPE_I32 = 1,
  LOOM_DTYPE_BF16 = 2,
  LOOM_DTYPE_F64 = 3,
  LOOM_DTYPE_I64 = 4,
  LOOM_DTYPE_BYTE = 5, /* raw bytes: moved, never reduced */
} loom_dtype;
typedef enum { LOOM_DEVICE_CPU = 0, LOOM_DEVICE_CUDA = 1 } loom_device;

typedef struct {
  char name[LOOM_NAME_LEN];
  loom_dtype dtype;
  loom_device device;
  int ndim;
  int64_t shape[LOOM_MAX_DIMS];
  void *data;
} loom_tensor;

size_t loom_dtype_size(loom_dtype dtype);
/* "f32", "bf16", ...: its name in tables. */
const char *loom_dtype_name(loom_dtype dtype);
/* 32-bit words n bf16 values fill, two to a word (an odd count's last word
 * half padding): how bf16 travels through calls that count fp32 words. */
static inline size_t loom_bf16_words(size_t n) { return (n + 1) / 2; }
size_t loom_tensor_numel(const loom_tensor *t);
size_t loom_tensor_bytes(const loom_tensor *t);
/* Fills name/shape; data stays NULL until a buffer places it. */
loom_tensor loom_tensor_spec(const char *name, loom_dtype dtype, int ndim, const int64_t *shape);

/* Tensor memory and the only ways to touch it. Every buffer of parameters,
 * grads, optimizer state, activations, tokens and staging comes from a
 * backend's allocator, and code above the backends moves data in and out of
 * it only through these calls: a backend whose memory the host cannot
 * dereference (a GPU's, or the guarded CPU backend's) then works unchanged.
 * Sizes are in bytes; copy and copy_2d take this allocator's memory on both
 * sides and allow overlap (memmove semantics for copy). */
typedef struct {
  size_t in_use, peak;
} loom_memory_counts;

typedef struct loom_allocator {
  const char *name;
  loom_device device;
  bool host_addressable; /* host code may dereference what it hands out */
  /* The backend context this memory belongs to (a CUDA context's stream
   * orders its copies), NULL where there is none. Every function below
   * receives its allocator as `mem`. */
  void *state;
  /* zero-filled, NULL on failure; `what` names the buffer (a recording allocator keeps it) */
  void *(*zalloc)(const struct loom_allocator *mem, size_t bytes, const char *what);
  void (*release)(const struct loom_allocator *mem, void *p);
  void (*copy)(const struct loom_allocator *mem, void *dst, const void *src, size_t bytes);
  /* rows of `width` bytes, dst_pitch / src_pitch bytes apart (cudaMemcpy2D) */
  void (*copy_2d)(const struct loom_allocator *mem, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                  size_t width, size_t rows);
  void (*fill32)(const struct loom_allocator *mem, void *dst, uint32_t pattern, size_t count); /* count 32-bit words */
  void (*to_host)(const struct loom_allocator *mem, void *host, const void *src, size_t bytes);
  void (*from_host)(const struct loom_allocator *mem, void *dst, const void *host, size_t bytes);
  /* p points into memory this allocator handed out */
  bool (*owns)(const struct loom_allocator *mem, const void *p);
  /* What it has handed out: bytes held now, and the most held at once
   * since it started or since the last reset_peak (exact request sizes on
   * the host; a caching allocator's rounded blocks on a device). The
   * figure a run compares with its memory model (plan/memory.h). */
  loom_memory_counts (*counts)(const struct loom_allocator *mem);
  void (*reset_peak)(const struct loom_allocator *mem); /* peak := what is held now */
} loom_allocator;

/* Plain host memory (calloc, counted): what the CPU and reference backends use. */
extern const loom_allocator loom_host_memory;
const loom_allocator *loom_allocator_host(void);

/* Zeroed memory from `mem`, or NULL: a failure is remembered (this thread's
 * last, loom_alloc_failure) so the status that reports it can name the
 * buffer and its size (loom_fail_nomem). What a run allocates goes through
 * here. */
void *loom_zalloc(const loom_allocator *mem, size_t bytes, const char *what);
typedef struct {
  const char *what;
  size_t bytes;
} loom_alloc_failed;
loom_alloc_failed loom_alloc_failure(void);
/* LOOM_ERR_NOMEM into err: "out of memory for WHAT (N bytes) " and the
 * caller's where (printf-style). */
loom_status loom_fail_nomem(loom_error *err, const char *where, ...) __attribute__((format(printf, 2, 3)));
/* Zeroed memory from `mem`; aborts with `what` named when out of memory (tools' own measurements, not a run). */
void *loom_xzalloc(const loom_allocator *mem, size_t bytes, const char *what);
/* Zero-fills n floats (or any 32-bit elements). */
static inline void loom_mem_zero(const loom_allocator *mem, void *dst, size_t n) { mem->fill32(mem, dst, 0, n); }

typedef struct {
  loom_dtype dtype;
  loom_device device;
  const loom_allocator *alloc; /* what base came from */
  size_t numel;      /* elements across all views */
  size_t capacity;   /* elements allocated: numel, or more when padded (the rest zero) */
  void *base;        /* one allocation, zero-filled */
  int count;
  loom_tensor *views; /* views[i].data points into base, in spec order */
} loom_buffer;

/* Places `count` same-dtype specs back to back in one zeroed allocation from `mem`, named `what`. */
loom_status loom_buffer_init(loom_buffer *buf, const loom_tensor *specs, int count, const loom_allocator *mem,
                             const char *what);
/* The same with the allocation rounded up to a multiple of `multiple`
 * elements, zero past numel: collectives that cut a buffer into equal
 * blocks (ZeRO's reduce-scatter and all-gather) work on it in place. */
loom_status loom_buffer_init_padded(loom_buffer *buf, const loom_tensor *specs, int count, const loom_allocator *mem,
                                    size_t multiple, const char *what);
/* The same layout without storage: base and every view's data are NULL,
 * numel, count, offsets and alloc (the memory the values belong to) are
 * as loom_buffer_init would set them. For state that lives elsewhere in
 * slices of this layout (a distributed optimizer's fp32 master weights). */
loom_status loom_buffer_layout(loom_buffer *buf, const loom_tensor *specs, int count, const loom_allocator *mem);
void loom_buffer_free(loom_buffer *buf);
/* The view named `name`, or NULL. */
loom_tensor *loom_buffer_find(const loom_buffer *buf, const char *name);
/* Element offset of view i from the start of the buffer. */
size_t loom_buffer_offset(const loom_buffer *buf, int i);

#endif
