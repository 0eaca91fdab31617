/* Megatron's indexed dataset (.bin/.idx): mapped reading, streamed writing. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/read_file.h"
#include "core/check.h"
#include "core/write_file.h"
#include "data/indexed.h"

static const char MAGIC[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
#define HEADER_BYTES (9 + 8 + 1 + 8 + 8)

static size_t dtype_size(int code) {
  switch (code) {
  case 1: case 2: return 1;      /* uint8, int8 */
  case 3: case 8: return 2;      /* int16, uint16 */
  case 4: return 4;              /* int32 */
  case 5: return 8;              /* int64 */
  default: return 0;             /* 6 float64, 7 float32: not token ids */
  }
}

static int64_t load_i64(const unsigned char *p) {
  int64_t v;
  memcpy(&v, p, 8);
  return v;
}

static int32_t load_i32(const unsigned char *p) {
  int32_t v;
  memcpy(&v, p, 4);
  return v;
}

int64_t loom_indexed_length(const loom_indexed *d, int64_t seq) { return load_i32(d->lengths + 4 * seq); }

static int64_t token_at(const loom_indexed *d, const unsigned char *p) {
  switch (d->dtype) {
  case 1: return *p;
  case 2: return (int8_t)*p;
  case 3: { int16_t v; memcpy(&v, p, 2); return v; }
  case 8: { uint16_t v; memcpy(&v, p, 2); return v; }
  case 4: return load_i32(p);
  default: return load_i64(p);
  }
}

void loom_indexed_read(const loom_indexed *d, int64_t seq, int64_t from, int64_t count, int *out) {
  const unsigned char *p = d->bin + load_i64(d->pointers + 8 * seq) + (size_t)from * d->item;
  if (d->dtype == LOOM_INDEXED_DTYPE_UINT16) {
    for (int64_t i = 0; i < count; i++) {
      uint16_t v;
      memcpy(&v, p + 2 * i, 2);
      out[i] = v;
    }
    return;
  }
  for (int64_t i = 0; i < count; i++) out[i] = (int)token_at(d, p + (size_t)i * d->item);
}

int loom_indexed_exists(const char *prefix) {
  char path[4096];
  struct stat sb;
  snprintf(path, sizeof path, "%s.idx", prefix);
  return stat(path, &sb) == 0;
}

int loom_indexed_dtype_for_vocab(int vocab) { return vocab < 65500 ? LOOM_INDEXED_DTYPE_UINT16 : LOOM_INDEXED_DTYPE_INT32; }

static loom_status map_file(const char *path, const unsigned char **map, size_t *bytes, loom_error *err) {
  int fd;
  const loom_status opened = loom_open_regular(path, "indexed dataset file", &fd, err);
  if (opened != LOOM_OK) return opened;
  struct stat sb;
  fstat(fd, &sb);
  *bytes = (size_t)sb.st_size;
  *map = NULL;
  if (*bytes) {
    void *m = mmap(NULL, *bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
      close(fd);
      return loom_fail(err, LOOM_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
    }
    *map = m;
  }
  close(fd);
  return LOOM_OK;
}

loom_status loom_indexed_check(loom_indexed *d, const char *idx_path, const char *bin_path, int vocab, loom_error *err) {
  if (d->idx_bytes < HEADER_BYTES || memcmp(d->idx, MAGIC, 9) != 0)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: not a Megatron indexed dataset index (no MMIDIDX header)", idx_path);
  const int64_t version = load_i64(d->idx + 9);
  if (version != 1) return loom_fail(err, LOOM_ERR_FORMAT, "%s: index version %lld, loom reads version 1", idx_path, (long long)version);
  d->dtype = d->idx[17];
  d->item = dtype_size(d->dtype);
  if (!d->item) return loom_fail(err, LOOM_ERR_FORMAT, "%s: dtype code %d is not an integer token type (1-5, 8)", idx_path, d->dtype);
  const int64_t claimed = load_i64(d->idx + 18), claimed_docs = load_i64(d->idx + 26);
  if (claimed < 0 || claimed > (int64_t)1 << 40 || claimed_docs < 1 || claimed_docs > (int64_t)1 << 40)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: its header counts %lld sequences and %lld document indices; an index holds "
                     "0 to 2^40 sequences and 1 to 2^40 indices", idx_path, (long long)claimed, (long long)claimed_docs);
  const uint64_t n = (uint64_t)claimed, docs = (uint64_t)claimed_docs; /* small enough now that the sizes cannot wrap */
  const uint64_t expect = HEADER_BYTES + 12 * (uint64_t)n + 8 * (uint64_t)docs;
  if (expect != d->idx_bytes)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: %zu bytes do not hold %llu sequences and %llu document indices (%llu bytes)", idx_path,
                     d->idx_bytes, (unsigned long long)n, (unsigned long long)docs, (unsigned long long)expect);
  d->sequences = (int64_t)n;
  d->documents = (int64_t)docs;
  d->lengths = d->idx + HEADER_BYTES;
  d->pointers = d->lengths + 4 * n;
  d->doc_index = d->pointers + 8 * n;
  uint64_t at = 0;
  for (int64_t i = 0; i < d->sequences; i++) {
    const int32_t len = load_i32(d->lengths + 4 * i);
    if (len < 0 || (uint64_t)load_i64(d->pointers + 8 * i) != at)
      return loom_fail(err, LOOM_ERR_FORMAT, "%s: sequence %lld has length %d at pointer %lld, expected a length >= 0 at %llu", idx_path,
                       (long long)i, len, (long long)load_i64(d->pointers + 8 * i), (unsigned long long)at);
    at += (uint64_t)len * d->item;
  }
  if (at != d->bin_bytes)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: %zu bytes, but the index describes %llu (truncated or not this index's data)", bin_path,
                     d->bin_bytes, (unsigned long long)at);
  for (int64_t k = 0; k < d->documents; k++) {
    const int64_t v = load_i64(d->doc_index + 8 * k), prev = k ? load_i64(d->doc_index + 8 * (k - 1)) : 0;
    if ((k == 0 && v != 0) || v < prev || v > d->sequences || (k == d->documents - 1 && v != d->sequences))
      return loom_fail(err, LOOM_ERR_FORMAT, "%s: document index %lld is %lld; they must rise from 0 to the %lld sequences", idx_path,
                       (long long)k, (long long)v, (long long)d->sequences);
  }
  const uint64_t tokens = d->bin_bytes / d->item;
  for (uint64_t i = 0; i < tokens; i++) {
    const int64_t t = token_at(d, d->bin + i * d->item);
    if (t < 0 || t >= vocab)
      return loom_fail(err, LOOM_ERR_FORMAT, "%s: token %llu is %lld, outside the vocabulary [0, %d)", bin_path, (unsigned long long)i,
                       (long long)t, vocab);
  }
  return LOOM_OK;
}

loom_status loom_indexed_open(loom_indexed *d, const char *prefix, int vocab, loom_error *err) {
  memset(d, 0, sizeof *d);
  char idx_path[4096], bin_path[4096];
  if (snprintf(idx_path, sizeof idx_path, "%s.idx", prefix) >= (int)sizeof idx_path)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: path too long", prefix);
  snprintf(bin_path, sizeof bin_path, "%s.bin", prefix);
  loom_status st = map_file(idx_path, &d->idx, &d->idx_bytes, err);
  if (st == LOOM_OK) st = map_file(bin_path, &d->bin, &d->bin_bytes, err);
  if (st == LOOM_OK) st = loom_indexed_check(d, idx_path, bin_path, vocab, err);
  if (st != LOOM_OK) loom_indexed_close(d);
  return st;
}

void loom_indexed_close(loom_indexed *d) {
  if (d->idx) munmap((void *)d->idx, d->idx_bytes);
  if (d->bin) munmap((void *)d->bin, d->bin_bytes);
  memset(d, 0, sizeof *d);
}

/* ---- writing ---- */

static char *joined(const char *a, const char *b) {
  const size_t n = strlen(a) + strlen(b) + 1;
  char *s = loom_xmalloc(n, "path");
  snprintf(s, n, "%s%s", a, b);
  return s;
}

static void push(int64_t **v, int64_t *count, int64_t *cap, int64_t x) {
  if (*count == *cap) {
    *cap = *cap ? *cap * 2 : 1024;
    *v = realloc(*v, (size_t)*cap * sizeof **v);
    LOOM_CHECK(*v != NULL, "out of memory indexing a dataset");
  }
  (*v)[(*count)++] = x;
}

loom_status loom_indexed_writer_open(loom_indexed_writer *w, const char *prefix, int dtype, loom_error *err) {
  memset(w, 0, sizeof *w);
  LOOM_CHECK(dtype == LOOM_INDEXED_DTYPE_UINT16 || dtype == LOOM_INDEXED_DTYPE_INT32, "indexed datasets are written as uint16 or int32");
  w->dtype = dtype;
  w->bin_path = joined(prefix, ".bin");
  w->bin_tmp = joined(prefix, ".bin.tmp");
  w->idx_path = joined(prefix, ".idx");
  char *slash = strrchr(w->bin_path, '/');
  if (slash && slash != w->bin_path) { /* the prefix's directory, made if missing */
    *slash = '\0';
    loom_status st = loom_make_dirs(w->bin_path, "dataset directory", err);
    *slash = '/';
    if (st != LOOM_OK) return st;
  }
  w->bin = fopen(w->bin_tmp, "wb");
  if (!w->bin) return loom_fail(err, LOOM_ERR_WRITE, "%s: cannot create: %s", w->bin_tmp, strerror(errno));
  push(&w->doc_index, &w->documents, &w->doc_cap, 0);
  return LOOM_OK;
}

loom_status loom_indexed_add(loom_indexed_writer *w, const int32_t *ids, size_t count, loom_error *err) {
  if (count > INT32_MAX) return loom_fail(err, LOOM_ERR_USAGE, "%s: a document of %zu tokens is over the format's 2^31", w->bin_path, count);
  size_t wrote;
  if (w->dtype == LOOM_INDEXED_DTYPE_INT32) {
    wrote = fwrite(ids, 4, count, w->bin);
  } else {
    uint16_t buf[4096];
    wrote = 0;
    for (size_t i = 0; i < count;) {
      size_t k = 0;
      for (; k < 4096 && i + k < count; k++) buf[k] = (uint16_t)ids[i + k];
      wrote += fwrite(buf, 2, k, w->bin);
      i += k;
    }
  }
  if (wrote != count) return loom_fail(err, LOOM_ERR_WRITE, "%s: write failed: %s", w->bin_tmp, strerror(errno));
  push(&w->lengths, &w->sequences, &w->cap, (int64_t)count);
  w->tokens += (int64_t)count;
  return LOOM_OK;
}

void loom_indexed_end_document(loom_indexed_writer *w) { push(&w->doc_index, &w->documents, &w->doc_cap, w->sequences); }

loom_status loom_indexed_writer_finish(loom_indexed_writer *w, loom_error *err) {
  const int fail = fflush(w->bin) != 0 || fsync(fileno(w->bin)) != 0;
  fclose(w->bin);
  w->bin = NULL;
  if (fail) {
    unlink(w->bin_tmp);
    return loom_fail(err, LOOM_ERR_WRITE, "%s: write failed: %s", w->bin_tmp, strerror(errno));
  }
  const size_t n = (size_t)w->sequences, item = w->dtype == LOOM_INDEXED_DTYPE_INT32 ? 4 : 2;
  unsigned char header[HEADER_BYTES];
  const uint64_t version = 1, seqs = n, docs = (uint64_t)w->documents;
  memcpy(header, MAGIC, 9);
  memcpy(header + 9, &version, 8);
  header[17] = (unsigned char)w->dtype;
  memcpy(header + 18, &seqs, 8);
  memcpy(header + 26, &docs, 8);
  int32_t *lengths = loom_xmalloc(n * 4 + 1, "index lengths");
  int64_t *pointers = loom_xmalloc(n * 8 + 1, "index pointers");
  int64_t at = 0;
  for (size_t i = 0; i < n; i++) {
    lengths[i] = (int32_t)w->lengths[i];
    pointers[i] = at;
    at += w->lengths[i] * (int64_t)item;
  }
  /* The .bin first: the .idx, written last, is what makes the dataset exist. */
  loom_status st = LOOM_OK;
  if (rename(w->bin_tmp, w->bin_path) != 0) st = loom_fail(err, LOOM_ERR_WRITE, "%s: cannot rename into place: %s", w->bin_path, strerror(errno));
  const loom_chunk chunks[] = {{header, sizeof header}, {lengths, n * 4}, {pointers, n * 8}, {w->doc_index, docs * 8}};
  if (st == LOOM_OK) st = loom_write_file_atomic(w->idx_path, chunks, 4, err);
  free(lengths);
  free(pointers);
  return st;
}

void loom_indexed_writer_free(loom_indexed_writer *w) {
  if (w->bin) {
    fclose(w->bin);
    unlink(w->bin_tmp);
  }
  free(w->bin_path);
  free(w->bin_tmp);
  free(w->idx_path);
  free(w->lengths);
  free(w->doc_index);
  memset(w, 0, sizeof *w);
}
