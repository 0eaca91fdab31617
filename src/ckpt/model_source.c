/* Model sources: in memory, or assembled from a checkpoint tensor by tensor. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt/assemble.h"
#include "ckpt/manifest.h"
#include "backend/op_math.h"
#include "ckpt/model_source.h"
#include "core/fault.h"
#include "core/log.h"

static loom_status fetch_params(const loom_model_source *s, int k, float *dst, loom_error *err) {
  (void)err;
  memcpy(dst, s->specs[k].data, loom_tensor_bytes(&s->specs[k]));
  return LOOM_OK;
}

void loom_model_source_of_params(loom_model_source *s, const loom_gpt_params *p) {
  memset(s, 0, sizeof *s);
  s->cfg = p->cfg;
  s->count = p->params.count;
  s->specs = p->params.views;
  s->meta = p->meta;
  s->fetch = fetch_params;
}

typedef struct {
  char step_dir[4096];
  Loom__CheckpointManifest *mf;
} ckpt_state;

/* Tensor k as one wanted piece (its whole global block), filled from the shard files that hold it. */
static loom_status fetch_ckpt(const loom_model_source *s, int k, float *dst, loom_error *err) {
  const ckpt_state *c = s->state;
  const loom_param_meta *m = &s->meta[k];
  loom_ckpt_want want = {.valid_rows = m->init_rows > 0 ? m->init_rows : m->layout.rows, .padded = m->init_rows > 0};
  loom_shard_tensor *t = &want.t;
  snprintf(t->name, sizeof t->name, "param/%s", s->specs[k].name);
  t->ndim = 2;
  t->global[0] = t->local[0] = m->layout.rows;
  t->global[1] = t->local[1] = m->layout.cols;
  loom_shard_set_whole(t);
  t->data = dst;
  loom_want_index *ix = loom_want_index_build(&want, 1);
  char **paths;
  int npaths;
  loom_status st = loom_manifest_paths(c->step_dir, c->mf, ix, &paths, &npaths, err);
  if (st == LOOM_OK) st = loom_ckpt_assemble(c->step_dir, paths, npaths, &want, 1, err);
  if (paths) loom_manifest_paths_free(paths, c->mf->n_shards);
  loom_want_index_free(ix);
  return st;
}

static loom_status ckpt_expert_bias(const loom_model_source *s, float *bias, size_t count, loom_error *err) {
  const ckpt_state *c = s->state;
  return loom_manifest_expert_bias(c->step_dir, c->mf, bias, count, err);
}

static void free_ckpt_state(void *state) {
  ckpt_state *c = state;
  loom__checkpoint_manifest__free_unpacked(c->mf, NULL);
  free(c);
}

loom_status loom_model_source_of_ckpt(loom_model_source *s, const char *dir, loom_error *err) {
  memset(s, 0, sizeof *s);
  ckpt_state *c = calloc(1, sizeof *c);
  loom_status st = c ? loom_manifest_read(dir, c->step_dir, sizeof c->step_dir, &c->mf, err)
                     : loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", dir);
  if (st != LOOM_OK) {
    free(c);
    return st;
  }
  loom_ckpt_run run;
  loom_manifest_run(c->mf, &run);
  s->cfg = run.cfg;
  s->fetch = fetch_ckpt;
  s->expert_bias = ckpt_expert_bias;
  s->free_state = free_ckpt_state;
  s->state = c;
  st = loom_model_source_make_table(s, dir, err);
  if (st != LOOM_OK) loom_model_source_free(s);
  return st;
}

loom_status loom_model_source_expert_bias(const loom_model_source *s, const char *where, float *bias, size_t count,
                                          loom_error *err) {
  if (s->expert_bias) return s->expert_bias(s, bias, count, err);
  if (count) {
    memset(bias, 0, count * sizeof *bias);
    loom_log_info("%s: a model file holds no expert bias (only a loom checkpoint or a DeepSeek-V3 directory does); it starts from 0", where);
  }
  return LOOM_OK;
}

loom_status loom_model_source_make_table(loom_model_source *s, const char *where, loom_error *err) {
  const int count = loom_gpt_param_table(&s->cfg, NULL, 0, 1, NULL, NULL);
  s->own_specs = loom_fault_calloc((size_t)count + 1, sizeof *s->own_specs);
  s->own_meta = loom_fault_calloc((size_t)count + 1, sizeof *s->own_meta);
  if (!s->own_specs || !s->own_meta) return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", where);
  loom_gpt_param_table(&s->cfg, NULL, 0, 1, s->own_specs, s->own_meta);
  s->count = count;
  s->specs = s->own_specs;
  s->meta = s->own_meta;
  return LOOM_OK;
}

void loom_model_source_free(loom_model_source *s) {
  if (s->free_state && s->state) s->free_state(s->state);
  free(s->own_specs);
  free(s->own_meta);
  memset(s, 0, sizeof *s);
}

/* Tensor i into a run: a NaN or Inf weight is refused here, naming the
 * tensor, rather than found later as a NaN loss blamed on the learning rate. */
static loom_status load_tensor(const loom_piece_source *p, int i, float *dst, loom_error *err) {
  const loom_model_source *s = p->ctx;
  const loom_status st = s->fetch(s, i, dst, err);
  const size_t n = loom_tensor_numel(&s->specs[i]);
  for (size_t j = 0; st == LOOM_OK && j < n; j++)
    if (!isfinite(dst[j]))
      return loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s holds %s at element %zu; a model with non-finite weights "
                       "cannot be trained or evaluated", p->where ? p->where : "model", s->specs[i].name,
                       isnan(dst[j]) ? "a NaN" : "an infinity", j);
  return st;
}

loom_status loom_model_source_pieces(const loom_model_source *s, const char *where, loom_piece_source *out,
                                     loom_error *err) {
  loom_shard_tensor *pieces = loom_fault_calloc((size_t)s->count + 1, sizeof *pieces);
  if (!pieces) return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", where);
  for (int k = 0; k < s->count; k++) {
    loom_shard_tensor *t = &pieces[k];
    snprintf(t->name, sizeof t->name, "param/%s", s->specs[k].name);
    t->ndim = 2;
    t->global[0] = t->local[0] = s->meta[k].layout.rows;
    t->global[1] = t->local[1] = s->meta[k].layout.cols;
    loom_shard_set_whole(t);
  }
  *out = (loom_piece_source){.where = where, .count = s->count, .pieces = pieces, .load = load_tensor,
                             .ctx = (void *)s};
  return LOOM_OK;
}

void loom_model_source_pieces_free(loom_piece_source *out) {
  free((void *)out->pieces);
  memset(out, 0, sizeof *out);
}

size_t loom_model_source_max_numel(const loom_model_source *s) {
  size_t most = 0;
  for (int k = 0; k < s->count; k++)
    if (loom_tensor_numel(&s->specs[k]) > most) most = loom_tensor_numel(&s->specs[k]);
  return most;
}

size_t loom_export_values(float *values, size_t n, loom_dtype dtype) {
  if (dtype != LOOM_DTYPE_BF16) return n * sizeof(float);
  char *bytes = (char *)values;
  for (size_t i = 0; i < n; i++) { /* element i's 2 bytes land at or before its 4 are read */
    float x;
    memcpy(&x, bytes + i * sizeof x, sizeof x);
    const uint16_t b = loom_bf16_round(x);
    memcpy(bytes + i * sizeof b, &b, sizeof b);
  }
  return n * sizeof(uint16_t);
}
