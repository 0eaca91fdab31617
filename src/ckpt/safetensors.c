/* safetensors export of a whole GPT-2 model, one tensor in memory at a time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt/hf.h"
#include "ckpt/hf_deepseek.h"
#include "ckpt/hf_stack.h"
#include "ckpt/safetensors.h"
#include "core/check.h"
#include "core/write_file.h"

loom_safetensors_shape loom_safetensors_shape_of(const loom_gpt_config *cfg, const loom_tensor *spec,
                                                 const loom_param_meta *meta) {
  loom_safetensors_shape e = {spec->shape[0], spec->ndim == 2 ? spec->shape[1] : 0, false};
  if (meta->init_rows > 0 && meta->init_rows < e.rows) e.rows = meta->init_rows; /* vocab padding stays behind */
  if (spec->ndim == 2 && loom_gpt_config_is_gpt2(cfg) && meta->role < LOOM_BLOCK_VIEWS) /* GPT-2's Conv1D: [in, out] */
    e = (loom_safetensors_shape){spec->shape[1], spec->shape[0], true};
  return e;
}

typedef loom_safetensors_shape exported;

static exported shape_of(const loom_model_source *src, int k) {
  return loom_safetensors_shape_of(&src->cfg, &src->specs[k], &src->meta[k]);
}

static uint64_t bytes_of(exported e, loom_dtype dtype) {
  return (uint64_t)(e.rows * (e.cols ? e.cols : 1)) * loom_dtype_size(dtype);
}

uint64_t loom_safetensors_bytes(const loom_model_source *src, int k, loom_dtype dtype) {
  return bytes_of(shape_of(src, k), dtype);
}

typedef struct {
  const loom_model_source *src;
  int last;        /* the tensors written end before it */
  int k, expert;   /* the next tensor, and where it is stacked (hf), the next expert's slab of it */
  bool hf;
  const uint64_t *header_len;
  const char *json;
  float *fetched, *out;
  loom_dtype dtype;
} st_writer;

/* Whether tensor k is a piece of a tensor stacked in the file (hf_stack.h); where, into s. */
static bool stacked(const st_writer *w, int k, loom_hf_stack *s) { return w->hf && loom_hf_stack_of(w->src, k, s); }

/* The next expert's slab of the stacked tensor at w->k: its pieces fetched and put in their columns. */
static int next_slab(st_writer *w, const loom_hf_stack *s, loom_chunk *chunk, loom_status *st, loom_error *err) {
  for (int j = 0; j < s->per_expert; j++) {
    loom_hf_stack piece = *s;
    piece.piece = w->expert * s->per_expert + j;
    *st = w->src->fetch(w->src, s->first + piece.piece, w->fetched, err);
    if (*st != LOOM_OK) return 0;
    loom_hf_stack_put(&piece, w->fetched, w->out);
  }
  *chunk = (loom_chunk){w->out, loom_export_values(w->out, (size_t)(s->rows * s->cols), w->dtype)};
  if (++w->expert == s->experts) w->expert = 0, w->k = s->first + s->count;
  return 1;
}

static int next_chunk(void *ctx, int i, loom_chunk *chunk, loom_status *st, loom_error *err) {
  st_writer *w = ctx;
  if (i == 0) *chunk = (loom_chunk){w->header_len, 8};
  else if (i == 1) *chunk = (loom_chunk){w->json, (size_t)*w->header_len};
  if (i < 2) return 1;
  if (w->k >= w->last) return 0;
  loom_hf_stack s;
  if (stacked(w, w->k, &s)) return next_slab(w, &s, chunk, st, err);
  const int k = w->k++;
  const exported e = shape_of(w->src, k);
  *st = w->src->fetch(w->src, k, w->fetched, err);
  if (*st != LOOM_OK) return 0;
  if (w->hf) loom_hf_deepseek_rows(&w->src->cfg, w->src->specs[k].name, w->fetched, false);
  float *data = w->fetched;
  if (e.transpose) {
    for (int64_t i_out = 0; i_out < e.cols; i_out++) /* loom's [cols of e][rows of e] */
      for (int64_t j = 0; j < e.rows; j++) w->out[j * e.cols + i_out] = w->fetched[i_out * e.rows + j];
    data = w->out;
  }
  *chunk = (loom_chunk){data, loom_export_values(data, (size_t)(e.rows * (e.cols ? e.cols : 1)), w->dtype)};
  return 1;
}

loom_status loom_safetensors_write(const char *path, const loom_model_source *src, int first, int last, loom_dtype dtype, bool hf,
                                   loom_error *err) {
  size_t cap = 256 + (size_t)(last - first) * 160, len = 0;
  char *json = malloc(cap);
  const size_t most = loom_model_source_max_numel(src) + 1;
  /* out: a transposed tensor, or a stacked tensor's slab (an expert's gate and up at most) */
  float *fetched = malloc(most * sizeof(float)), *out = malloc(2 * most * sizeof(float));
  loom_status st = LOOM_OK;
  st_writer w = {src, last, first, 0, hf, NULL, json, fetched, out, dtype};
  if (!json || !fetched || !out) {
    st = loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory writing safetensors", path);
  } else {
    len += (size_t)snprintf(json + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t offset = 0;
    for (int k = first; k < last; k++) {
      const exported e = shape_of(src, k);
      char shape[96], name[LOOM_NAME_LEN + 32];
      const char *called = hf ? loom_hf_tensor_name(&src->cfg, src->specs[k].name, name, sizeof name) : src->specs[k].name;
      uint64_t bytes = bytes_of(e, dtype);
      loom_hf_stack s;
      if (stacked(&w, k, &s)) { /* one entry for the run, at its first piece */
        LOOM_CHECK(s.first >= first && s.first + s.count <= last, "a stacked tensor lies whole in one file");
        if (s.piece > 0) continue;
        snprintf(name, sizeof name, "%s", s.name);
        called = name;
        if (s.matrix) snprintf(shape, sizeof shape, "%d,%lld,%lld", s.experts, (long long)s.rows, (long long)s.cols);
        else snprintf(shape, sizeof shape, "%d,%lld", s.experts, (long long)s.cols);
        bytes = (uint64_t)s.experts * (uint64_t)(s.rows * s.cols) * loom_dtype_size(dtype);
      } else if (e.cols) {
        snprintf(shape, sizeof shape, "%lld,%lld", (long long)e.rows, (long long)e.cols);
      } else {
        snprintf(shape, sizeof shape, "%lld", (long long)e.rows);
      }
      len += (size_t)snprintf(json + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%llu,%llu]}",
                              called, dtype == LOOM_DTYPE_BF16 ? "BF16" : "F32", shape, (unsigned long long)offset,
                              (unsigned long long)(offset + bytes));
      offset += bytes;
    }
    len += (size_t)snprintf(json + len, cap - len, "}");
    while (len % 8) json[len++] = ' '; /* the data starts 8-byte aligned */
    const uint64_t header = len;
    w.header_len = &header;
    st = loom_write_file_atomic_stream(path, next_chunk, &w, err);
  }
  free(json);
  free(fetched);
  free(out);
  return st;
}
