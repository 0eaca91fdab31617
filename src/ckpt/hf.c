/* Hugging Face directories: config.json both ways, model.safetensors read
 * tensor by tensor (writing is safetensors.c's). */
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
#include "ckpt/safetensors.h"
#include "core/fault.h"
#include "core/json.h"
#include "core/read_file.h"
#include "core/write_file.h"
#include "plan/plan.h"

enum { GPT2, LLAMA };
static const char *const ARCHITECTURES[] = {"GPT2LMHeadModel", "LlamaForCausalLM"};
static const char *const MODEL_TYPES[] = {"gpt2", "llama"};

/* Every field each family's config.json may hold: what loom reads, then
 * what does not change the model's math (ids, caches, init, versions). */
static const char *const GPT2_FIELDS[] = {
    "architectures", "model_type", "vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner",
    "layer_norm_epsilon", "activation_function", "tie_word_embeddings", "torch_dtype", "n_ctx", "resid_pdrop",
    "embd_pdrop", "attn_pdrop", "bos_token_id", "eos_token_id", "initializer_range", "scale_attn_weights",
    "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "summary_activation", "summary_first_dropout",
    "summary_proj_to_labels", "summary_type", "summary_use_proj", "task_specific_params", "transformers_version",
    "use_cache", "_name_or_path", "output_past", NULL};
static const char *const LLAMA_FIELDS[] = {
    "architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "rope_theta",
    "rope_scaling", "hidden_act", "tie_word_embeddings", "attention_bias", "mlp_bias", "pretraining_tp",
    "attention_dropout", "torch_dtype", "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range",
    "transformers_version", "use_cache", "_name_or_path", NULL};

bool loom_hf_is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static void join(char *out, size_t n, const char *dir, const char *file) { snprintf(out, n, "%s/%s", dir, file); }

/* ---- config.json ---- */

typedef struct {
  const loom_json *root;
  const char *path;
  loom_error *err;
} config_reader;

static loom_status bad_field(const config_reader *c, const char *key, const char *why) {
  return loom_fail(c->err, LOOM_ERR_FORMAT, "%s: field \"%s\" %s", c->path, key, why);
}

/* An integer field in [min, max]; absent or null: fallback, or an error when fallback < 0 (required). */
static loom_status int_field(const config_reader *c, const char *key, long long min, long long max, long long fallback,
                             int *out) {
  const loom_json *v = loom_json_get(c->root, key);
  long long x = fallback;
  if (!v || v->kind == LOOM_JSON_NULL) {
    if (fallback < 0) return bad_field(c, key, "is missing");
  } else if (!loom_json_int(v, min, max, &x)) {
    char why[96];
    snprintf(why, sizeof why, "must be an integer from %lld to %lld", min, max);
    return bad_field(c, key, why);
  }
  *out = (int)x;
  return LOOM_OK;
}

static loom_status float_field(const config_reader *c, const char *key, double fallback, float *out) {
  const loom_json *v = loom_json_get(c->root, key);
  if (!v) return *out = (float)fallback, LOOM_OK;
  if (v->kind != LOOM_JSON_NUMBER || !(v->number > 0.0) || !isfinite((float)v->number))
    return bad_field(c, key, "must be a positive number");
  *out = (float)v->number;
  return LOOM_OK;
}

/* Dropout probabilities a config may carry: training settings that loom's
 * --dropout replaces, but a value no dropout can have is refused, not ignored. */
static loom_status dropout_fields(const config_reader *c, const char *const *keys) {
  for (int i = 0; keys[i]; i++) {
    const loom_json *v = loom_json_get(c->root, keys[i]);
    if (v && !(v->kind == LOOM_JSON_NUMBER && v->number >= 0.0 && v->number < 1.0))
      return bad_field(c, keys[i], "must be a dropout probability in [0, 1) (loom trains with --dropout)");
  }
  return LOOM_OK;
}

static loom_status bool_field(const config_reader *c, const char *key, bool fallback, bool *out) {
  const loom_json *v = loom_json_get(c->root, key);
  if (!v) return *out = fallback, LOOM_OK;
  if (v->kind != LOOM_JSON_BOOL) return bad_field(c, key, "must be true or false");
  *out = v->boolean;
  return LOOM_OK;
}

/* A string field that, when present, must be one of `allowed` (NULL-terminated). */
static loom_status string_field(const config_reader *c, const char *key, const char *const *allowed) {
  const loom_json *v = loom_json_get(c->root, key);
  if (!v) return LOOM_OK;
  for (int i = 0; v->kind == LOOM_JSON_STRING && allowed[i]; i++)
    if (strcmp(v->string, allowed[i]) == 0) return LOOM_OK;
  char why[160];
  snprintf(why, sizeof why, "must be \"%s\"%s (loom computes no other)", allowed[0], allowed[1] ? " or the like" : "");
  return bad_field(c, key, why);
}

/* The family the architecture names, or an error. */
static loom_status family_of(const config_reader *c, int *family) {
  const loom_json *a = loom_json_get(c->root, "architectures"), *t = loom_json_get(c->root, "model_type");
  const char *name = a && a->kind == LOOM_JSON_ARRAY && a->count == 1 && a->items[0].kind == LOOM_JSON_STRING
                         ? a->items[0].string : NULL;
  for (int f = GPT2; f <= LLAMA; f++)
    if ((name && strcmp(name, ARCHITECTURES[f]) == 0) ||
        (!name && t && t->kind == LOOM_JSON_STRING && strcmp(t->string, MODEL_TYPES[f]) == 0)) {
      *family = f;
      return LOOM_OK;
    }
  return loom_fail(c->err, LOOM_ERR_FORMAT, "%s: unknown architecture %s%s%s: loom reads GPT2LMHeadModel and LlamaForCausalLM",
                   c->path, name ? "\"" : "", name ? name : "(no \"architectures\" or \"model_type\")", name ? "\"" : "");
}

static loom_status read_gpt2(const config_reader *c, loom_gpt_config *cfg) {
  static const char *const GELU[] = {"gelu_new", "gelu_pytorch_tanh", NULL}; /* loom's GELU is the tanh form */
  loom_status st = int_field(c, "vocab_size", 2, LOOM_PLAN_MAX_VOCAB, -1, &cfg->vocab);
  if (st == LOOM_OK) st = int_field(c, "n_positions", 1, LOOM_PLAN_MAX_SEQ, -1, &cfg->seq);
  if (st == LOOM_OK) st = int_field(c, "n_embd", 1, LOOM_PLAN_MAX_HIDDEN, -1, &cfg->hidden);
  if (st == LOOM_OK) st = int_field(c, "n_layer", 1, LOOM_PLAN_MAX_LAYERS, -1, &cfg->layers);
  if (st == LOOM_OK) st = int_field(c, "n_head", 1, LOOM_PLAN_MAX_HEADS, -1, &cfg->heads);
  if (st == LOOM_OK) st = int_field(c, "n_inner", 1, LOOM_PLAN_MAX_FFN, 0, &cfg->ffn);
  if (st == LOOM_OK) st = float_field(c, "layer_norm_epsilon", 1e-5, &cfg->norm_eps);
  if (st == LOOM_OK) st = string_field(c, "activation_function", GELU);
  static const char *const DROPOUTS[] = {"resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout", NULL};
  if (st == LOOM_OK) st = dropout_fields(c, DROPOUTS);
  bool tied = true, inverse_layer = false, scaled = true;
  if (st == LOOM_OK) st = bool_field(c, "tie_word_embeddings", true, &tied);
  cfg->untied = !tied;
  if (st == LOOM_OK) st = bool_field(c, "scale_attn_by_inverse_layer_idx", false, &inverse_layer);
  if (st == LOOM_OK) st = bool_field(c, "scale_attn_weights", true, &scaled);
  if (st == LOOM_OK && (inverse_layer || !scaled))
    st = bad_field(c, inverse_layer ? "scale_attn_by_inverse_layer_idx" : "scale_attn_weights",
                   "must keep GPT-2's default: loom scales attention scores by 1/sqrt(head size), nothing else");
  return st;
}

static loom_status read_llama(const config_reader *c, loom_gpt_config *cfg) {
  static const char *const SILU[] = {"silu", NULL};
  cfg->norm = LOOM_NORM_RMSNORM, cfg->mlp = LOOM_MLP_SWIGLU, cfg->position = LOOM_POSITION_ROPE;
  loom_status st = int_field(c, "vocab_size", 2, LOOM_PLAN_MAX_VOCAB, -1, &cfg->vocab);
  if (st == LOOM_OK) st = int_field(c, "hidden_size", 1, LOOM_PLAN_MAX_HIDDEN, -1, &cfg->hidden);
  if (st == LOOM_OK) st = int_field(c, "intermediate_size", 1, LOOM_PLAN_MAX_FFN, -1, &cfg->ffn);
  if (st == LOOM_OK) st = int_field(c, "num_hidden_layers", 1, LOOM_PLAN_MAX_LAYERS, -1, &cfg->layers);
  if (st == LOOM_OK) st = int_field(c, "num_attention_heads", 1, LOOM_PLAN_MAX_HEADS, -1, &cfg->heads);
  if (st == LOOM_OK) st = int_field(c, "num_key_value_heads", 1, LOOM_PLAN_MAX_HEADS, cfg->heads, &cfg->kv_heads);
  if (st == LOOM_OK) st = int_field(c, "max_position_embeddings", 1, LOOM_PLAN_MAX_SEQ, -1, &cfg->seq);
  if (st == LOOM_OK) st = float_field(c, "rms_norm_eps", 1e-6, &cfg->norm_eps);
  if (st == LOOM_OK) st = float_field(c, "rope_theta", 10000.0, &cfg->rope_theta);
  if (st == LOOM_OK) st = string_field(c, "hidden_act", SILU);
  static const char *const DROPOUTS[] = {"attention_dropout", NULL};
  if (st == LOOM_OK) st = dropout_fields(c, DROPOUTS);
  bool tied = false, attention_bias = false, mlp_bias = false;
  if (st == LOOM_OK) st = bool_field(c, "tie_word_embeddings", false, &tied);
  if (st == LOOM_OK) st = bool_field(c, "attention_bias", false, &attention_bias);
  if (st == LOOM_OK) st = bool_field(c, "mlp_bias", false, &mlp_bias);
  if (st == LOOM_OK && attention_bias != mlp_bias)
    st = bad_field(c, "mlp_bias", "must equal attention_bias (loom's biases are on or off for every linear)");
  cfg->untied = !tied;
  cfg->no_bias = !attention_bias;
  int head_dim = 0, tp = 1;
  if (st == LOOM_OK) st = int_field(c, "head_dim", 1, LOOM_PLAN_MAX_HIDDEN, 0, &head_dim);
  if (st == LOOM_OK && head_dim && head_dim * cfg->heads != cfg->hidden)
    st = bad_field(c, "head_dim", "must be hidden_size / num_attention_heads (loom's head size)");
  if (st == LOOM_OK) st = int_field(c, "pretraining_tp", 1, 1, 1, &tp);
  const loom_json *scaling = loom_json_get(c->root, "rope_scaling");
  if (st == LOOM_OK && scaling && scaling->kind != LOOM_JSON_NULL)
    st = bad_field(c, "rope_scaling", "must be null: loom's RoPE has no frequency scaling (Llama 3.1's is not built)");
  return st;
}

/* Refuses a field outside the family's list. */
static loom_status known_fields(const config_reader *c, const char *const *fields) {
  for (size_t i = 0; i < c->root->count; i++) {
    int j = 0;
    while (fields[j] && strcmp(fields[j], c->root->keys[i]) != 0) j++;
    if (!fields[j]) return bad_field(c, c->root->keys[i], "is unknown to loom; remove it if it does not change the model");
  }
  return LOOM_OK;
}

loom_status loom_hf_read_config(const char *dir, loom_gpt_config *cfg, loom_error *err) {
  char path[4200];
  join(path, sizeof path, dir, LOOM_HF_CONFIG);
  if (access(path, F_OK) != 0)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: is a directory without %s: neither a Hugging Face model nor an llm.c file",
                     dir, LOOM_HF_CONFIG);
  char *text = NULL;
  size_t len = 0;
  loom_status st = loom_read_small_file(path, "model config", 1 << 20, &text, &len, err);
  if (st != LOOM_OK) return st;
  st = loom_hf_parse_config(text, len, path, cfg, err);
  free(text);
  return st;
}

loom_status loom_hf_parse_config(const char *text, size_t len, const char *path, loom_gpt_config *cfg, loom_error *err) {
  loom_json root;
  loom_status st = loom_json_parse(text, len, path, &root, err);
  if (st != LOOM_OK) return st;
  const config_reader c = {&root, path, err};
  int family = GPT2;
  memset(cfg, 0, sizeof *cfg);
  if (root.kind != LOOM_JSON_OBJECT) st = loom_fail(err, LOOM_ERR_FORMAT, "%s: not a JSON object", path);
  if (st == LOOM_OK) st = family_of(&c, &family);
  if (st == LOOM_OK) st = known_fields(&c, family == GPT2 ? GPT2_FIELDS : LLAMA_FIELDS);
  if (st == LOOM_OK) st = family == GPT2 ? read_gpt2(&c, cfg) : read_llama(&c, cfg);
  loom_json_free(&root);
  if (st != LOOM_OK) return st;
  loom_gpt_config_finish(cfg);
  char why[512];
  Loom__Model m = LOOM__MODEL__INIT;
  loom_model_proto_fill(&m, cfg);
  if (loom_plan_check_model(&m, why, sizeof why))
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: %.*s", path, (int)strcspn(why, "\n"), why);
  return LOOM_OK;
}

/* ---- model.safetensors ---- */

typedef enum { ST_F32, ST_BF16, ST_F16 } st_dtype;
static const char *const ST_DTYPES[] = {"F32", "BF16", "F16"};
static const size_t ST_SIZES[] = {4, 2, 2};

typedef struct {
  FILE *fp;
  char path[4200];
  uint64_t data_start;
  uint64_t *at;    /* [count] file offset of canonical tensor k */
  st_dtype *dtype; /* [count] */
} hf_source;

static void free_hf(void *state) {
  hf_source *h = state;
  if (h->fp) fclose(h->fp);
  free(h->at);
  free(h->dtype);
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
 * GPT-2's Conv1D, and its vocab padding zero. */
static loom_status fetch_hf(const loom_model_source *s, int k, float *dst, loom_error *err) {
  const hf_source *h = s->state;
  const loom_safetensors_shape e = loom_safetensors_shape_of(&s->cfg, &s->specs[k], &s->meta[k]);
  const size_t n = (size_t)e.rows * (size_t)(e.cols ? e.cols : 1), esize = ST_SIZES[h->dtype[k]];
  void *raw = malloc(n * esize + 1);
  float *wide = e.transpose ? malloc(n * sizeof(float) + 1) : dst;
  loom_status st = LOOM_OK;
  if (!raw || !wide) st = loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory reading %s", h->path, s->specs[k].name);
  else if (fseeko(h->fp, (off_t)(h->data_start + h->at[k]), SEEK_SET) != 0 || fread(raw, esize, n, h->fp) != n)
    st = loom_fail(err, LOOM_ERR_IO, "%s: cannot read %s: %s", h->path, s->specs[k].name,
                   ferror(h->fp) ? strerror(errno) : "the file ends inside it");
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
  const size_t whole = loom_tensor_numel(&s->specs[k]);
  if (st == LOOM_OK && whole > n) memset(dst + n, 0, (whole - n) * sizeof(float)); /* vocab padding */
  free(raw);
  if (wide != dst) free(wide);
  return st;
}

/* One entry of the header, checked: dtype, shape and its byte range. */
typedef struct {
  st_dtype dtype;
  int ndim;
  long long shape[2];
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
  if (!shape || shape->kind != LOOM_JSON_ARRAY || shape->count < 1 || shape->count > 2)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s: its shape must list 1 or 2 sizes", path, name);
  e->ndim = (int)shape->count;
  e->shape[1] = 1;
  for (int i = 0; i < e->ndim; i++)
    if (!loom_json_int(&shape->items[i], 0, INT_MAX, &e->shape[i]))
      return loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s: a size in its shape is not a count", path, name);
  if (!off || off->kind != LOOM_JSON_ARRAY || off->count != 2 || !loom_json_int(&off->items[0], 0, (long long)data_len, &begin) ||
      !loom_json_int(&off->items[1], begin, (long long)data_len, &end))
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s: data_offsets must be [begin, end] inside the %llu bytes of data",
                     path, name, (unsigned long long)data_len);
  if ((uint64_t)(end - begin) != (uint64_t)e->shape[0] * (uint64_t)e->shape[1] * ST_SIZES[e->dtype])
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s: %lld bytes of data for its shape's %llu", path, name,
                     end - begin, (unsigned long long)e->shape[0] * (unsigned long long)e->shape[1] * ST_SIZES[e->dtype]);
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
  char prefixed[LOOM_NAME_LEN + 16];
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

/* No two tensors share bytes (the safetensors library refuses such files too). */
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

/* Matches the header against the model's table: every tensor there, in dtype and shape, none left over. */
static loom_status match_header(loom_model_source *s, hf_source *h, const loom_json *header, uint64_t data_len,
                                loom_error *err) {
  st_entry *entries = loom_fault_calloc(header->count + 1, sizeof *entries);
  if (!entries) return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", h->path);
  loom_status st = LOOM_OK;
  for (size_t i = 0; i < header->count && st == LOOM_OK; i++) {
    if (strcmp(header->keys[i], "__metadata__") == 0) entries[i].used = true;
    else st = read_entry(h->path, header->keys[i], &header->items[i], data_len, &entries[i], err);
  }
  if (st == LOOM_OK) st = refuse_overlaps(h->path, header, entries, err);
  const bool gpt2 = loom_gpt_config_is_gpt2(&s->cfg);
  for (int k = 0; k < s->count && st == LOOM_OK; k++) {
    const char *name = s->specs[k].name;
    const loom_safetensors_shape want = loom_safetensors_shape_of(&s->cfg, &s->specs[k], &s->meta[k]);
    const int i = entry_of(header, name, gpt2);
    if (i < 0) {
      st = loom_fail(err, LOOM_ERR_FORMAT, "%s: missing tensor %s", h->path, name);
      break;
    }
    st_entry *e = &entries[i];
    const int ndim = want.cols ? 2 : 1;
    if (e->ndim != ndim || e->shape[0] != want.rows || (ndim == 2 && e->shape[1] != want.cols))
      st = loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s has shape [%lld%s%lld]; the config's model needs [%lld%s%lld]", h->path,
                     name, e->shape[0], e->ndim == 2 ? ", " : "", e->ndim == 2 ? e->shape[1] : 0LL, (long long)want.rows,
                     ndim == 2 ? ", " : "", ndim == 2 ? (long long)want.cols : 0LL);
    e->used = true;
    h->at[k] = e->begin;
    h->dtype[k] = e->dtype;
  }
  for (size_t i = 0; i < header->count && st == LOOM_OK; i++)
    if (!entries[i].used && !(gpt2 && is_gpt2_buffer(header->keys[i])))
      st = loom_fail(err, LOOM_ERR_FORMAT, "%s: tensor %s is not part of the model config.json describes", h->path,
                     header->keys[i]);
  free(entries);
  return st;
}

/* Opens the weights and parses their header. */
static loom_status open_weights(hf_source *h, loom_json *header, uint64_t *data_len, loom_error *err) {
  loom_status st = loom_open_for_reading(h->path, "safetensors file", &h->fp, err);
  if (st != LOOM_OK) return st;
  uint8_t len8[8];
  struct stat info;
  if (fstat(fileno(h->fp), &info) != 0 || fread(len8, 1, 8, h->fp) != 8)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: shorter than a safetensors header", h->path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
  const uint64_t size = (uint64_t)info.st_size;
  if (n < 2 || n > (100u << 20) || n > size - 8)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: header length %llu does not fit the %llu-byte file (at most 100 MiB)", h->path,
                     (unsigned long long)n, (unsigned long long)size);
  char *text = loom_fault_malloc(n + 1);
  if (!text) return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", h->path);
  if (fread(text, 1, n, h->fp) != n) st = loom_fail(err, LOOM_ERR_IO, "%s: cannot read its header", h->path);
  if (st == LOOM_OK) st = loom_json_parse(text, n, h->path, header, err);
  free(text);
  if (st == LOOM_OK && header->kind != LOOM_JSON_OBJECT) {
    loom_json_free(header);
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: its header is not a JSON object", h->path);
  }
  h->data_start = 8 + n;
  *data_len = size - 8 - n;
  return st;
}

loom_status loom_hf_source(loom_model_source *s, const char *dir, loom_error *err) {
  memset(s, 0, sizeof *s);
  loom_gpt_config cfg;
  loom_status st = loom_hf_read_config(dir, &cfg, err);
  if (st != LOOM_OK) return st;
  hf_source *h = loom_fault_calloc(1, sizeof *h);
  if (!h) return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", dir);
  join(h->path, sizeof h->path, dir, LOOM_HF_WEIGHTS);
  s->cfg = cfg;
  s->state = h;
  s->free_state = free_hf;
  s->fetch = fetch_hf;
  st = loom_model_source_make_table(s, dir, err);
  h->at = loom_fault_calloc((size_t)s->count + 1, sizeof *h->at);
  h->dtype = loom_fault_calloc((size_t)s->count + 1, sizeof *h->dtype);
  if (st == LOOM_OK && (!h->at || !h->dtype)) st = loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", dir);
  if (st == LOOM_OK) {
    loom_json header;
    uint64_t data_len = 0;
    st = open_weights(h, &header, &data_len, err);
    if (st == LOOM_OK) {
      st = match_header(s, h, &header, data_len, err);
      loom_json_free(&header);
    }
  }
  if (st != LOOM_OK) loom_model_source_free(s);
  return st;
}

/* ---- writing ---- */

loom_status loom_hf_check_class(const loom_gpt_config *c, loom_error *err) {
  if (loom_gpt_config_is_gpt2(c) ||
      (c->norm == LOOM_NORM_RMSNORM && c->mlp == LOOM_MLP_SWIGLU && c->position == LOOM_POSITION_ROPE))
    return LOOM_OK;
  char arch[256];
  return loom_fail(err, LOOM_ERR_USAGE, "this model (%s) has no Hugging Face class: a Hugging Face directory holds GPT-2's "
                   "architecture (GPT2LMHeadModel) or rmsnorm + swiglu + rope (LlamaForCausalLM)",
                   loom_gpt_config_architecture(c, 1, arch, sizeof arch));
}

/* config.json for the source's model, or an error if no transformers class holds it. */
static loom_status config_json(const loom_model_source *src, loom_dtype dtype, char *out, size_t n, loom_error *err) {
  const loom_gpt_config *c = &src->cfg;
  const char *torch_dtype = dtype == LOOM_DTYPE_BF16 ? "bfloat16" : "float32";
  if (loom_gpt_config_is_gpt2(c)) {
    char inner[32] = "null";
    if (c->ffn != 4 * c->hidden) snprintf(inner, sizeof inner, "%d", c->ffn);
    snprintf(out, n,
             "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n  \"vocab_size\": %d,\n"
             "  \"n_positions\": %d,\n  \"n_ctx\": %d,\n  \"n_embd\": %d,\n  \"n_layer\": %d,\n  \"n_head\": %d,\n"
             "  \"n_inner\": %s,\n  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": %.7g,\n"
             "  \"resid_pdrop\": %.7g,\n  \"embd_pdrop\": %.7g,\n  \"attn_pdrop\": %.7g,\n  \"tie_word_embeddings\": %s,\n"
             "  \"torch_dtype\": \"%s\"\n}\n",
             c->vocab, c->seq, c->seq, c->hidden, c->layers, c->heads, inner, (double)c->norm_eps, (double)c->dropout,
             (double)c->dropout, (double)c->dropout, c->untied ? "false" : "true", torch_dtype);
    return LOOM_OK;
  }
  const loom_status st = loom_hf_check_class(c, err);
  if (st != LOOM_OK) return st;
  snprintf(out, n,
           "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n  \"vocab_size\": %d,\n"
           "  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n  \"num_hidden_layers\": %d,\n"
           "  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n"
           "  \"max_position_embeddings\": %d,\n  \"rms_norm_eps\": %.7g,\n  \"rope_theta\": %.9g,\n  \"rope_scaling\": null,\n"
           "  \"hidden_act\": \"silu\",\n  \"attention_bias\": %s,\n  \"mlp_bias\": %s,\n  \"attention_dropout\": 0.0,\n"
           "  \"tie_word_embeddings\": %s,\n  \"torch_dtype\": \"%s\"\n}\n",
           c->vocab, c->hidden, c->ffn, c->layers, c->heads, loom_gpt_kv_heads(c), loom_gpt_head_dim(c), c->seq,
           (double)c->norm_eps, (double)c->rope_theta, c->no_bias ? "false" : "true", c->no_bias ? "false" : "true",
           c->untied ? "false" : "true", torch_dtype);
  return LOOM_OK;
}

loom_status loom_hf_write(const char *dir, const loom_model_source *src, loom_dtype dtype, loom_error *err) {
  char json[4096], path[4200];
  loom_status st = config_json(src, dtype, json, sizeof json, err);
  bool made = false; /* a directory this call made is removed again if the write fails */
  if (st == LOOM_OK && !(made = mkdir(dir, 0755) == 0) && errno != EEXIST)
    st = loom_fail(err, LOOM_ERR_WRITE, "%s: cannot create the model directory: %s", dir, strerror(errno));
  if (st == LOOM_OK) {
    join(path, sizeof path, dir, LOOM_HF_WEIGHTS);
    st = loom_safetensors_write(path, src, dtype, err);
  }
  if (st == LOOM_OK) {
    join(path, sizeof path, dir, LOOM_HF_CONFIG);
    const loom_chunk chunk = {json, strlen(json)};
    st = loom_write_file_atomic(path, &chunk, 1, err);
  }
  if (st != LOOM_OK && made) {
    join(path, sizeof path, dir, LOOM_HF_WEIGHTS);
    unlink(path);
    rmdir(dir);
  }
  return st;
}
