/* Checkpoint shard files: writing and checked reading. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt/shard_file.h"
#include "core/crc32c.h"
#include "core/write_file.h"

static const char MAGIC[8] = {'L', 'O', 'O', 'M', 'S', 'H', 'R', 'D'};

int64_t loom_shard_numel(const loom_shard_tensor *t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->local[d];
  return n;
}

/* A growing byte buffer for the header parts. */
typedef struct {
  uint8_t *p;
  size_t n, cap;
} bytes;

static void put(bytes *b, const void *data, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    b->p = realloc(b->p, b->cap);
  }
  memcpy(b->p + b->n, data, n);
  b->n += n;
}

loom_status loom_shard_file_write(const char *path, const loom_shard_tensor *tensors, int count, int64_t *file_bytes,
                                  uint32_t *file_crc, loom_error *err) {
  /* Each tensor's metadata goes in its own small block, then its data. */
  bytes *meta = calloc((size_t)count + 1, sizeof *meta);
  loom_chunk *chunks = calloc(2 * (size_t)count + 1, sizeof *chunks);
  if (!meta || !chunks) {
    free(meta);
    free(chunks);
    return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory writing a checkpoint shard", path);
  }
  const uint32_t version = LOOM_SHARD_VERSION, n = (uint32_t)count;
  put(&meta[count], MAGIC, sizeof MAGIC);
  put(&meta[count], &version, 4);
  put(&meta[count], &n, 4);
  chunks[0] = (loom_chunk){meta[count].p, meta[count].n};
  for (int i = 0; i < count; i++) {
    const loom_shard_tensor *t = &tensors[i];
    const uint16_t len = (uint16_t)strlen(t->name);
    const uint8_t nd = (uint8_t)t->ndim;
    const uint64_t data_bytes = (uint64_t)loom_shard_numel(t) * sizeof(float);
    const uint32_t crc = loom_crc32c(0, t->data, data_bytes);
    put(&meta[i], &len, 2);
    put(&meta[i], t->name, len);
    put(&meta[i], &nd, 1);
    put(&meta[i], t->global, 8 * (size_t)nd);
    put(&meta[i], t->offset, 8 * (size_t)nd);
    put(&meta[i], t->local, 8 * (size_t)nd);
    put(&meta[i], &crc, 4);
    put(&meta[i], &data_bytes, 8);
    chunks[1 + 2 * i] = (loom_chunk){meta[i].p, meta[i].n};
    chunks[2 + 2 * i] = (loom_chunk){t->data, data_bytes};
  }
  const loom_status st = loom_write_file_atomic(path, chunks, 1 + 2 * count, err);
  *file_bytes = 0;
  *file_crc = 0;
  for (int i = 0; i < 1 + 2 * count; i++) {
    *file_crc = loom_crc32c(*file_crc, chunks[i].data, chunks[i].bytes);
    *file_bytes += (int64_t)chunks[i].bytes;
  }
  for (int i = 0; i <= count; i++) free(meta[i].p);
  free(meta);
  free(chunks);
  return st;
}

/* Reads exactly n bytes or reports where the file ended. */
static loom_status take(FILE *fp, void *dst, size_t n, const char *path, const char *where, loom_error *err) {
  if (fread(dst, 1, n, fp) == n) return LOOM_OK;
  return loom_fail(err, LOOM_ERR_FORMAT, "%s: truncated checkpoint shard: ends inside %s", path, where);
}

static loom_status read_tensor(FILE *fp, const char *path, loom_shard_tensor *t, loom_error *err) {
  uint16_t len;
  uint8_t nd;
  uint32_t crc;
  uint64_t data_bytes;
  loom_status st = take(fp, &len, 2, path, "a tensor header", err);
  if (st == LOOM_OK && len >= sizeof t->name) st = loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor name of %u bytes is too long", path, len);
  if (st == LOOM_OK) st = take(fp, t->name, len, path, "a tensor name", err);
  t->name[st == LOOM_OK ? len : 0] = '\0';
  if (st == LOOM_OK) st = take(fp, &nd, 1, path, t->name, err);
  if (st == LOOM_OK && nd > LOOM_SHARD_MAX_DIMS)
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s has %u dimensions (at most %d)", path, t->name, nd, LOOM_SHARD_MAX_DIMS);
  t->ndim = nd;
  if (st == LOOM_OK) st = take(fp, t->global, 8 * (size_t)nd, path, t->name, err);
  if (st == LOOM_OK) st = take(fp, t->offset, 8 * (size_t)nd, path, t->name, err);
  if (st == LOOM_OK) st = take(fp, t->local, 8 * (size_t)nd, path, t->name, err);
  if (st == LOOM_OK) st = take(fp, &crc, 4, path, t->name, err);
  if (st == LOOM_OK) st = take(fp, &data_bytes, 8, path, t->name, err);
  if (st != LOOM_OK) return st;
  for (int d = 0; d < nd; d++)
    if (t->local[d] < 0 || t->offset[d] < 0 || t->offset[d] + t->local[d] > t->global[d])
      return loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s: shard [%lld, +%lld) lies outside its global size %lld in dim %d",
                       path, t->name, (long long)t->offset[d], (long long)t->local[d], (long long)t->global[d], d);
  if (data_bytes != (uint64_t)loom_shard_numel(t) * sizeof(float))
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s: %llu data bytes do not match its shape", path, t->name,
                     (unsigned long long)data_bytes);
  t->data = malloc(data_bytes ? data_bytes : 1);
  if (!t->data) return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory reading %s", path, t->name);
  st = take(fp, t->data, data_bytes, path, t->name, err);
  if (st != LOOM_OK) return st;
  const uint32_t computed = loom_crc32c(0, t->data, data_bytes);
  if (computed != crc)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s fails its checksum (stored %08x, computed %08x): the file is corrupt",
                     path, t->name, crc, computed);
  return LOOM_OK;
}

loom_status loom_shard_file_read(const char *path, loom_shard_file *out, loom_error *err) {
  memset(out, 0, sizeof *out);
  FILE *fp = fopen(path, "rb");
  if (!fp) return loom_fail(err, LOOM_ERR_IO, "%s: cannot open checkpoint shard: %s", path, strerror(errno));
  char magic[8];
  uint32_t version, count;
  loom_status st = take(fp, magic, 8, path, "its header", err);
  if (st == LOOM_OK && memcmp(magic, MAGIC, 8) != 0)
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: not a loom checkpoint shard (bad magic)", path);
  if (st == LOOM_OK) st = take(fp, &version, 4, path, "its header", err);
  if (st == LOOM_OK && version != LOOM_SHARD_VERSION)
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: checkpoint shard version %u, this loom reads %d", path, version, LOOM_SHARD_VERSION);
  if (st == LOOM_OK) st = take(fp, &count, 4, path, "its header", err);
  if (st == LOOM_OK && count > 1000000) st = loom_fail(err, LOOM_ERR_FORMAT, "%s: implausible tensor count %u", path, count);
  if (st == LOOM_OK) {
    out->tensors = calloc(count ? count : 1, sizeof *out->tensors);
    if (!out->tensors) st = loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
  }
  for (uint32_t i = 0; st == LOOM_OK && i < count; i++) {
    st = read_tensor(fp, path, &out->tensors[i], err);
    out->count = (int)i + 1;
  }
  if (st == LOOM_OK && fgetc(fp) != EOF)
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: trailing bytes after the last tensor", path);
  fclose(fp);
  if (st != LOOM_OK) loom_shard_file_free(out);
  return st;
}

void loom_shard_file_free(loom_shard_file *f) {
  for (int i = 0; i < f->count; i++) free(f->tensors[i].data);
  free(f->tensors);
  memset(f, 0, sizeof *f);
}
