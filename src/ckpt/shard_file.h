/* One rank's checkpoint shard file: tensors named canonically, each with its
 * global shape, the offset of this shard in it, its local shape and a CRC-32C,
 * so any plan can find its pieces by global offsets and nothing corrupt is
 * ever loaded silently. Files open with a versioned header (magic LOOMSHRD,
 * version) and are written atomically.
 *
 * Layout (little endian): "LOOMSHRD", u32 version, u32 count; then per
 * tensor: u16 name length, name, u8 ndim, i64 global[ndim], i64 offset[ndim],
 * i64 local[ndim], u32 crc32c of the data, u64 data bytes, fp32 data. */
#ifndef LOOM_SHARD_FILE_H
#define LOOM_SHARD_FILE_H

#include <stdint.h>
#include "core/status.h"

#define LOOM_SHARD_VERSION 1
#define LOOM_SHARD_MAX_DIMS 4

typedef struct {
  char name[96];
  int ndim;
  int64_t global[LOOM_SHARD_MAX_DIMS], offset[LOOM_SHARD_MAX_DIMS], local[LOOM_SHARD_MAX_DIMS];
  float *data; /* local elements, row-major */
} loom_shard_tensor;

typedef struct {
  int count;
  loom_shard_tensor *tensors;
} loom_shard_file;

/* Writes atomically; *file_bytes and *file_crc describe the whole file, taken
 * from memory as it is written rather than by reading the file back. */
loom_status loom_shard_file_write(const char *path, const loom_shard_tensor *tensors, int count, int64_t *file_bytes,
                                  uint32_t *file_crc, loom_error *err);
/* Reads and checks everything: header, sizes, and every tensor's checksum. */
loom_status loom_shard_file_read(const char *path, loom_shard_file *out, loom_error *err);
void loom_shard_file_free(loom_shard_file *f);
/* Elements of a tensor's local shape. */
int64_t loom_shard_numel(const loom_shard_tensor *t);

#endif
