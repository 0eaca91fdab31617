/* Checkpoint shard files: writing, and checked reading piece by piece. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "core/read_file.h"
#include "ckpt/shard_file.h"
#include "core/fault.h"
#include "core/crc32c.h"
#include "core/write_file.h"

static const char MAGIC[8] = {'L', 'O', 'O', 'M', 'S', 'H', 'R', 'D'};

int64_t loom_shard_block_numel(const loom_shard_tensor *t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++)
    if (t->local[d] < 0 || __builtin_mul_overflow(n, t->local[d], &n)) return -1;
  return n;
}

void loom_shard_set_whole(loom_shard_tensor *t) {
  t->first = 0;
  t->count = loom_shard_block_numel(t);
}

/* A growing byte buffer for the header parts. */
typedef struct {
  uint8_t *p;
  size_t n, cap;
  bool failed; /* out of memory: the rest is dropped and the writer refuses */
} bytes;

static void put(bytes *b, const void *data, size_t n) {
  if (b->failed) return;
  if (b->n + n > b->cap) {
    uint8_t *bigger = loom_fault_realloc(b->p, (b->n + n) * 2 + 64);
    if (!bigger) {
      b->failed = true;
      return;
    }
    b->p = bigger;
    b->cap = (b->n + n) * 2 + 64;
  }
  memcpy(b->p + b->n, data, n);
  b->n += n;
}

/* A piece's header up to its CRC; then the CRC over that and the values. */
static void put_piece_header(bytes *b, const loom_shard_tensor *t) {
  const uint16_t len = (uint16_t)strlen(t->name);
  const uint8_t nd = (uint8_t)t->ndim, dtype = (uint8_t)t->dtype;
  put(b, &len, 2);
  put(b, t->name, len);
  put(b, &nd, 1);
  put(b, &dtype, 1);
  put(b, t->global, 8 * (size_t)nd);
  put(b, t->offset, 8 * (size_t)nd);
  put(b, t->local, 8 * (size_t)nd);
  put(b, &t->first, 8);
  put(b, &t->count, 8);
  if (b->failed) return;
  const uint32_t crc = loom_crc32c(loom_crc32c(0, b->p, b->n), t->data, (size_t)t->count * sizeof(float));
  put(b, &crc, 4);
}

/* The file's chunks in order; halfway, the kill_in_write fault (a test's:
 * this rank dies with the file half written, as a node lost mid-write). */
typedef struct {
  const loom_chunk *chunks;
  int count;
  int64_t step;
} chunk_list;

static int next_chunk(void *ctx, int i, loom_chunk *out, loom_status *st, loom_error *err) {
  (void)st, (void)err;
  const chunk_list *l = ctx;
  if (i >= l->count) return 0;
  if (i == l->count / 2 && loom_fault_fires(LOOM_FAULT_KILL_IN_WRITE, l->step, NULL)) abort();
  *out = l->chunks[i];
  return 1;
}

loom_status loom_shard_file_write(const char *path, const loom_shard_binding *binding, const loom_shard_tensor *tensors,
                                  int count, int64_t *file_bytes, uint32_t *file_crc, loom_error *err) {
  bytes *meta = loom_fault_calloc((size_t)count + 1, sizeof *meta);
  loom_chunk *chunks = loom_fault_calloc(2 * (size_t)count + 1, sizeof *chunks);
  if (!meta || !chunks) {
    free(meta);
    free(chunks);
    return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory writing a checkpoint shard", path);
  }
  const uint32_t version = LOOM_SHARD_VERSION, n = (uint32_t)count;
  put(&meta[count], MAGIC, sizeof MAGIC);
  put(&meta[count], &version, 4);
  put(&meta[count], &n, 4);
  put(&meta[count], &binding->save_id, 8);
  put(&meta[count], &binding->step, 8);
  put(&meta[count], &binding->rank, 4);
  chunks[0] = (loom_chunk){meta[count].p, meta[count].n};
  for (int i = 0; i < count; i++) {
    put_piece_header(&meta[i], &tensors[i]);
    chunks[1 + 2 * i] = (loom_chunk){meta[i].p, meta[i].n};
    chunks[2 + 2 * i] = (loom_chunk){tensors[i].data, (size_t)tensors[i].count * sizeof(float)};
  }
  bool failed = false;
  for (int i = 0; i <= count; i++) failed |= meta[i].failed;
  const chunk_list list = {chunks, 1 + 2 * count, binding->step};
  const loom_status st = failed ? loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory writing a checkpoint shard", path)
                                : loom_write_file_atomic_stream(path, next_chunk, (void *)&list, err);
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

/* Reads exactly n bytes (also into the running header CRC) or reports where the file ended. */
static loom_status take(FILE *fp, void *dst, size_t n, uint32_t *crc, const char *path, const char *where, loom_error *err) {
  if (fread(dst, 1, n, fp) != n)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: truncated checkpoint shard: ends inside %s", path, where);
  if (crc) *crc = loom_crc32c(*crc, dst, n);
  return LOOM_OK;
}

/* Reads piece i's header and steps over its values. */
static loom_status index_piece(loom_shard_index *ix, int i, int64_t file_size, loom_error *err) {
  loom_shard_tensor *t = &ix->tensors[i];
  const char *path = ix->path;
  FILE *fp = ix->fp;
  uint32_t h = 0;
  uint16_t len;
  uint8_t nd = 0, dtype = 0;
  loom_status st = take(fp, &len, 2, &h, path, "a tensor header", err);
  if (st == LOOM_OK && len >= sizeof t->name) st = loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor name of %u bytes is too long", path, len);
  if (st == LOOM_OK) st = take(fp, t->name, len, &h, path, "a tensor name", err);
  t->name[st == LOOM_OK ? len : 0] = '\0';
  if (st == LOOM_OK) st = take(fp, &nd, 1, &h, path, t->name, err);
  if (st == LOOM_OK && nd > LOOM_SHARD_MAX_DIMS)
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s has %u dimensions (at most %d)", path, t->name, nd, LOOM_SHARD_MAX_DIMS);
  t->ndim = nd;
  if (st == LOOM_OK) st = take(fp, &dtype, 1, &h, path, t->name, err);
  if (st == LOOM_OK && dtype != LOOM_SHARD_F32)
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s has element type %u; this loom reads fp32 (0)", path, t->name, dtype);
  t->dtype = dtype;
  if (st == LOOM_OK) st = take(fp, t->global, 8 * (size_t)nd, &h, path, t->name, err);
  if (st == LOOM_OK) st = take(fp, t->offset, 8 * (size_t)nd, &h, path, t->name, err);
  if (st == LOOM_OK) st = take(fp, t->local, 8 * (size_t)nd, &h, path, t->name, err);
  if (st == LOOM_OK) st = take(fp, &t->first, 8, &h, path, t->name, err);
  if (st == LOOM_OK) st = take(fp, &t->count, 8, &h, path, t->name, err);
  if (st == LOOM_OK) st = take(fp, &ix->stored_crc[i], 4, NULL, path, t->name, err);
  if (st != LOOM_OK) return st;
  ix->header_crc[i] = h;
  /* Bounds by subtraction, so no sum of values from the file can overflow. */
  for (int d = 0; d < nd; d++)
    if (t->local[d] < 0 || t->offset[d] < 0 || t->offset[d] > t->global[d] || t->local[d] > t->global[d] - t->offset[d])
      return loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s: block [%lld, +%lld) lies outside its global size %lld in dim %d",
                       path, t->name, (long long)t->offset[d], (long long)t->local[d], (long long)t->global[d], d);
  const int64_t block = loom_shard_block_numel(t);
  if (block < 0) return loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s: its block has more elements than fit in 64 bits", path, t->name);
  if (t->first < 0 || t->count < 0 || t->first > block || t->count > block - t->first)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s: elements [%lld, +%lld) lie outside its block", path, t->name,
                     (long long)t->first, (long long)t->count);
  ix->data_at[i] = ftell(fp);
  if (t->count > (file_size - ix->data_at[i]) / (int64_t)sizeof(float))
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: truncated checkpoint shard: ends inside %s", path, t->name);
  fseek(fp, (long)(t->count * (int64_t)sizeof(float)), SEEK_CUR);
  return LOOM_OK;
}

/* The file's header up to its pieces: magic, version, piece count, binding. */
static loom_status read_header(FILE *fp, const char *path, loom_shard_binding *b, uint32_t *count, loom_error *err) {
  char magic[8];
  uint32_t version;
  loom_status st = take(fp, magic, 8, NULL, path, "its header", err);
  if (st == LOOM_OK && memcmp(magic, MAGIC, 8) != 0)
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: not a loom checkpoint shard (bad magic)", path);
  if (st == LOOM_OK) st = take(fp, &version, 4, NULL, path, "its header", err);
  if (st == LOOM_OK && version != LOOM_SHARD_VERSION)
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: checkpoint shard version %u, this loom reads %d", path, version, LOOM_SHARD_VERSION);
  if (st == LOOM_OK) st = take(fp, count, 4, NULL, path, "its header", err);
  if (st == LOOM_OK) st = take(fp, &b->save_id, 8, NULL, path, "its header", err);
  if (st == LOOM_OK) st = take(fp, &b->step, 8, NULL, path, "its header", err);
  if (st == LOOM_OK) st = take(fp, &b->rank, 4, NULL, path, "its header", err);
  return st;
}

loom_status loom_shard_read_binding(const char *path, loom_shard_binding *out, loom_error *err) {
  FILE *fp;
  loom_status opened = loom_open_for_reading(path, "checkpoint shard", &fp, err);
  if (opened != LOOM_OK) return opened;
  uint32_t count;
  const loom_status st = read_header(fp, path, out, &count, err);
  fclose(fp);
  return st;
}

loom_status loom_shard_index_open(const char *path, loom_shard_index *ix, loom_error *err) {
  memset(ix, 0, sizeof *ix);
  snprintf(ix->path, sizeof ix->path, "%s", path);
  struct stat sb;
  loom_status opened = loom_open_for_reading(path, "checkpoint shard", &ix->fp, err);
  if (opened != LOOM_OK || fstat(fileno(ix->fp), &sb) != 0) {
    if (opened == LOOM_OK) opened = loom_fail(err, LOOM_ERR_IO, "%s: cannot open checkpoint shard: %s", path, strerror(errno));
    loom_shard_index_close(ix);
    return opened;
  }
  uint32_t count = 0;
  loom_status st = read_header(ix->fp, path, &ix->binding, &count, err);
  if (st == LOOM_OK && count > 1000000) st = loom_fail(err, LOOM_ERR_FORMAT, "%s: implausible tensor count %u", path, count);
  if (st == LOOM_OK) {
    const size_t n = count ? count : 1;
    ix->tensors = loom_fault_calloc(n, sizeof *ix->tensors);
    ix->data_at = loom_fault_calloc(n, sizeof *ix->data_at);
    ix->stored_crc = loom_fault_calloc(n, sizeof *ix->stored_crc);
    ix->header_crc = loom_fault_calloc(n, sizeof *ix->header_crc);
    if (!ix->tensors || !ix->data_at || !ix->stored_crc || !ix->header_crc) st = loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
  }
  for (uint32_t i = 0; st == LOOM_OK && i < count; i++) {
    st = index_piece(ix, (int)i, (int64_t)sb.st_size, err);
    ix->count = (int)i + 1;
  }
  if (st == LOOM_OK && ftell(ix->fp) != (long)sb.st_size)
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: trailing bytes after the last tensor", path);
  if (st != LOOM_OK) loom_shard_index_close(ix);
  return st;
}

loom_status loom_shard_index_load(loom_shard_index *ix, int i, float *dst, loom_error *err) {
  const loom_shard_tensor *t = &ix->tensors[i];
  const size_t n = (size_t)t->count * sizeof(float);
  if (fseek(ix->fp, ix->data_at[i], SEEK_SET) != 0 || fread(dst, 1, n, ix->fp) != n)
    return loom_fail(err, LOOM_ERR_IO, "%s: cannot read tensor %s: %s", ix->path, t->name, strerror(errno));
  const uint32_t computed = loom_crc32c(ix->header_crc[i], dst, n);
  if (computed != ix->stored_crc[i])
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s fails its checksum (stored %08x, computed %08x): the file is corrupt",
                     ix->path, t->name, ix->stored_crc[i], computed);
  return LOOM_OK;
}

void loom_shard_index_close(loom_shard_index *ix) {
  if (ix->fp) fclose(ix->fp);
  free(ix->tensors);
  free(ix->data_at);
  free(ix->stored_crc);
  free(ix->header_crc);
  memset(ix, 0, sizeof *ix);
}

loom_status loom_shard_file_read(const char *path, loom_shard_file *out, loom_error *err) {
  memset(out, 0, sizeof *out);
  loom_shard_index ix;
  loom_status st = loom_shard_index_open(path, &ix, err);
  if (st != LOOM_OK) return st;
  out->tensors = ix.tensors; /* the index's headers become the file's tensors */
  for (int i = 0; st == LOOM_OK && i < ix.count; i++) {
    loom_shard_tensor *t = &out->tensors[i];
    t->data = malloc(t->count ? (size_t)t->count * sizeof(float) : 1);
    out->count = i + 1;
    st = t->data ? loom_shard_index_load(&ix, i, t->data, err) : loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory reading %s", path, t->name);
  }
  ix.tensors = NULL; /* now out's */
  loom_shard_index_close(&ix);
  if (st != LOOM_OK) loom_shard_file_free(out);
  return st;
}

void loom_shard_file_free(loom_shard_file *f) {
  for (int i = 0; i < f->count; i++) free(f->tensors[i].data);
  free(f->tensors);
  memset(f, 0, sizeof *f);
}
