/* DeepSeek-V3's Hugging Face layout beside loom's table (hf_deepseek.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt/hf_deepseek.h"
#include "core/check.h"
#include "core/fault.h"

static bool ends_with(const char *s, const char *suffix) {
  const size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* P rows of `cols` values between the file's interleaved pairs and loom's halves: loom's row j is the file's 2j, its
 * row P/2 + j the file's 2j + 1. */
static void permute(float *rows, int64_t P, int64_t cols, bool to_loom, float *tmp) {
  const size_t row = (size_t)cols * sizeof(float);
  for (int64_t j = 0; j < P / 2; j++)
    for (int half = 0; half < 2; half++) {
      const int64_t file = 2 * j + half, loom = half * (P / 2) + j;
      memcpy(tmp + (to_loom ? loom : file) * cols, rows + (to_loom ? file : loom) * cols, row);
    }
  memcpy(rows, tmp, (size_t)P * row);
}

void loom_hf_deepseek_rows(const loom_gpt_config *cfg, const char *name, float *values, bool to_loom) {
  if (!loom_hf_deepseek(cfg)) return;
  const loom_mla_config *a = &cfg->mla;
  const int64_t P = a->qk_pos_emb_head_dim, D = a->qk_head_dim + P;
  const bool q = ends_with(name, a->q_lora_rank ? ".self_attn.q_b_proj.weight" : ".self_attn.q_proj.weight");
  const bool k = ends_with(name, ".self_attn.kv_a_proj_with_mqa.weight");
  if (!q && !k) return;
  const int64_t cols = q && a->q_lora_rank ? a->q_lora_rank : cfg->hidden;
  float *tmp = loom_xmalloc((size_t)(P * cols) * sizeof *tmp + 1, "RoPE rows");
  if (k) permute(values + (int64_t)a->kv_lora_rank * cols, P, cols, to_loom, tmp);
  for (int64_t h = 0; q && h < cfg->heads; h++) permute(values + (h * D + a->qk_head_dim) * cols, P, cols, to_loom, tmp);
  free(tmp);
}

/* One extra tensor of global shape [rows, cols] (cols 0: a vector) in `role`, its real rows `valid`. */
static void extra(loom_tensor *specs, loom_param_meta *meta, int i, const char *name, loom_param_role role, int64_t rows,
                  int64_t cols, int64_t valid) {
  if (!specs) return;
  const int64_t shape[2] = {rows, cols};
  specs[i] = loom_tensor_spec(name, LOOM_DTYPE_F32, cols ? 2 : 1, shape);
  meta[i] = (loom_param_meta){.role = role, .init = LOOM_INIT_ZEROS, .init_rows = valid,
                              .layout = {.rows = rows, .cols = cols ? cols : 1, .partition_dim = -1}, .tp_replicated = true};
}

int loom_hf_deepseek_extras(const loom_gpt_config *cfg, loom_tensor *specs, loom_param_meta *meta) {
  if (!loom_hf_deepseek(cfg)) return 0;
  char name[LOOM_NAME_LEN];
  int n = 0;
  for (int l = 0; loom_gpt_is_moe(cfg) && l < loom_gpt_blocks(cfg); l++) {
    if (!loom_gpt_layer_is_moe(cfg, l)) continue;
    snprintf(name, sizeof name, "model.layers.%d.mlp.gate.e_score_correction_bias", l);
    extra(specs, meta, n++, name, LOOM_ROLE_ROUTER_B, cfg->moe.experts, 0, cfg->moe.experts);
  }
  for (int l = cfg->layers; l < loom_gpt_blocks(cfg); l++) {
    snprintf(name, sizeof name, "model.layers.%d.embed_tokens.weight", l);
    extra(specs, meta, n++, name, LOOM_ROLE_WTE, cfg->padded_vocab, cfg->hidden, cfg->vocab);
    snprintf(name, sizeof name, "model.layers.%d.shared_head.head.weight", l);
    extra(specs, meta, n++, name, LOOM_ROLE_LM_HEAD, cfg->padded_vocab, cfg->hidden, cfg->vocab);
  }
  return n;
}

/* The layer an extra correction bias belongs to, or -1 for another tensor. */
static int bias_layer(const char *name) {
  int l = -1, used = 0;
  if (sscanf(name, "model.layers.%d.mlp.gate.e_score_correction_bias%n", &l, &used) != 1 || name[used] != '\0') return -1;
  return l;
}

/* An opened directory's expert bias: its correction biases, read through the source's fetch. */
static loom_status read_bias(const loom_model_source *s, float *bias, size_t count, loom_error *err) {
  const size_t E = (size_t)s->cfg.moe.experts;
  if (count != (size_t)loom_gpt_blocks(&s->cfg) * E)
    return loom_fail(err, LOOM_ERR_FORMAT, "the expert bias holds %zu values, but the model's %d layers of %zu experts "
                     "need %zu", count, loom_gpt_blocks(&s->cfg), E, (size_t)loom_gpt_blocks(&s->cfg) * E);
  memset(bias, 0, count * sizeof *bias);
  loom_status st = LOOM_OK;
  for (int k = 0; k < s->count && st == LOOM_OK; k++) {
    const int l = bias_layer(s->specs[k].name);
    if (l < 0) continue;
    st = s->fetch(s, k, bias + (size_t)l * E, err);
    for (size_t e = 0; st == LOOM_OK && e < E; e++)
      if (!isfinite(bias[(size_t)l * E + e]))
        st = loom_fail(err, LOOM_ERR_FORMAT, "%s[%zu] is not finite", s->specs[k].name, e);
  }
  return st;
}

/* specs and meta [count] followed by cfg's extras, in fresh allocations (*specs, *meta; count + extras of them). */
static loom_status table_with_extras(const loom_gpt_config *cfg, const loom_tensor *specs, const loom_param_meta *meta,
                                     int count, loom_tensor **out_specs, loom_param_meta **out_meta, int *out_count) {
  const int n = loom_hf_deepseek_extras(cfg, NULL, NULL);
  *out_specs = loom_fault_calloc((size_t)(count + n) + 1, sizeof **out_specs);
  *out_meta = loom_fault_calloc((size_t)(count + n) + 1, sizeof **out_meta);
  if (!*out_specs || !*out_meta) {
    free(*out_specs), free(*out_meta);
    *out_specs = NULL, *out_meta = NULL;
    return LOOM_ERR_NOMEM;
  }
  memcpy(*out_specs, specs, (size_t)count * sizeof **out_specs);
  memcpy(*out_meta, meta, (size_t)count * sizeof **out_meta);
  loom_hf_deepseek_extras(cfg, *out_specs + count, *out_meta + count);
  *out_count = count + n;
  return LOOM_OK;
}

loom_status loom_hf_deepseek_extend_table(loom_model_source *s, const char *where, loom_error *err) {
  if (loom_hf_deepseek_extras(&s->cfg, NULL, NULL) == 0) return LOOM_OK;
  loom_tensor *specs;
  loom_param_meta *meta;
  int count;
  if (table_with_extras(&s->cfg, s->specs, s->meta, s->count, &specs, &meta, &count) != LOOM_OK)
    return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", where);
  free(s->own_specs);
  free(s->own_meta);
  s->own_specs = specs, s->own_meta = meta, s->specs = specs, s->meta = meta, s->count = count;
  if (loom_gpt_is_moe(&s->cfg)) s->expert_bias = read_bias;
  return LOOM_OK;
}

/* The writer's source: its inner source's tensors, then the extras. */
typedef struct {
  const loom_model_source *inner;
  float *bias;    /* [blocks x experts] the inner source's expert bias */
  int wte, head;  /* the inner table's embedding and head */
} writer_state;

static void free_writer(void *state) {
  writer_state *w = state;
  free(w->bias);
  free(w);
}

static loom_status fetch_writer(const loom_model_source *s, int k, float *dst, loom_error *err) {
  const writer_state *w = s->state;
  const loom_model_source *in = w->inner;
  if (k < in->count) return in->fetch(in, k, dst, err);
  const int l = bias_layer(s->specs[k].name);
  if (l >= 0) {
    const size_t E = (size_t)s->cfg.moe.experts;
    memcpy(dst, w->bias + (size_t)l * E, E * sizeof *dst);
    return LOOM_OK;
  }
  return in->fetch(in, s->meta[k].role == LOOM_ROLE_WTE ? w->wte : w->head, dst, err);
}

loom_status loom_hf_deepseek_writer_source(const loom_model_source *src, loom_model_source *out, loom_error *err) {
  memset(out, 0, sizeof *out);
  out->cfg = src->cfg;
  writer_state *w = loom_fault_calloc(1, sizeof *w);
  const size_t bias = loom_gpt_is_moe(&src->cfg) ? (size_t)loom_gpt_blocks(&src->cfg) * (size_t)src->cfg.moe.experts : 0;
  if (w) w->bias = loom_fault_calloc(bias + 1, sizeof *w->bias);
  out->state = w, out->free_state = free_writer;
  if (!w || !w->bias ||
      table_with_extras(&src->cfg, src->specs, src->meta, src->count, &out->own_specs, &out->own_meta, &out->count) != LOOM_OK) {
    loom_model_source_free(out);
    return loom_fail(err, LOOM_ERR_NOMEM, "out of memory writing DeepSeek-V3's tensors");
  }
  out->specs = out->own_specs, out->meta = out->own_meta;
  out->fetch = fetch_writer;
  w->inner = src, w->wte = w->head = -1;
  for (int k = 0; k < src->count; k++) {
    if (src->meta[k].role == LOOM_ROLE_WTE) w->wte = k;
    if (src->meta[k].role == LOOM_ROLE_LM_HEAD) w->head = k;
  }
  if (w->head < 0) w->head = w->wte; /* a tied head */
  LOOM_CHECK(w->wte >= 0, "a whole model's table holds its embedding");
  const loom_status st = bias ? loom_model_source_expert_bias(src, "the export", w->bias, bias, err) : LOOM_OK;
  if (st != LOOM_OK) loom_model_source_free(out);
  return st;
}
