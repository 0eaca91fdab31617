/* safetensors export of a whole GPT-2 model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt/safetensors.h"
#include "core/write_file.h"

/* A tensor as exported: shape, and its values in export order. */
typedef struct {
  const char *name;
  int64_t rows, cols; /* cols 0: a vector */
  float *data;        /* owned when transposed, else points into the model */
  bool owned;
} exported;

/* Block matrices are Conv1D in GPT-2: [in, out], the transpose of loom's. */
static exported export_tensor(const loom_gpt_params *p, int k) {
  const loom_tensor *v = &p->params.views[k];
  exported e = {v->name, v->shape[0], v->ndim == 2 ? v->shape[1] : 0, v->data, false};
  if (strcmp(v->name, "wte.weight") == 0) e.rows = p->cfg.vocab; /* drop the padding rows */
  if (v->ndim == 2 && strncmp(v->name, "h.", 2) == 0) {
    e.rows = v->shape[1];
    e.cols = v->shape[0];
    e.data = malloc((size_t)(e.rows * e.cols) * sizeof(float));
    e.owned = true;
    const float *src = v->data;
    for (int64_t i = 0; i < e.cols; i++)
      for (int64_t j = 0; j < e.rows; j++) e.data[j * e.cols + i] = src[i * e.rows + j];
  }
  return e;
}

loom_status loom_safetensors_write(const char *path, const loom_gpt_params *p, loom_error *err) {
  const int n = p->params.count;
  exported *t = calloc((size_t)n, sizeof *t);
  loom_chunk *chunks = calloc((size_t)n + 2, sizeof *chunks);
  size_t cap = 256 + (size_t)n * 160, len = 0;
  char *json = malloc(cap);
  if (!t || !chunks || !json) {
    free(t);
    free(chunks);
    free(json);
    return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory writing safetensors", path);
  }
  len += (size_t)snprintf(json + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
  uint64_t offset = 0;
  for (int k = 0; k < n; k++) {
    t[k] = export_tensor(p, k);
    const uint64_t bytes = (uint64_t)(t[k].rows * (t[k].cols ? t[k].cols : 1)) * sizeof(float);
    char shape[64];
    if (t[k].cols) snprintf(shape, sizeof shape, "%lld,%lld", (long long)t[k].rows, (long long)t[k].cols);
    else snprintf(shape, sizeof shape, "%lld", (long long)t[k].rows);
    len += (size_t)snprintf(json + len, cap - len, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%s],\"data_offsets\":[%llu,%llu]}",
                            t[k].name, shape, (unsigned long long)offset, (unsigned long long)(offset + bytes));
    chunks[k + 2] = (loom_chunk){t[k].data, bytes};
    offset += bytes;
  }
  len += (size_t)snprintf(json + len, cap - len, "}");
  while (len % 8) json[len++] = ' '; /* the data starts 8-byte aligned */
  const uint64_t header = len;
  chunks[0] = (loom_chunk){&header, 8};
  chunks[1] = (loom_chunk){json, len};
  const loom_status st = loom_write_file_atomic(path, chunks, n + 2, err);
  for (int k = 0; k < n; k++)
    if (t[k].owned) free(t[k].data);
  free(t);
  free(chunks);
  free(json);
  return st;
}
