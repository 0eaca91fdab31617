/* The canonical parameter table of GPT-2 and its initialisation. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "core/rng.h"
#include "layers/gpt_params.h"

typedef struct {
  loom_tensor *specs;
  loom_param_meta *meta;
  int count;
} table;

static void add(table *t, const char *name, int ndim, int64_t d0, int64_t d1, loom_param_meta m) {
  const int64_t shape[2] = {d0, d1};
  t->specs[t->count] = loom_tensor_spec(name, LOOM_DTYPE_F32, ndim, shape);
  m.init_rows = m.init_rows ? m.init_rows : (int)d0;
  t->meta[t->count] = m;
  t->count++;
}

static const loom_param_meta NORM_W = {.init = LOOM_INIT_ONES, .partition_dim = -1, .tp_replicated = true};
static const loom_param_meta ZERO_B = {.init = LOOM_INIT_ZEROS, .partition_dim = -1, .tp_replicated = true};

/* A [rows, cols] weight with GPT-2's normal init, split along `dim` under TP. */
static loom_param_meta weight(float std, int dim) {
  return (loom_param_meta){.init = LOOM_INIT_NORMAL, .init_std = std, .weight_decay = true,
                           .partition_dim = dim};
}

static void add_block(table *t, int i, const loom_gpt_config *c) {
  const int64_t h = c->hidden, f = c->ffn;
  const float resid_std = 0.02f / sqrtf(2.0f * (float)c->layers);
  const loom_param_meta col_bias = {.init = LOOM_INIT_ZEROS, .partition_dim = 0};
  char n[LOOM_NAME_LEN];
#define NAME(suffix) (snprintf(n, sizeof n, "h.%d." suffix, i), n)
  add(t, NAME("ln_1.weight"), 1, h, 0, NORM_W);
  add(t, NAME("ln_1.bias"), 1, h, 0, ZERO_B);
  add(t, NAME("attn.c_attn.weight"), 2, 3 * h, h, weight(0.02f, 0));
  add(t, NAME("attn.c_attn.bias"), 1, 3 * h, 0, col_bias);
  add(t, NAME("attn.c_proj.weight"), 2, h, h, weight(resid_std, 1));
  add(t, NAME("attn.c_proj.bias"), 1, h, 0, ZERO_B);
  add(t, NAME("ln_2.weight"), 1, h, 0, NORM_W);
  add(t, NAME("ln_2.bias"), 1, h, 0, ZERO_B);
  add(t, NAME("mlp.c_fc.weight"), 2, f, h, weight(0.02f, 0));
  add(t, NAME("mlp.c_fc.bias"), 1, f, 0, col_bias);
  add(t, NAME("mlp.c_proj.weight"), 2, h, f, weight(resid_std, 1));
  add(t, NAME("mlp.c_proj.bias"), 1, h, 0, ZERO_B);
#undef NAME
}

/* Points a struct of views at consecutive tensors of a buffer. */
static void bind(loom_gpt_weights *w, const loom_buffer *b, int layers) {
  int k = 0;
  w->wte = b->views[k++].data;
  w->wpe = b->views[k++].data;
  for (int i = 0; i < layers; i++) {
    float **slot = (float **)&w->h[i];
    for (int j = 0; j < LOOM_BLOCK_TENSORS; j++) slot[j] = b->views[k++].data;
  }
  w->ln_f_w = b->views[k++].data;
  w->ln_f_b = b->views[k++].data;
}

loom_status loom_gpt_params_init(loom_gpt_params *p, const loom_gpt_config *cfg) {
  memset(p, 0, sizeof *p);
  p->cfg = *cfg;
  const int count = 4 + LOOM_BLOCK_TENSORS * cfg->layers;
  table t = {loom_xcalloc((size_t)count, sizeof(loom_tensor), "param specs"),
             loom_xcalloc((size_t)count, sizeof(loom_param_meta), "param meta"), 0};
  loom_param_meta wte = weight(0.02f, 0);
  wte.init_rows = cfg->vocab; /* padded rows stay zero and never reach the loss */
  wte.shared = true;
  add(&t, "wte.weight", 2, cfg->padded_vocab, cfg->hidden, wte);
  add(&t, "wpe.weight", 2, cfg->seq, cfg->hidden, weight(0.02f, -1));
  for (int i = 0; i < cfg->layers; i++) add_block(&t, i, cfg);
  add(&t, "ln_f.weight", 1, cfg->hidden, 0, NORM_W);
  add(&t, "ln_f.bias", 1, cfg->hidden, 0, ZERO_B);
  LOOM_CHECK(t.count == count, "parameter table size");

  p->meta = t.meta;
  p->w.h = loom_xcalloc((size_t)cfg->layers, sizeof(loom_block_weights), "block views");
  p->g.h = loom_xcalloc((size_t)cfg->layers, sizeof(loom_block_weights), "block views");
  loom_status st = loom_buffer_init(&p->params, t.specs, count);
  if (st == LOOM_OK) st = loom_buffer_init(&p->grads, t.specs, count);
  free(t.specs);
  if (st != LOOM_OK) {
    loom_gpt_params_free(p);
    return st;
  }
  bind(&p->w, &p->params, cfg->layers);
  bind(&p->g, &p->grads, cfg->layers);
  return LOOM_OK;
}

void loom_gpt_params_free(loom_gpt_params *p) {
  loom_buffer_free(&p->params);
  loom_buffer_free(&p->grads);
  free(p->meta);
  free(p->w.h);
  free(p->g.h);
  memset(p, 0, sizeof *p);
}

void loom_gpt_params_randomize(loom_gpt_params *p, uint64_t seed) {
  for (int i = 0; i < p->params.count; i++) {
    loom_tensor *t = &p->params.views[i];
    const loom_param_meta *m = &p->meta[i];
    float *data = t->data;
    const size_t n = loom_tensor_numel(t);
    const size_t cols = t->ndim == 2 ? (size_t)t->shape[1] : 1;
    const size_t drawn = m->init_rows * cols;
    switch (m->init) {
    case LOOM_INIT_ZEROS: memset(data, 0, n * sizeof(float)); break;
    case LOOM_INIT_ONES: for (size_t k = 0; k < n; k++) data[k] = 1.0f; break;
    case LOOM_INIT_NORMAL:
      loom_rng_fill_normal(data, drawn, seed, loom_hash_str(t->name), 0, 0.0f, m->init_std);
      memset(data + drawn, 0, (n - drawn) * sizeof(float));
      break;
    }
  }
}

int loom_gpt_params_find(const loom_gpt_params *p, const char *name) {
  for (int i = 0; i < p->params.count; i++)
    if (strcmp(p->params.views[i].name, name) == 0) return i;
  return -1;
}

size_t loom_gpt_param_count(const loom_gpt_config *c) {
  const size_t h = (size_t)c->hidden, f = (size_t)c->ffn;
  const size_t block = 4 * h /* norms */ + 3 * h * h + 3 * h + h * h + h + f * h + f + h * f + h;
  return (size_t)c->padded_vocab * h + (size_t)c->seq * h + (size_t)c->layers * block + 2 * h;
}
