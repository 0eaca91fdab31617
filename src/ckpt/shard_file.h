/* One rank's checkpoint shard file: pieces of canonical tensors, each with
 * its name, global shape, the offset and shape of the block it comes from,
 * and which elements of that block it holds, so any plan can find what it
 * needs by global offsets. A block is a rank's tensor-parallel slice; a piece
 * is the whole block, or a contiguous run of it (a replica's ZeRO piece of
 * the flat optimizer state). Every piece carries a CRC-32C over its header and data,
 * so neither a flipped shape nor a flipped value is ever loaded silently.
 * Files open with a versioned header and are written atomically.
 *
 * The header binds the file to one save (the manifest's save id, its step)
 * and one rank, so a loader refuses a shard of another save or rank even
 * when every piece in it is intact.
 *
 * Layout (little endian): "LOOMSHRD", u32 version, u32 count, u64 save id,
 * i64 step, i32 rank; then per piece:
 * u16 name length, name, u8 ndim, u8 dtype, i64 global[ndim], i64 offset[ndim],
 * i64 local[ndim], i64 first, i64 count, u32 crc32c, then count fp32 values.
 * The CRC covers the piece's header bytes before it, then its values. */
#ifndef LOOM_SHARD_FILE_H
#define LOOM_SHARD_FILE_H

#include <stdint.h>
#include <stdio.h>
#include "core/status.h"

#define LOOM_SHARD_VERSION 3
#define LOOM_SHARD_MAX_DIMS 4

/* Element types of piece values; only fp32 so far (bf16 arrives with the CUDA backend). */
enum { LOOM_SHARD_F32 = 0 };

typedef struct {
  char name[96];
  int ndim;
  int dtype; /* LOOM_SHARD_F32 */
  int64_t global[LOOM_SHARD_MAX_DIMS], offset[LOOM_SHARD_MAX_DIMS], local[LOOM_SHARD_MAX_DIMS];
  int64_t first, count; /* elements [first, first + count) of the block, row-major */
  float *data;          /* count values */
} loom_shard_tensor;

/* Elements of the block (the product of local), or -1 if a dimension is
 * negative or the product does not fit in 64 bits. */
int64_t loom_shard_block_numel(const loom_shard_tensor *t);
/* Makes t hold its whole block. */
void loom_shard_set_whole(loom_shard_tensor *t);

/* What a shard belongs to. */
typedef struct {
  uint64_t save_id;
  int64_t step;
  int32_t rank;
} loom_shard_binding;

/* Writes atomically; *file_bytes and *file_crc describe the whole file, taken
 * from memory as it is written rather than by reading the file back. */
loom_status loom_shard_file_write(const char *path, const loom_shard_binding *binding, const loom_shard_tensor *tensors,
                                  int count, int64_t *file_bytes, uint32_t *file_crc, loom_error *err);
/* Reads only a shard's header: its magic, version and binding. */
loom_status loom_shard_read_binding(const char *path, loom_shard_binding *out, loom_error *err);

/* A shard file's table of pieces, read without their values, so a loader
 * reads only the pieces it needs. Opening checks the header, every piece's
 * bounds and that the file is neither short nor long. */
typedef struct {
  char path[4096];
  FILE *fp;
  loom_shard_binding binding;
  int count;
  loom_shard_tensor *tensors; /* data NULL */
  long *data_at;              /* file offset of each piece's values */
  uint32_t *stored_crc, *header_crc;
} loom_shard_index;

loom_status loom_shard_index_open(const char *path, loom_shard_index *ix, loom_error *err);
/* Reads piece i's values into dst (count floats) and checks its CRC. */
loom_status loom_shard_index_load(loom_shard_index *ix, int i, float *dst, loom_error *err);
void loom_shard_index_close(loom_shard_index *ix);

typedef struct {
  int count;
  loom_shard_tensor *tensors;
} loom_shard_file;

/* Reads and checks everything: header, bounds, and every piece's checksum. */
loom_status loom_shard_file_read(const char *path, loom_shard_file *out, loom_error *err);
void loom_shard_file_free(loom_shard_file *f);

#endif
