/* Hugging Face weights read tensor by tensor: model.safetensors, or the
 * shards model.safetensors.index.json lists, every shard checked against
 * the index (hf.h). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "backend/op_math.h"
#include "ckpt/hf.h"
#include "ckpt/hf_deepseek.h"
#include "ckpt/hf_stack.h"
#include "ckpt/safetensors.h"
#include "core/fault.h"
#include "core/json.h"
#include "core/read_file.h"

typedef enum { ST_F32, ST_BF16, ST_F16 } st_dtype;
static const char *const ST_DTYPES[] = {"F32", "BF16", "F16"};
static const size_t ST_SIZES[] = {4, 2, 2};

/* One safetensors file: its header, and where its data starts. */
typedef struct {
  FILE *fp;
  char path[4200];
  const char *name; /* as the index names it (the file name) */
  uint64_t data_start, data_len;
  loom_json header;
  bool parsed;
} st_file;

typedef struct {
  st_file *files;
  int nfiles;
  uint64_t *at;    /* [count] offset of canonical tensor k in its file's data */
  st_dtype *dtype; /* [count] */
  int *file;       /* [count] the file holding it */
} hf_source;

static void join(char *out, size_t n, const char *dir, const char *file) { snprintf(out, n, "%s/%s", dir, file); }

static void free_hf(void *state) {
  hf_source *h = state;
  for (int f = 0; f < h->nfiles; f++) {
    if (h->files[f].fp) fclose(h->files[f].fp);
    if (h->files[f].parsed) loom_json_free(&h->files[f].header);
  }
  free(h->files);
  free(h->at);
  free(h->dtype);
  free(h->file);
  free(h);
}

static float f16_to_f32(uint16_t h) {
  const int exp = h >> 10 & 0x1F, mant = h & 0x3FF;
  const float sign = h & 0x8000 ? -1.0f : 1.0f;
  if (exp == 0) return sign * ldexpf((float)mant, -24);
  if (exp == 31) return mant ? NAN : sign * INFINITY;
  return sign * ldexpf((float)(mant | 0x400), exp - 25);
}

/* Tensor k as loom holds it: read, widened to fp32, transposed back from
 * GPT-2's Conv1D or taken from its expert's slab of a stacked tensor, and
 * its vocab padding zero. */
static loom_status fetch_hf(const loom_model_source *s, int k, float *dst, loom_error *err) {
  const hf_source *h = s->state;
  const st_file *f = &h->files[h->file[k]];
  loom_safetensors_shape e = loom_safetensors_shape_of(&s->cfg, &s->specs[k], &s->meta[k]);
  loom_hf_stack stack;
  const bool stacked = loom_hf_stack_of(s, k, &stack);
  if (stacked) e = (loom_safetensors_shape){stack.rows, stack.cols, false};
  const size_t n = (size_t)e.rows * (size_t)(e.cols ? e.cols : 1), esize = ST_SIZES[h->dtype[k]];
  void *raw = malloc(n * esize + 1);
  float *wide = e.transpose || stacked ? malloc(n * sizeof(float) + 1) : dst;
  loom_status st = LOOM_OK;
  if (!raw || !wide) st = loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory reading %s", f->path, s->specs[k].name);
  else if (fseeko(f->fp, (off_t)(f->data_start + h->at[k]), SEEK_SET) != 0 || fread(raw, esize, n, f->fp) != n)
    st = loom_fail(err, LOOM_ERR_IO, "%s: cannot read %s: %s", f->path, s->specs[k].name,
                   ferror(f->fp) ? strerror(errno) : "the file ends inside it");
  for (size_t i = 0; st == LOOM_OK && i < n; i++) {
    if (h->dtype[k] == ST_F32) memcpy(&wide[i], (char *)raw + 4 * i, 4);
    else {
      uint16_t b;
      memcpy(&b, (char *)raw + 2 * i, 2);
      wide[i] = h->dtype[k] == ST_BF16 ? loom_bf16_value(b) : f16_to_f32(b);
    }
  }
  if (st == LOOM_OK && e.transpose) /* the file's [in, out] into loom's [out, in] */
    for (int64_t i = 0; i < e.rows; i++)
      for (int64_t o = 0; o < e.cols; o++) dst[o * e.rows + i] = wide[i * e.cols + o];
  if (st == LOOM_OK && stacked) loom_hf_stack_take(&stack, wide, dst);
  const size_t whole = loom_tensor_numel(&s->specs[k]);
  if (st == LOOM_OK && !stacked && whole > n) memset(dst + n, 0, (whole - n) * sizeof(float)); /* vocab padding */
  if (st == LOOM_OK) loom_hf_deepseek_rows(&s->cfg, s->specs[k].name, dst, true);
  free(raw);
  if (wide != dst) free(wide);
  return st;
}

/* One entry of a header, checked: dtype, shape and its byte range. */
typedef struct {
  st_dtype dtype;
  int ndim;
  long long shape[3];
  uint64_t begin, end;
  bool used;
} st_entry;

static loom_status read_entry(const char *path, const char *name, const loom_json *v, uint64_t data_len, st_entry *e,
                              loom_error *err) {
  const loom_json *dt = loom_json_get(v, "dtype"), *shape = loom_json_get(v, "shape"), *off = loom_json_get(v, "data_offsets");
  long long begin = -1, end = -1;
  int d = 0;
  while (dt && dt->kind == LOOM_JSON_STRING && d < 3 && strcmp(dt->string, ST_DTYPES[d]) != 0) d++;
  if (!dt || dt->kind != LOOM_JSON_STRING || d == 3)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s has dtype %s; loom reads F32, BF16 and F16", path, name,
                     dt && dt->kind == LOOM_JSON_STRING ? dt->string : "(none)");
  e->dtype = (st_dtype)d;
  if (!shape || shape->kind != LOOM_JSON_ARRAY || shape->count < 1 || shape->count > 3)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s: its shape must list 1 to 3 sizes", path, name);
  e->ndim = (int)shape->count;
  e->shape[1] = e->shape[2] = 1;
  for (int i = 0; i < e->ndim; i++)
    if (!loom_json_int(&shape->items[i], 0, INT_MAX, &e->shape[i]))
      return loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s: a size in its shape is not a count", path, name);
  if (!off || off->kind != LOOM_JSON_ARRAY || off->count != 2 || !loom_json_int(&off->items[0], 0, (long long)data_len, &begin) ||
      !loom_json_int(&off->items[1], begin, (long long)data_len, &end))
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s: data_offsets must be [begin, end] inside the %llu bytes of data",
                     path, name, (unsigned long long)data_len);
  /* each size is below 2^31 and the data below 2^64: the product is checked against the bytes without overflowing */
  const unsigned __int128 bytes = (unsigned __int128)e->shape[0] * (uint64_t)e->shape[1] * (uint64_t)e->shape[2] * ST_SIZES[e->dtype];
  if (bytes != (uint64_t)(end - begin))
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s: %lld bytes of data for its shape's %.0f", path, name, end - begin,
                     (double)bytes);
  e->begin = (uint64_t)begin, e->end = (uint64_t)end;
  return LOOM_OK;
}

/* GPT-2's attention mask buffers, which older files carry beside the weights. */
static bool is_gpt2_buffer(const char *name) {
  const size_t n = strlen(name);
  return (n > 9 && strcmp(name + n - 9, ".attn.bias") == 0) || (n > 16 && strcmp(name + n - 16, ".attn.masked_bias") == 0);
}

/* The header entry of canonical tensor k: its own name, or under GPT-2 also with transformers' "transformer." prefix. */
static int entry_of(const loom_json *header, const char *name, bool gpt2) {
  char prefixed[LOOM_NAME_LEN + 48];
  snprintf(prefixed, sizeof prefixed, "transformer.%s", name);
  for (size_t i = 0; i < header->count; i++)
    if (strcmp(header->keys[i], name) == 0 || (gpt2 && strcmp(header->keys[i], prefixed) == 0)) return (int)i;
  return -1;
}

/* A tensor's byte range in the data, and its place in the header. */
typedef struct {
  uint64_t begin, end;
  size_t key;
} st_range;

static int by_begin(const void *a, const void *b) {
  const uint64_t x = ((const st_range *)a)->begin, y = ((const st_range *)b)->begin;
  return x < y ? -1 : x > y;
}

/* No two tensors of a file share bytes (the safetensors library refuses such files too). */
static loom_status refuse_overlaps(const char *path, const loom_json *header, const st_entry *entries, loom_error *err) {
  st_range *r = loom_fault_calloc(header->count + 1, sizeof *r);
  if (!r) return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
  size_t n = 0;
  for (size_t i = 0; i < header->count; i++)
    if (entries[i].end > entries[i].begin) r[n++] = (st_range){entries[i].begin, entries[i].end, i};
  qsort(r, n, sizeof *r, by_begin);
  loom_status st = LOOM_OK;
  for (size_t i = 1; i < n && st == LOOM_OK; i++)
    if (r[i].begin < r[i - 1].end)
      st = loom_fail(err, LOOM_ERR_FORMAT, "%s: tensors %s and %s overlap in the data (data_offsets [%llu, %llu] and [%llu, %llu])",
                     path, header->keys[r[i - 1].key], header->keys[r[i].key], (unsigned long long)r[i - 1].begin,
                     (unsigned long long)r[i - 1].end, (unsigned long long)r[i].begin, (unsigned long long)r[i].end);
  free(r);
  return st;
}

/* Opens a file and parses its header. */
static loom_status open_file(st_file *f, loom_error *err) {
  loom_status st = loom_open_for_reading(f->path, "safetensors file", &f->fp, err);
  if (st != LOOM_OK) return st;
  uint8_t len8[8];
  struct stat info;
  if (fstat(fileno(f->fp), &info) != 0 || fread(len8, 1, 8, f->fp) != 8)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: shorter than a safetensors header", f->path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
  const uint64_t size = (uint64_t)info.st_size;
  if (n < 2 || n > (100u << 20) || n > size - 8)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: header length %llu does not fit the %llu-byte file (at most 100 MiB)", f->path,
                     (unsigned long long)n, (unsigned long long)size);
  char *text = loom_fault_malloc(n + 1);
  if (!text) return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", f->path);
  if (fread(text, 1, n, f->fp) != n) st = loom_fail(err, LOOM_ERR_IO, "%s: cannot read its header", f->path);
  if (st == LOOM_OK) st = loom_json_parse(text, n, f->path, &f->header, err);
  free(text);
  if (st != LOOM_OK) return st;
  f->parsed = true;
  if (f->header.kind != LOOM_JSON_OBJECT) return loom_fail(err, LOOM_ERR_FORMAT, "%s: its header is not a JSON object", f->path);
  f->data_start = 8 + n;
  f->data_len = size - 8 - n;
  return LOOM_OK;
}

/* The files of a sharded model: the index's weight_map values, each once,
 * in the order the index first names them. A name is a file in the
 * directory, nothing else (no path into another). */
static loom_status index_files(hf_source *h, const char *dir, const char *path, const loom_json *map, loom_error *err) {
  h->files = loom_fault_calloc(map->count + 1, sizeof *h->files);
  if (!h->files) return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
  for (size_t i = 0; i < map->count; i++) {
    const loom_json *v = &map->items[i];
    if (v->kind != LOOM_JSON_STRING || !v->string[0] || strchr(v->string, '/') || strlen(v->string) != v->length ||
        strcmp(v->string, ".") == 0 || strcmp(v->string, "..") == 0)
      return loom_fail(err, LOOM_ERR_FORMAT, "%s: weight_map puts %s in something that is not a file name in the directory",
                       path, map->keys[i]);
    int f = 0;
    while (f < h->nfiles && strcmp(h->files[f].name, v->string) != 0) f++;
    if (f < h->nfiles) continue;
    h->files[f].name = v->string;
    join(h->files[f].path, sizeof h->files[f].path, dir, v->string);
    h->nfiles++;
  }
  if (h->nfiles == 0) return loom_fail(err, LOOM_ERR_FORMAT, "%s: weight_map names no tensor", path);
  return LOOM_OK;
}

/* "[a, b, c]" */
static const char *shape_text(const long long *shape, int ndim, char *buf, size_t n) {
  size_t used = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < ndim && used < n; d++) used += (size_t)snprintf(buf + used, n - used, "%s%lld", d ? ", " : "", shape[d]);
  if (used < n) snprintf(buf + used, n - used, "]");
  return buf;
}

/* The shape canonical tensor k's entry in the file has: its own (transposed for GPT-2's Conv1D, without vocab
 * padding), or its stacked tensor's ([E, rows, cols], a bias's [E, cols]). */
static void file_shape(const loom_model_source *s, int k, const loom_hf_stack *stack, long long *shape, int *ndim) {
  if (stack) {
    shape[0] = stack->experts, shape[1] = stack->matrix ? stack->rows : stack->cols, shape[2] = stack->cols;
    *ndim = stack->matrix ? 3 : 2;
    return;
  }
  const loom_safetensors_shape e = loom_safetensors_shape_of(&s->cfg, &s->specs[k], &s->meta[k]);
  shape[0] = e.rows, shape[1] = e.cols;
  *ndim = e.cols ? 2 : 1;
}

/* Every file's entries, checked; then each tensor of the model found in
 * exactly one file, in dtype and shape; none left over. */
static loom_status match_files(loom_model_source *s, hf_source *h, const char *where, const loom_json *map,
                               st_entry **entries, loom_error *err) {
  loom_status st = LOOM_OK;
  for (int f = 0; f < h->nfiles && st == LOOM_OK; f++) {
    const st_file *file = &h->files[f];
    entries[f] = loom_fault_calloc(file->header.count + 1, sizeof **entries);
    if (!entries[f]) return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", file->path);
    for (size_t i = 0; i < file->header.count && st == LOOM_OK; i++) {
      if (strcmp(file->header.keys[i], "__metadata__") == 0) entries[f][i].used = true;
      else st = read_entry(file->path, file->header.keys[i], &file->header.items[i], file->data_len, &entries[f][i], err);
    }
    if (st == LOOM_OK) st = refuse_overlaps(file->path, &file->header, entries[f], err);
  }
  const bool gpt2 = loom_gpt_config_is_gpt2(&s->cfg);
  for (int k = 0; k < s->count && st == LOOM_OK; k++) {
    const char *name = s->specs[k].name;
    char hf_name[LOOM_NAME_LEN + 32];
    long long want[3];
    int ndim;
    loom_hf_stack stack;
    const bool stacked = loom_hf_stack_of(s, k, &stack);
    const char *file_name = stacked ? stack.name : loom_hf_tensor_name(&s->cfg, name, hf_name, sizeof hf_name);
    file_shape(s, k, stacked ? &stack : NULL, want, &ndim);
    int found = -1, at = -1;
    for (int f = 0; f < h->nfiles && st == LOOM_OK; f++) {
      const int i = entry_of(&h->files[f].header, file_name, gpt2);
      if (i < 0) continue;
      if (found >= 0)
        st = loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s is in both %s and %s", where, name, h->files[found].path,
                       h->files[f].path);
      found = f, at = i;
    }
    if (st != LOOM_OK) break;
    if (found < 0) {
      const loom_json *listed = map ? loom_json_get(map, file_name) : NULL;
      if (listed && listed->kind == LOOM_JSON_STRING) /* index_files checked every entry names a shard */
        st = loom_fail(err, LOOM_ERR_FORMAT, "%s: the index puts tensor %s in %s, which does not hold it", where, file_name,
                       listed->string);
      else st = loom_fail(err, LOOM_ERR_FORMAT, "%s: missing tensor %s", where, stacked ? file_name : name);
      break;
    }
    st_entry *e = &entries[found][at];
    bool same = e->ndim == ndim;
    for (int d = 0; d < ndim && same; d++) same = e->shape[d] == want[d];
    if (!same) {
      char has[96], needs[96];
      st = loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s has shape %s; the config's model needs %s", h->files[found].path,
                     file_name == name ? name : file_name, shape_text(e->shape, e->ndim, has, sizeof has),
                     shape_text(want, ndim, needs, sizeof needs));
    }
    e->used = true;
    /* a stacked piece starts at its expert's slab */
    h->at[k] = e->begin + (stacked ? (uint64_t)(stack.piece / stack.per_expert) * (uint64_t)(stack.rows * stack.cols) *
                                         ST_SIZES[e->dtype]
                                   : 0);
    h->dtype[k] = e->dtype;
    h->file[k] = found;
  }
  for (int f = 0; f < h->nfiles && st == LOOM_OK; f++)
    for (size_t i = 0; i < h->files[f].header.count && st == LOOM_OK; i++)
      if (!entries[f][i].used && !(gpt2 && is_gpt2_buffer(h->files[f].header.keys[i])))
        st = loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s is not part of the model config.json describes", h->files[f].path,
                       h->files[f].header.keys[i]);
  return st;
}

/* The shards against their index: each file holds exactly the tensors the
 * index puts in it, and their bytes (the entries match_files read) add up
 * to metadata.total_size. */
static loom_status match_index(const hf_source *h, st_entry *const *entries, const char *path, const loom_json *map,
                               long long total, loom_error *err) {
  unsigned long long held = 0;
  for (int f = 0; f < h->nfiles; f++) {
    const st_file *file = &h->files[f];
    for (size_t i = 0; i < file->header.count; i++) {
      const char *key = file->header.keys[i];
      if (strcmp(key, "__metadata__") == 0) continue;
      const loom_json *v = loom_json_get(map, key);
      if (!v) return loom_fail(err, LOOM_ERR_FORMAT, "%s: %s holds tensor %s, which the index does not list", path, file->path, key);
      if (strcmp(v->string, file->name) != 0)
        return loom_fail(err, LOOM_ERR_FORMAT, "%s: the index puts tensor %s in %s, but %s holds it", path, key, v->string,
                         file->path);
      held += entries[f][i].end - entries[f][i].begin;
    }
  }
  for (size_t i = 0; i < map->count; i++) {
    int f = 0;
    while (strcmp(h->files[f].name, map->items[i].string) != 0) f++;
    if (!loom_json_get(&h->files[f].header, map->keys[i]))
      return loom_fail(err, LOOM_ERR_FORMAT, "%s: the index puts tensor %s in %s, which does not hold it", path, map->keys[i],
                       h->files[f].path);
  }
  if (held != (unsigned long long)total)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: metadata.total_size is %lld bytes, but the shards hold %llu", path, total, held);
  return LOOM_OK;
}

/* The weights' files: the index's shards where there is an index, else
 * model.safetensors alone; opened, and matched against the model. */
static loom_status read_weights(loom_model_source *s, hf_source *h, const char *dir, loom_error *err) {
  char path[4200];
  join(path, sizeof path, dir, LOOM_HF_INDEX);
  loom_json index = {0};
  const loom_json *map = NULL;
  long long total = 0;
  loom_status st = LOOM_OK;
  const bool sharded = access(path, F_OK) == 0;
  char single[4200];
  join(single, sizeof single, dir, LOOM_HF_WEIGHTS);
  /* transformers reads model.safetensors where both are, and loom once read the shards: which was meant cannot be known. */
  if (sharded && access(single, F_OK) == 0)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: holds both %s and %s (with its shards): transformers reads %s and ignores the "
                     "shards, so which weights are meant is ambiguous; remove the one that is stale", dir, LOOM_HF_WEIGHTS,
                     LOOM_HF_INDEX, LOOM_HF_WEIGHTS);
  if (sharded) {
    char *text = NULL;
    size_t len = 0;
    st = loom_read_small_file(path, "safetensors index", 64 << 20, &text, &len, err);
    if (st == LOOM_OK) st = loom_json_parse(text, len, path, &index, err);
    free(text);
    if (st != LOOM_OK) return st;
    map = loom_json_get(&index, "weight_map");
    const loom_json *meta = loom_json_get(&index, "metadata"), *size = meta ? loom_json_get(meta, "total_size") : NULL;
    if (index.kind != LOOM_JSON_OBJECT || !map || map->kind != LOOM_JSON_OBJECT)
      st = loom_fail(err, LOOM_ERR_FORMAT, "%s: not an index of safetensors shards (no weight_map object)", path);
    else if (!size || !loom_json_int(size, 0, LLONG_MAX, &total))
      st = loom_fail(err, LOOM_ERR_FORMAT, "%s: metadata.total_size must be the shards' byte count", path);
    if (st == LOOM_OK) st = index_files(h, dir, path, map, err);
  } else {
    h->files = loom_fault_calloc(1, sizeof *h->files);
    if (!h->files) return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", dir);
    h->nfiles = 1;
    h->files[0].name = LOOM_HF_WEIGHTS;
    join(h->files[0].path, sizeof h->files[0].path, dir, LOOM_HF_WEIGHTS);
    snprintf(path, sizeof path, "%s", h->files[0].path);
  }
  for (int f = 0; f < h->nfiles && st == LOOM_OK; f++) st = open_file(&h->files[f], err);
  st_entry **entries = loom_fault_calloc((size_t)h->nfiles + 1, sizeof *entries);
  if (st == LOOM_OK && !entries) st = loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", dir);
  if (st == LOOM_OK) st = match_files(s, h, path, map, entries, err);
  if (st == LOOM_OK && map) st = match_index(h, entries, path, map, total, err);
  for (int f = 0; entries && f < h->nfiles; f++) free(entries[f]);
  free(entries);
  if (sharded) loom_json_free(&index);
  return st;
}

loom_status loom_hf_source(loom_model_source *s, const char *dir, loom_error *err) {
  memset(s, 0, sizeof *s);
  loom_gpt_config cfg;
  loom_status st = loom_hf_read_config(dir, &cfg, err);
  if (st != LOOM_OK) return st;
  hf_source *h = loom_fault_calloc(1, sizeof *h);
  if (!h) return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", dir);
  s->cfg = cfg;
  s->state = h;
  s->free_state = free_hf;
  s->fetch = fetch_hf;
  st = loom_model_source_make_table(s, dir, err);
  if (st == LOOM_OK) st = loom_hf_deepseek_extend_table(s, dir, err); /* DeepSeek-V3's tensors beyond loom's table */
  h->at = loom_fault_calloc((size_t)s->count + 1, sizeof *h->at);
  h->dtype = loom_fault_calloc((size_t)s->count + 1, sizeof *h->dtype);
  h->file = loom_fault_calloc((size_t)s->count + 1, sizeof *h->file);
  if (st == LOOM_OK && (!h->at || !h->dtype || !h->file)) st = loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", dir);
  if (st == LOOM_OK) st = read_weights(s, h, dir, err);
  if (st != LOOM_OK) loom_model_source_free(s);
  return st;
}
