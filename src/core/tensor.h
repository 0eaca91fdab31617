/* Tensors and buffers.
 *
 * A loom_tensor is a named, shaped view of memory it does not own. A
 * loom_buffer is one allocation holding many such views back to back (as
 * llm.c does), so all-reduce, sharding and checkpointing can treat a whole
 * kind of state (parameters, grads, optimizer moments) as one flat
 * (pointer, count) array. */
#ifndef LOOM_TENSOR_H
#define LOOM_TENSOR_H

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
size_t loom_tensor_numel(const loom_tensor *t);
size_t loom_tensor_bytes(const loom_tensor *t);
/* Fills name/shape; data stays NULL until a buffer places it. */
loom_tensor loom_tensor_spec(const char *name, loom_dtype dtype, int ndim, const int64_t *shape);

/* Where buffers (and the other arrays ops read) live: host memory by
 * default; the CUDA backend supplies memory its kernels can reach. The
 * process-wide default is what new buffers get; each buffer remembers its
 * own allocator, so buffers of both kinds can live side by side. */
typedef struct loom_allocator {
  const char *name;
  loom_device device;
  void *(*zalloc)(size_t bytes); /* zero-filled, NULL on failure */
  void (*release)(void *p);
} loom_allocator;

const loom_allocator *loom_allocator_host(void);
const loom_allocator *loom_default_allocator(void);
void loom_set_default_allocator(const loom_allocator *a);
/* Zeroed memory from the default allocator; aborts with `what` named when out of memory. */
void *loom_xzalloc(size_t bytes, const char *what);

typedef struct {
  loom_dtype dtype;
  loom_device device;
  const loom_allocator *alloc; /* what base came from */
  size_t numel;      /* elements across all views */
  void *base;        /* one allocation, zero-filled */
  int count;
  loom_tensor *views; /* views[i].data points into base, in spec order */
} loom_buffer;

/* Places `count` same-dtype specs back to back in one zeroed allocation. */
loom_status loom_buffer_init(loom_buffer *buf, const loom_tensor *specs, int count);
void loom_buffer_free(loom_buffer *buf);
/* The view named `name`, or NULL. */
loom_tensor *loom_buffer_find(const loom_buffer *buf, const char *name);
/* Element offset of view i from base. */
size_t loom_buffer_offset(const loom_buffer *buf, int i);

#endif
