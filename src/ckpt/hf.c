/* Hugging Face directories: config.json both ways, and the weights written
 * as one file or as shards with their index (reading is hf_weights.c's,
 * each file's writing safetensors.c's). */
#include <errno.h>
#include <limits.h>
#include <float.h>
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
#include "ckpt/manifest.h"
#include "core/strbuf.h"
#include "core/write_file.h"
#include "plan/plan.h"

/* Mistral's is Llama's model but for a sliding attention window, which
 * loom takes where it covers the whole sequence (then it changes nothing);
 * Qwen2's is Llama's with biases on q, k and v and no others; Mixtral's is
 * Mistral's with each MLP a Mixture of Experts (a softmax router's top-k,
 * renormalised: loom's softmax over the chosen logits); Qwen2-MoE's is
 * Qwen2's with each MLP a Mixture of Experts beside a gated shared expert.
 * A MoE model without a shared expert is Mixtral's, one with it Qwen2-MoE's
 * (whose tensor names are loom's own). GPT-OSS's is Llama's attention with
 * biases and learned sinks, windows by layer_types, YaRN, and every MLP a
 * Mixture of biased experts with its clamped unit, stacked in its files
 * (hf_stack.h), under a router with a bias. */
enum { GPT2, LLAMA, MISTRAL, QWEN2, MIXTRAL, QWEN2_MOE, QWEN3, QWEN3_MOE, GPT_OSS, DEEPSEEK_V3, FAMILIES };
static const char *const ARCHITECTURES[FAMILIES] = {"GPT2LMHeadModel",    "LlamaForCausalLM",    "MistralForCausalLM",
                                                    "Qwen2ForCausalLM",   "MixtralForCausalLM",  "Qwen2MoeForCausalLM",
                                                    "Qwen3ForCausalLM",   "Qwen3MoeForCausalLM", "GptOssForCausalLM",
                                                    "DeepseekV3ForCausalLM"};
static const char *const MODEL_TYPES[FAMILIES] = {"gpt2",  "llama",     "mistral", "qwen2",    "mixtral",
                                                  "qwen2_moe", "qwen3", "qwen3_moe", "gpt_oss", "deepseek_v3"};

/* The family whose class writes a model: attention sinks make a MoE model
 * GPT-OSS's; QK-norm makes it Qwen3's; a MoE model with a shared expert is
 * Qwen2-MoE's, one without Mixtral's. */
static int moe_family(const loom_gpt_config *c) {
  if (loom_gpt_is_mla(c)) return DEEPSEEK_V3;
  return c->softmax == LOOM_SOFTMAX_LEARNABLE ? GPT_OSS : c->qk_norm ? QWEN3_MOE : c->moe.shared_ffn > 0 ? QWEN2_MOE : MIXTRAL;
}

bool loom_hf_stacks_experts(const loom_gpt_config *c) { return loom_gpt_is_moe(c) && moe_family(c) == GPT_OSS; }
static int dense_family(const loom_gpt_config *c) {
  return c->qk_norm ? QWEN3 : c->qkv_bias && !c->out_bias ? QWEN2 : c->window > 0 ? MISTRAL : LLAMA;
}

/* Hugging Face's attention_bias: q, k, v and o biased together (every linear, or the attention's alone). */
static bool attention_biased(const loom_gpt_config *c) { return loom_gpt_qkv_biased(c) && loom_gpt_out_biased(c); }

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
/* What Mistral's and Qwen2's configs add to Llama's. */
static const char *const MISTRAL_FIELDS[] = {"sliding_window", NULL};
static const char *const QWEN2_FIELDS[] = {"use_sliding_window", "sliding_window", "max_window_layers", "layer_types",
                                           "use_mrope", NULL};
static const char *const MIXTRAL_FIELDS[] = {"sliding_window", "num_local_experts", "num_experts_per_tok",
                                             "router_aux_loss_coef", "router_jitter_noise", "output_router_logits", NULL};
static const char *const QWEN2_MOE_FIELDS[] = {
    "use_sliding_window", "sliding_window", "max_window_layers", "layer_types", "qkv_bias", "num_experts",
    "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size", "norm_topk_prob",
    "decoder_sparse_step", "mlp_only_layers", "router_aux_loss_coef", "output_router_logits", NULL};
/* Qwen3's is Qwen2's windows; Qwen3-MoE's adds its experts (no shared one). */
static const char *const QWEN3_FIELDS[] = {"use_sliding_window", "sliding_window", "max_window_layers", "layer_types", NULL};
static const char *const QWEN3_MOE_FIELDS[] = {
    "use_sliding_window", "sliding_window", "max_window_layers", "layer_types", "num_experts", "num_experts_per_tok",
    "moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "router_aux_loss_coef",
    "output_router_logits", NULL};
/* GPT-OSS's: its windows and experts, and OpenAI's own names for two of them (experts_per_token, initial_context_length:
 * rope_scaling's original_max_position_embeddings); quantization_config is read to refuse it. */
static const char *const GPT_OSS_FIELDS[] = {
    "sliding_window", "layer_types", "num_local_experts", "num_experts_per_tok", "experts_per_token", "router_aux_loss_coef",
    "output_router_logits", "swiglu_limit", "swiglu_alpha", "initial_context_length", "quantization_config", NULL};

/* DeepSeek-V3's: its attention's sizes, its MoE (n_routed_experts beside n_shared_experts of
 * moe_intermediate_size, the first first_k_dense_replace layers dense, noaux_tc's group-limited sigmoid
 * routing), its MTP modules and its RoPE's interleaved rows; ep_size, auto_map and the balance loss's
 * fields do not change the model's math; quantization_config is read to refuse it. */
static const char *const DEEPSEEK_V3_FIELDS[] = {
    "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts",
    "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size", "first_k_dense_replace", "moe_layer_freq",
    "n_group", "topk_group", "routed_scaling_factor", "norm_topk_prob", "scoring_func", "topk_method", "aux_loss_alpha",
    "seq_aux", "ep_size", "num_nextn_predict_layers", "rope_interleave", "quantization_config", "auto_map", NULL};

const char *loom_hf_tensor_name(const loom_gpt_config *cfg, const char *name, char *buf, size_t n) {
  const char *shared = strstr(name, ".mlp.shared_expert.");
  if (loom_gpt_is_moe(cfg) && moe_family(cfg) == DEEPSEEK_V3 && shared) { /* DeepSeek's plural */
    snprintf(buf, n, "%.*s.mlp.shared_experts.%s", (int)(shared - name), name, shared + strlen(".mlp.shared_expert."));
    return buf;
  }
  static const char *const LOOM[] = {"mlp.gate.weight", "gate_proj.weight", "up_proj.weight", "down_proj.weight"};
  static const char *const HF[] = {"block_sparse_moe.gate.weight", "w1.weight", "w3.weight", "w2.weight"};
  const char *mlp = strstr(name, ".mlp.");
  if (loom_hf_stacks_experts(cfg) && mlp && strncmp(mlp + 1, "mlp.gate.", 9) == 0) { /* GPT-OSS's router */
    snprintf(buf, n, "%.*s.mlp.router.%s", (int)(mlp - name), name, mlp + 10);
    return buf;
  }
  if (!loom_gpt_is_moe(cfg) || moe_family(cfg) != MIXTRAL || !mlp) return name;
  const char *rest = mlp + 1; /* "mlp...." */
  if (strcmp(rest, LOOM[0]) == 0) {
    snprintf(buf, n, "%.*s.%s", (int)(mlp - name), name, HF[0]);
    return buf;
  }
  int e, used = 0;
  if (sscanf(rest, "mlp.experts.%d.%n", &e, &used) != 1 || used == 0) return name;
  for (int i = 1; i < 4; i++)
    if (strcmp(rest + used, LOOM[i]) == 0) {
      snprintf(buf, n, "%.*s.block_sparse_moe.experts.%d.%s", (int)(mlp - name), name, e, HF[i]);
      return buf;
    }
  return name;
}

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
  if (v->kind != LOOM_JSON_NUMBER) return bad_field(c, key, "must be a number");
  if (!(v->number > 0.0)) return bad_field(c, key, "must be greater than 0");
  if (v->number > FLT_MAX || v->number < FLT_MIN) {
    char why[128];
    snprintf(why, sizeof why, "is %g, outside [%g, %g], the range of loom's float32", v->number, (double)FLT_MIN,
             (double)FLT_MAX);
    return bad_field(c, key, why);
  }
  *out = (float)v->number;
  return LOOM_OK;
}

/* The dropout a config trains with, as loom's one probability (the
 * model's dropout, which --dropout replaces): `keys` are the fields that
 * drop where loom's dropout does (embeddings, attention probabilities and
 * both residual branches), and must agree; `partial` are fields that drop at
 * only some of those sites, which loom cannot match unless they are 0.
 * Absent fields are 0. */
/* A dropout field's probability in [0, 1), or refused; absent: *p = -1. */
static loom_status dropout_value(const config_reader *c, const char *key, double *p) {
  const loom_json *v = loom_json_get(c->root, key);
  *p = v && v->kind == LOOM_JSON_NUMBER ? v->number : -1.0;
  if (v && !(*p >= 0.0 && *p < 1.0))
    return bad_field(c, key, "must be a dropout probability in [0, 1) (loom trains with --dropout)");
  return LOOM_OK;
}

static loom_status dropout_fields(const config_reader *c, const char *const *keys, const char *const *partial,
                                  float *dropout) {
  *dropout = 0.0f;
  const char *first = NULL;
  double p;
  for (int i = 0; keys[i]; i++) {
    const loom_status st = dropout_value(c, keys[i], &p);
    if (st != LOOM_OK) return st;
    if (p < 0.0) continue;
    if (first && (float)p != *dropout) {
      char why[240];
      snprintf(why, sizeof why, "is %g where \"%s\" is %g: loom drops embeddings, attention and residuals with one "
               "probability; make them equal, or remove them and train with --dropout", p, first, (double)*dropout);
      return bad_field(c, keys[i], why);
    }
    first = keys[i], *dropout = (float)p;
  }
  for (int i = 0; partial && partial[i]; i++) {
    const loom_status st = dropout_value(c, partial[i], &p);
    if (st != LOOM_OK) return st;
    if (p > 0.0)
      return bad_field(c, partial[i], "must be 0: it drops attention probabilities alone, and loom's dropout also drops "
                       "the embeddings and residual branches; remove it and train with --dropout");
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
  for (int f = GPT2; f < FAMILIES; f++)
    if ((name && strcmp(name, ARCHITECTURES[f]) == 0) ||
        (!name && t && t->kind == LOOM_JSON_STRING && strcmp(t->string, MODEL_TYPES[f]) == 0)) {
      *family = f;
      return LOOM_OK;
    }
  return loom_fail(c->err, LOOM_ERR_FORMAT,
                   "%s: unknown architecture %s%s%s: loom reads GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, "
                   "Qwen2ForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, "
                   "GptOssForCausalLM and DeepseekV3ForCausalLM",
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
  /* summary_first_dropout is the dropout of GPT2DoubleHeadsModel's classifier, which a causal LM has not. */
  static const char *const DROPOUTS[] = {"resid_pdrop", "embd_pdrop", "attn_pdrop", NULL};
  if (st == LOOM_OK) st = dropout_fields(c, DROPOUTS, NULL, &cfg->dropout);
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

static bool listed(const char *const *names, const char *name) {
  for (int j = 0; names && names[j]; j++)
    if (strcmp(names[j], name) == 0) return true;
  return false;
}

/* Refuses a field outside the family's lists (extra: NULL, or more names). */
static loom_status known_fields(const config_reader *c, const char *const *fields, const char *const *extra) {
  for (size_t i = 0; i < c->root->count; i++)
    if (!listed(fields, c->root->keys[i]) && !listed(extra, c->root->keys[i]))
      return bad_field(c, c->root->keys[i], "is unknown to loom; remove it if it does not change the model");
  return LOOM_OK;
}

/* YaRN's rope_scaling ("rope_type": "yarn", as transformers reads it):
 * factor required; original_max_position_embeddings (absent:
 * max_position_embeddings), which where given must make factor the ratio
 * of the two (transformers takes the ratio); beta_fast and beta_slow
 * (absent: 32 and 1); truncate (absent: true); the attention factor given,
 * or mscale / mscale_all_dim's ratio of get_mscale, or get_mscale(factor). */
static loom_status read_yarn(const config_reader *sc, int seq, loom_rope *rope) {
  rope->yarn = 1, rope->beta_fast = LOOM_YARN_BETA_FAST, rope->beta_slow = LOOM_YARN_BETA_SLOW, rope->truncate = 1;
  bool truncate = true;
  float mscale = 0.0f, mscale_all = 0.0f;
  loom_status st = loom_json_get(sc->root, "factor") ? float_field(sc, "factor", 0.0, &rope->factor) : bad_field(sc, "factor", "is missing");
  if (st == LOOM_OK) st = int_field(sc, "original_max_position_embeddings", 1, LOOM_PLAN_MAX_SEQ, seq, &rope->original_max_position);
  if (st == LOOM_OK && loom_json_get(sc->root, "original_max_position_embeddings") &&
      fabs((double)seq / rope->original_max_position - rope->factor) > 1e-6 * rope->factor)
    st = bad_field(sc, "factor", "must be max_position_embeddings / original_max_position_embeddings, which transformers "
                   "takes in its place");
  if (st == LOOM_OK) st = float_field(sc, "beta_fast", LOOM_YARN_BETA_FAST, &rope->beta_fast);
  if (st == LOOM_OK) st = float_field(sc, "beta_slow", LOOM_YARN_BETA_SLOW, &rope->beta_slow);
  if (st == LOOM_OK) st = bool_field(sc, "truncate", true, &truncate);
  rope->truncate = truncate;
  if (st == LOOM_OK && loom_json_get(sc->root, "mscale")) st = float_field(sc, "mscale", 0.0, &mscale);
  if (st == LOOM_OK && loom_json_get(sc->root, "mscale_all_dim")) st = float_field(sc, "mscale_all_dim", 0.0, &mscale_all);
  rope->attention_factor = mscale > 0.0f && mscale_all > 0.0f
                               ? (float)(loom_yarn_mscale(rope->factor, mscale) / loom_yarn_mscale(rope->factor, mscale_all))
                               : (float)loom_yarn_mscale(rope->factor, 1.0);
  if (st == LOOM_OK && loom_json_get(sc->root, "attention_factor")) st = float_field(sc, "attention_factor", 1.0, &rope->attention_factor);
  return st;
}

/* rope_scaling: null, or Llama 3.1's ("rope_type": "llama3", older files'
 * "type"), its four numbers required, or YaRN's; any other kind refused by
 * name. The numbers' ranges are the plan's rules (loom_plan_check_model). */
static loom_status read_rope_scaling(const config_reader *c, int seq, loom_rope *rope) {
  static const char *const FIELDS[] = {"rope_type", "type", "factor", "low_freq_factor", "high_freq_factor",
                                       "original_max_position_embeddings", NULL};
  static const char *const YARN[] = {"rope_type", "type", "factor", "original_max_position_embeddings", "beta_fast",
                                     "beta_slow", "truncate", "mscale", "mscale_all_dim", "attention_factor", NULL};
  const loom_json *s = loom_json_get(c->root, "rope_scaling");
  if (!s || s->kind == LOOM_JSON_NULL) return LOOM_OK;
  if (s->kind != LOOM_JSON_OBJECT) return bad_field(c, "rope_scaling", "must be null or an object");
  const loom_json *type = loom_json_get(s, "rope_type");
  if (!type) type = loom_json_get(s, "type");
  if (!type || type->kind != LOOM_JSON_STRING) return bad_field(c, "rope_scaling", "must name its rope_type");
  if (strcmp(type->string, "default") == 0) return LOOM_OK; /* transformers' name for none */
  const bool yarn = strcmp(type->string, "yarn") == 0;
  if (strcmp(type->string, "llama3") != 0 && !yarn)
    return loom_fail(c->err, LOOM_ERR_FORMAT, "%s: rope_scaling's rope_type \"%s\": loom computes Llama 3.1's \"llama3\" "
                     "and \"yarn\" scaling only (not linear, dynamic, longrope or su)", c->path, type->string);
  char path[4300];
  snprintf(path, sizeof path, "%s: rope_scaling", c->path);
  const config_reader sc = {s, path, c->err};
  loom_status st = known_fields(&sc, yarn ? YARN : FIELDS, NULL);
  if (st == LOOM_OK && yarn) return read_yarn(&sc, seq, rope);
  static const char *const NUMBERS[] = {"factor", "low_freq_factor", "high_freq_factor"};
  float *into[] = {&rope->factor, &rope->low_freq_factor, &rope->high_freq_factor};
  for (int i = 0; i < 3 && st == LOOM_OK; i++)
    st = loom_json_get(s, NUMBERS[i]) ? float_field(&sc, NUMBERS[i], 0.0, into[i]) : bad_field(&sc, NUMBERS[i], "is missing");
  if (st == LOOM_OK) st = int_field(&sc, "original_max_position_embeddings", 1, LOOM_PLAN_MAX_SEQ, -1, &rope->original_max_position);
  return st;
}

/* A sliding_window of S (null: none) as loom's window: a query sees its
 * own key and the S - 1 before it (transformers' mask: key > query - S),
 * loom's window of S - 1 keys back; one at least the sequence changes
 * nothing (0). S = 1, a query seeing itself alone, is refused. */
static loom_status read_sliding_window(const config_reader *c, const loom_gpt_config *cfg, int *window) {
  int size = 0;
  *window = 0;
  const loom_status st = int_field(c, "sliding_window", 1, INT_MAX, 0, &size);
  if (st != LOOM_OK || size == 0 || size >= cfg->seq) return st;
  if (size == 1)
    return bad_field(c, "sliding_window", "is 1: a query would see its own key alone; loom's windows reach at least one "
                     "key back");
  *window = size - 1;
  return LOOM_OK;
}

/* Mistral's and Mixtral's: every layer windowed. */
static loom_status read_every_layer_window(const config_reader *c, loom_gpt_config *cfg) {
  return read_sliding_window(c, cfg, &cfg->window);
}

/* Llama's and Mistral's biases: on every linear, none, or on the
 * attention's alone (attention_bias without mlp_bias: q, k, v and o). */
static loom_status read_llama_biases(const config_reader *c, loom_gpt_config *cfg) {
  bool attention_bias = false, mlp_bias = false;
  loom_status st = bool_field(c, "attention_bias", false, &attention_bias);
  if (st == LOOM_OK) st = bool_field(c, "mlp_bias", false, &mlp_bias);
  if (st == LOOM_OK && mlp_bias && !attention_bias)
    st = bad_field(c, "mlp_bias", "is true where attention_bias is false: loom's MLPs have biases only where every linear "
                   "does");
  cfg->no_bias = !mlp_bias;
  cfg->qkv_bias = cfg->out_bias = attention_bias && !mlp_bias;
  return st;
}

/* Qwen2's: biases on q, k and v, none elsewhere (its config has no field
 * for them); a sliding window only where use_sliding_window turns it on
 * (then as Mistral's), attention of one kind in every layer_types entry,
 * and no multimodal RoPE. */
/* Llama's bias fields, refused in a family whose biases are fixed (why: its own words). */
static loom_status no_bias_fields(const config_reader *c, const char *why) {
  static const char *const FIXED[] = {"attention_bias", "mlp_bias"};
  for (int i = 0; i < 2; i++)
    if (loom_json_get(c->root, FIXED[i])) return bad_field(c, FIXED[i], why);
  return LOOM_OK;
}

/* The Qwen families' attention windows: only where use_sliding_window
 * turns them on, in the layers layer_types names sliding_attention, or
 * without it from layer max_window_layers on (transformers' default). */
static loom_status read_qwen_windows(const config_reader *c, loom_gpt_config *cfg) {
  bool sliding = false;
  int from = 0, window = 0;
  loom_status st = bool_field(c, "use_sliding_window", false, &sliding);
  if (st == LOOM_OK && sliding) st = read_sliding_window(c, cfg, &window);
  if (st == LOOM_OK) st = int_field(c, "max_window_layers", 0, LOOM_PLAN_MAX_LAYERS, 0, &from);
  const loom_json *types = loom_json_get(c->root, "layer_types");
  if (st != LOOM_OK) return st;
  if (types && (types->kind != LOOM_JSON_ARRAY || types->count != (size_t)cfg->layers))
    return bad_field(c, "layer_types", "must be a list of one attention kind per layer");
  int windowed = 0;
  for (int l = 0; l < cfg->layers; l++) {
    bool full = l < from;
    if (types) {
      const loom_json *t = &types->items[l];
      full = t->kind == LOOM_JSON_STRING && strcmp(t->string, "full_attention") == 0;
      if (!full && !(t->kind == LOOM_JSON_STRING && strcmp(t->string, "sliding_attention") == 0))
        return bad_field(c, "layer_types", "must hold \"full_attention\" or \"sliding_attention\" per layer");
    }
    loom_gpt_set_full_attention_layer(cfg, l, full);
    windowed += !full;
  }
  cfg->window = windowed ? window : 0;
  if (!cfg->window) memset(cfg->full_attention, 0, sizeof cfg->full_attention);
  return LOOM_OK;
}

static loom_status read_qwen2(const config_reader *c, loom_gpt_config *cfg) {
  cfg->no_bias = true, cfg->qkv_bias = true;
  bool mrope = false;
  loom_status st = no_bias_fields(c, "is not Qwen2's: its q, k and v projections always have biases and its other "
                                  "linears never (transformers' Qwen2 reads no such field)");
  if (st == LOOM_OK) st = read_qwen_windows(c, cfg);
  if (st == LOOM_OK) st = bool_field(c, "use_mrope", false, &mrope);
  if (st == LOOM_OK && mrope) st = bad_field(c, "use_mrope", "must be false: loom computes RoPE over one position axis");
  return st;
}

/* Qwen3's: Qwen2's attention, each head's q and k RMSNorm-ed before
 * RoPE, heads head_dim wide (required: transformers' default for it
 * differs between its Qwen3 classes), biases on q, k, v and o together
 * where attention_bias says so (loom's --qkv-bias with --out-bias), none
 * on the MLPs. */
static loom_status read_qwen3(const config_reader *c, loom_gpt_config *cfg) {
  cfg->no_bias = true, cfg->qk_norm = true;
  bool attention_bias = false;
  loom_status st = loom_json_get(c->root, "head_dim") ? LOOM_OK : bad_field(c, "head_dim", "is missing (each head's width)");
  if (st == LOOM_OK) st = bool_field(c, "attention_bias", false, &attention_bias);
  cfg->qkv_bias = cfg->out_bias = attention_bias;
  if (st == LOOM_OK && loom_json_get(c->root, "mlp_bias"))
    st = bad_field(c, "mlp_bias", "is not Qwen3's: its MLPs never have biases (transformers' Qwen3 reads no such field)");
  if (st == LOOM_OK) st = read_qwen_windows(c, cfg);
  return st;
}

/* A MoE family's load-balancing loss as transformers trains it: its
 * coefficient router_aux_loss_coef (absent: transformers' 0.001), added to
 * the loss only where output_router_logits is true (absent: false), so
 * without it the coefficient loom trains with is 0. */
static loom_status read_router_fields(const config_reader *c, loom_moe_config *e) {
  const loom_json *aux = loom_json_get(c->root, "router_aux_loss_coef");
  if (aux && !(aux->kind == LOOM_JSON_NUMBER && aux->number >= 0.0 && isfinite(aux->number)))
    return bad_field(c, "router_aux_loss_coef", "must be a finite number of at least 0");
  bool logits = false;
  const loom_status st = bool_field(c, "output_router_logits", false, &logits);
  e->aux_loss_coeff = !logits ? 0.0f : aux ? (float)aux->number : 0.001f;
  return st;
}

/* Mixtral's: no biases (its config has no field for them), its experts of
 * intermediate_size each, its top-k, its load-balancing loss's
 * coefficient, no router jitter, and a sliding window as Mistral's. */
static loom_status read_mixtral(const config_reader *c, loom_gpt_config *cfg) {
  cfg->no_bias = true;
  loom_moe_config *e = &cfg->moe;
  loom_status st = no_bias_fields(c, "is not Mixtral's: its linears never have biases (transformers' Mixtral reads no such "
                                  "field)");
  if (st == LOOM_OK) st = int_field(c, "num_local_experts", 1, LOOM_PLAN_MAX_EXPERTS, -1, &e->experts);
  if (st == LOOM_OK) st = int_field(c, "num_experts_per_tok", 1, LOOM_PLAN_MAX_EXPERTS, 2, &e->topk);
  const loom_json *jitter = loom_json_get(c->root, "router_jitter_noise");
  if (st == LOOM_OK && jitter && !(jitter->kind == LOOM_JSON_NUMBER && jitter->number == 0.0))
    st = bad_field(c, "router_jitter_noise", "must be 0: loom's router is a function of its inputs alone (no noise)");
  if (st == LOOM_OK) st = read_router_fields(c, e);
  if (st == LOOM_OK) st = read_every_layer_window(c, cfg);
  e->ffn = cfg->ffn;
  return st;
}

/* The Qwen MoE families' experts: a softmax router's top
 * num_experts_per_tok (default `topk`) of num_experts experts of
 * moe_intermediate_size, the probabilities renormalised over them with
 * norm_topk_prob (loom's softmax over the chosen logits) or taken as they
 * are (loom's pre-softmax order); the layers without experts; the router's loss. */
static loom_status read_qwen_experts(const config_reader *c, loom_gpt_config *cfg, int topk) {
  loom_moe_config *e = &cfg->moe;
  bool renormalised = false;
  loom_status st = int_field(c, "num_experts", 1, LOOM_PLAN_MAX_EXPERTS, -1, &e->experts);
  if (st == LOOM_OK) st = int_field(c, "num_experts_per_tok", 1, LOOM_PLAN_MAX_EXPERTS, topk, &e->topk);
  if (st == LOOM_OK) st = int_field(c, "moe_intermediate_size", 1, LOOM_PLAN_MAX_FFN, -1, &e->ffn);
  if (st == LOOM_OK) st = bool_field(c, "norm_topk_prob", false, &renormalised);
  e->pre_softmax = !renormalised;
  /* Layer l is a MoE layer where (l + 1) % decoder_sparse_step == 0 and l is not in mlp_only_layers. */
  int step = 1;
  if (st == LOOM_OK) st = int_field(c, "decoder_sparse_step", 1, LOOM_PLAN_MAX_LAYERS, 1, &step);
  for (int l = 0; st == LOOM_OK && l < cfg->layers; l++) loom_gpt_set_dense_layer(cfg, l, (l + 1) % step != 0);
  const loom_json *dense = loom_json_get(c->root, "mlp_only_layers");
  if (st == LOOM_OK && dense && dense->kind != LOOM_JSON_NULL && dense->kind != LOOM_JSON_ARRAY)
    st = bad_field(c, "mlp_only_layers", "must be a list of layer indices");
  for (size_t i = 0; st == LOOM_OK && dense && dense->kind == LOOM_JSON_ARRAY && i < dense->count; i++) {
    long long l;
    if (!loom_json_int(&dense->items[i], 0, cfg->layers - 1, &l))
      st = bad_field(c, "mlp_only_layers", "must hold layer indices from 0 to num_hidden_layers - 1");
    else loom_gpt_set_dense_layer(cfg, (int)l, true);
  }
  if (st == LOOM_OK) st = read_router_fields(c, e);
  return st;
}

/* Qwen2-MoE's: Qwen2's attention (biases on q, k and v unless qkv_bias is
 * false), the Qwen experts (top 4 by default) beside a shared expert of
 * shared_expert_intermediate_size under its sigmoid gate. */
static loom_status read_qwen2_moe(const config_reader *c, loom_gpt_config *cfg) {
  loom_status st = read_qwen2(c, cfg);
  bool qkv = true;
  if (st == LOOM_OK) st = bool_field(c, "qkv_bias", true, &qkv);
  cfg->qkv_bias = qkv;
  if (st == LOOM_OK) st = read_qwen_experts(c, cfg, 4);
  if (st == LOOM_OK) st = int_field(c, "shared_expert_intermediate_size", 1, LOOM_PLAN_MAX_FFN, -1, &cfg->moe.shared_ffn);
  cfg->moe.shared_gate = true;
  return st;
}

/* Qwen3-MoE's: Qwen3's attention, and the Qwen experts without a shared one. */
static loom_status read_qwen3_moe(const config_reader *c, loom_gpt_config *cfg) {
  loom_status st = read_qwen3(c, cfg);
  if (st == LOOM_OK) st = read_qwen_experts(c, cfg, 8);
  return st;
}

/* GPT-OSS's windows: sliding_window in the layers layer_types names sliding_attention (absent: every other layer
 * from the first, as transformers' default). */
static loom_status read_gpt_oss_windows(const config_reader *c, loom_gpt_config *cfg) {
  loom_status st = read_sliding_window(c, cfg, &cfg->window);
  const loom_json *types = loom_json_get(c->root, "layer_types");
  if (st == LOOM_OK && types && (types->kind != LOOM_JSON_ARRAY || types->count != (size_t)cfg->layers))
    return bad_field(c, "layer_types", "must be a list of one attention kind per layer");
  for (int l = 0; st == LOOM_OK && l < cfg->layers; l++) {
    const loom_json *t = types ? &types->items[l] : NULL;
    const bool full = t ? t->kind == LOOM_JSON_STRING && strcmp(t->string, "full_attention") == 0 : l % 2 == 1;
    if (t && !full && !(t->kind == LOOM_JSON_STRING && strcmp(t->string, "sliding_attention") == 0))
      return bad_field(c, "layer_types", "must hold \"full_attention\" or \"sliding_attention\" per layer");
    loom_gpt_set_full_attention_layer(cfg, l, full);
  }
  if (st == LOOM_OK && !cfg->window) memset(cfg->full_attention, 0, sizeof cfg->full_attention);
  return st;
}

/* GPT-OSS's: biases on every linear (attention_bias true: its experts' and router's always have them), learned
 * sinks, its experts of intermediate_size under a softmax over the top num_experts_per_tok logits, their unit
 * clamped at swiglu_limit with swiglu_alpha's gate (1.702) and up + 1; head_dim, rope_theta and rope_scaling
 * required (its class's defaults differ from Llama's). The released MXFP4 experts are refused by name. */
static loom_status read_gpt_oss(const config_reader *c, loom_gpt_config *cfg) {
  const loom_json *q = loom_json_get(c->root, "quantization_config");
  if (q && q->kind != LOOM_JSON_NULL)
    return bad_field(c, "quantization_config", "is set: the experts are quantised (MXFP4's mlp.experts.gate_up_proj_blocks "
                     "and _scales, down_proj_blocks and _scales), which loom does not read; dequantise them to bf16 first "
                     "(transformers' Mxfp4Config(dequantize=True), then save_pretrained)");
  static const char *const REQUIRED[] = {"head_dim", "rope_theta", "rope_scaling"};
  for (int i = 0; i < 3; i++)
    if (!loom_json_get(c->root, REQUIRED[i]))
      return bad_field(c, REQUIRED[i], "is missing (transformers' GPT-OSS defaults it otherwise than Llama)");
  bool attention_bias = true;
  loom_status st = bool_field(c, "attention_bias", true, &attention_bias);
  if (st == LOOM_OK && !attention_bias)
    st = bad_field(c, "attention_bias", "is false: loom's GPT-OSS has biases on every linear, as its experts always have");
  if (st == LOOM_OK && loom_json_get(c->root, "mlp_bias"))
    st = bad_field(c, "mlp_bias", "is not GPT-OSS's: its experts always have biases (transformers' GPT-OSS reads no such "
                   "field)");
  cfg->no_bias = false, cfg->softmax = LOOM_SOFTMAX_LEARNABLE;
  loom_moe_config *e = &cfg->moe;
  if (st == LOOM_OK) st = int_field(c, "num_local_experts", 1, LOOM_PLAN_MAX_EXPERTS, -1, &e->experts);
  if (st == LOOM_OK) st = int_field(c, "num_experts_per_tok", 1, LOOM_PLAN_MAX_EXPERTS, 4, &e->topk);
  int openai_topk = e->topk;
  if (st == LOOM_OK) st = int_field(c, "experts_per_token", 1, LOOM_PLAN_MAX_EXPERTS, e->topk, &openai_topk);
  if (st == LOOM_OK && openai_topk != e->topk)
    st = bad_field(c, "experts_per_token", "differs from num_experts_per_tok, which transformers reads");
  if (st == LOOM_OK) st = read_router_fields(c, e);
  e->ffn = cfg->ffn, e->router_bias = true;
  cfg->glu = (loom_glu){.alpha = LOOM_QUICK_GELU_ALPHA, .clamp = 7.0f, .offset = 1.0f};
  if (st == LOOM_OK) st = float_field(c, "swiglu_limit", 7.0, &cfg->glu.clamp);
  if (st == LOOM_OK) st = float_field(c, "swiglu_alpha", LOOM_QUICK_GELU_ALPHA, &cfg->glu.alpha);
  if (st == LOOM_OK) st = read_gpt_oss_windows(c, cfg);
  return st;
}

/* DeepSeek-V3's: multi-head latent attention (every head its own key and
 * value, q through a latent unless q_lora_rank is null, RoPE's rows in
 * interleaved pairs: rope_interleave), YaRN's softmax factor
 * (rope_scaling's mscale_all_dim), the experts beside n_shared_experts
 * shared ones after first_k_dense_replace dense layers, routed by
 * noaux_tc: sigmoid scores with the correction bias (loom's expert bias)
 * choosing, the best topk_group of n_group groups by their best two
 * scores, the chosen scores normalised (norm_topk_prob, as loom does for a
 * top-k above 1) and scaled by routed_scaling_factor; and
 * num_nextn_predict_layers MTP modules. The released fp8 weights
 * (quantization_config) are refused by name. */
static loom_status read_deepseek_v3(const config_reader *c, loom_gpt_config *cfg) {
  const loom_json *q = loom_json_get(c->root, "quantization_config");
  if (q && q->kind != LOOM_JSON_NULL)
    return bad_field(c, "quantization_config", "is set: the weights are fp8 with 128 x 128 block scales (weight_scale_inv), "
                     "which loom does not read; dequantise them to bf16 first (DeepSeek's fp8_cast_bf16.py)");
  static const char *const SIGMOID[] = {"sigmoid", NULL}, *const NOAUX[] = {"noaux_tc", NULL};
  loom_mla_config *a = &cfg->mla;
  loom_moe_config *e = &cfg->moe;
  bool attention_bias = false, interleave = true, normalised = true;
  int shared = 0, dense = 0, freq = 1, groups = 1, group_topk = 1;
  if (cfg->kv_heads != cfg->heads)
    return bad_field(c, "num_key_value_heads", "must be num_attention_heads: multi-head latent attention gives every "
                     "head its own key and value");
  cfg->kv_heads = 0, cfg->head_dim = 0, cfg->no_bias = true;
  loom_status st = bool_field(c, "attention_bias", false, &attention_bias);
  if (st == LOOM_OK && attention_bias) st = bad_field(c, "attention_bias", "must be false: DeepSeek-V3's projections have no biases");
  if (st == LOOM_OK) st = int_field(c, "q_lora_rank", 1, LOOM_PLAN_MAX_HIDDEN, 0, &a->q_lora_rank);
  if (st == LOOM_OK) st = int_field(c, "kv_lora_rank", 1, LOOM_PLAN_MAX_HIDDEN, -1, &a->kv_lora_rank);
  if (st == LOOM_OK) st = int_field(c, "qk_nope_head_dim", 1, LOOM_ATTN_MAX_HEAD_DIM, -1, &a->qk_head_dim);
  if (st == LOOM_OK) st = int_field(c, "qk_rope_head_dim", 2, LOOM_ATTN_MAX_HEAD_DIM, -1, &a->qk_pos_emb_head_dim);
  if (st == LOOM_OK) st = int_field(c, "v_head_dim", 1, LOOM_ATTN_MAX_HEAD_DIM, -1, &a->v_head_dim);
  if (st == LOOM_OK) st = bool_field(c, "rope_interleave", true, &interleave);
  if (st == LOOM_OK && !interleave)
    st = bad_field(c, "rope_interleave", "must be true, as DeepSeek's checkpoints store RoPE's rows (loom reorders them)");
  const loom_json *scaling = loom_json_get(c->root, "rope_scaling"), *all = scaling ? loom_json_get(scaling, "mscale_all_dim") : NULL;
  if (st == LOOM_OK && all && !(all->kind == LOOM_JSON_NUMBER && isfinite(all->number) && all->number >= 0.0))
    st = bad_field(c, "rope_scaling", "its mscale_all_dim must be a finite number of at least 0");
  a->mscale_all_dim = all && cfg->rope.yarn ? (float)all->number : 0.0f;
  if (st == LOOM_OK) st = int_field(c, "n_routed_experts", 1, LOOM_PLAN_MAX_EXPERTS, -1, &e->experts);
  if (st == LOOM_OK) st = int_field(c, "num_experts_per_tok", 1, LOOM_PLAN_MAX_EXPERTS, -1, &e->topk);
  if (st == LOOM_OK) st = int_field(c, "moe_intermediate_size", 1, LOOM_PLAN_MAX_FFN, -1, &e->ffn);
  if (st == LOOM_OK) st = int_field(c, "n_shared_experts", 1, LOOM_PLAN_MAX_EXPERTS, 0, &shared);
  if (st == LOOM_OK) st = int_field(c, "first_k_dense_replace", 0, cfg->layers - 1, 0, &dense);
  if (st == LOOM_OK) st = int_field(c, "moe_layer_freq", 1, 1, 1, &freq);
  if (st == LOOM_OK) st = int_field(c, "n_group", 1, LOOM_PLAN_MAX_EXPERTS, 1, &groups);
  if (st == LOOM_OK) st = int_field(c, "topk_group", 1, LOOM_PLAN_MAX_EXPERTS, 1, &group_topk);
  if (st == LOOM_OK) st = float_field(c, "routed_scaling_factor", 1.0, &e->topk_scaling);
  if (st == LOOM_OK) st = bool_field(c, "norm_topk_prob", true, &normalised);
  if (st == LOOM_OK) st = string_field(c, "scoring_func", SIGMOID);
  if (st == LOOM_OK) st = string_field(c, "topk_method", NOAUX);
  if (st == LOOM_OK) st = float_field(c, "aux_loss_alpha", 0.0, &e->aux_loss_coeff);
  if (st == LOOM_OK) st = int_field(c, "num_nextn_predict_layers", 0, LOOM_PLAN_MAX_LAYERS, 0, &cfg->mtp_layers);
  if (st == LOOM_OK && normalised != (e->topk > 1))
    st = bad_field(c, "norm_topk_prob", "must be true exactly where num_experts_per_tok exceeds 1: loom normalises the chosen "
                   "sigmoid scores then (Megatron-Core's rule)");
  /* noaux_tc scores a group by its best 2 experts; loom's by its best topk / topk_group */
  if (st == LOOM_OK && groups > 1 && e->topk != 2 * group_topk)
    st = bad_field(c, "topk_group", "must be num_experts_per_tok / 2: noaux_tc scores each group by its best 2 experts, and "
                   "loom by its best num_experts_per_tok / topk_group");
  const int64_t shared_ffn = (int64_t)shared * e->ffn; /* each factor in bounds, their product checked */
  char why[128];
  snprintf(why, sizeof why, "times moe_intermediate_size, the shared experts' width, must be at most %d", LOOM_PLAN_MAX_FFN);
  if (st == LOOM_OK && shared_ffn > LOOM_PLAN_MAX_FFN) st = bad_field(c, "n_shared_experts", why);
  e->shared_ffn = st == LOOM_OK ? (int)shared_ffn : 0;
  e->score = LOOM_MOE_SCORE_SIGMOID, e->expert_bias = true, e->bias_update_rate = LOOM_MOE_BIAS_UPDATE_RATE;
  e->router_groups = groups > 1 ? groups : 0, e->router_group_topk = groups > 1 ? group_topk : 0;
  for (int l = 0; l < dense; l++) loom_gpt_set_dense_layer(cfg, l, true);
  cfg->mtp_loss_scale = LOOM_MTP_LOSS_SCALE_DEFAULT;
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
  if (st == LOOM_OK) st = float_field(c, "rope_theta", 10000.0, &cfg->rope.theta);
  if (st == LOOM_OK) st = string_field(c, "hidden_act", SILU);
  static const char *const NONE[] = {NULL}, *const ATTENTION_ONLY[] = {"attention_dropout", NULL};
  if (st == LOOM_OK) st = dropout_fields(c, NONE, ATTENTION_ONLY, &cfg->dropout);
  bool tied = false;
  if (st == LOOM_OK) st = bool_field(c, "tie_word_embeddings", false, &tied);
  cfg->untied = !tied;
  int head_dim = 0, tp = 1;
  if (st == LOOM_OK) st = int_field(c, "head_dim", 1, LOOM_ATTN_MAX_HEAD_DIM, 0, &head_dim);
  cfg->head_dim = head_dim; /* 0 (absent): hidden_size / num_attention_heads, as transformers' Llama */
  if (st == LOOM_OK) st = int_field(c, "pretraining_tp", 1, 1, 1, &tp);
  if (st == LOOM_OK) st = read_rope_scaling(c, cfg->seq, &cfg->rope);
  return st;
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
  static const char *const *const EXTRA[FAMILIES] = {[MISTRAL] = MISTRAL_FIELDS, [QWEN2] = QWEN2_FIELDS,
                                                     [MIXTRAL] = MIXTRAL_FIELDS, [QWEN2_MOE] = QWEN2_MOE_FIELDS,
                                                     [QWEN3] = QWEN3_FIELDS, [QWEN3_MOE] = QWEN3_MOE_FIELDS,
                                                     [GPT_OSS] = GPT_OSS_FIELDS, [DEEPSEEK_V3] = DEEPSEEK_V3_FIELDS};
  if (st == LOOM_OK) st = known_fields(&c, family == GPT2 ? GPT2_FIELDS : LLAMA_FIELDS, EXTRA[family]);
  if (st == LOOM_OK) st = family == GPT2 ? read_gpt2(&c, cfg) : read_llama(&c, cfg);
  if (st == LOOM_OK && family != GPT2)
    st = family == QWEN2       ? read_qwen2(&c, cfg)
         : family == MIXTRAL   ? read_mixtral(&c, cfg)
         : family == QWEN2_MOE ? read_qwen2_moe(&c, cfg)
         : family == QWEN3     ? read_qwen3(&c, cfg)
         : family == QWEN3_MOE ? read_qwen3_moe(&c, cfg)
         : family == GPT_OSS   ? read_gpt_oss(&c, cfg)
         : family == DEEPSEEK_V3 ? read_deepseek_v3(&c, cfg)
                               : read_llama_biases(&c, cfg);
  if (st == LOOM_OK && family == MISTRAL) st = read_every_layer_window(&c, cfg);
  loom_json_free(&root);
  if (st != LOOM_OK) return st;
  loom_gpt_config_finish(cfg);
  char why[512];
  Loom__Model m = LOOM__MODEL__INIT;
  loom_model_rooms rooms;
  loom_model_proto_fill(&m, cfg, &rooms);
  if (loom_plan_check_model(&m, why, sizeof why))
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: %.*s", path, (int)strcspn(why, "\n"), why);
  return LOOM_OK;
}

/* ---- writing ---- */

/* Why Mixtral's class cannot hold a MoE model, or NULL where it can. */
static const char *not_mixtral(const loom_gpt_config *c) {
  if (c->norm != LOOM_NORM_RMSNORM || c->mlp != LOOM_MLP_SWIGLU || c->position != LOOM_POSITION_ROPE || !c->no_bias ||
      c->qkv_bias || c->out_bias)
    return "its experts' layers are not Mixtral's (rmsnorm, swiglu experts, rope, no biases)";
  if (c->moe.score != LOOM_MOE_SCORE_SOFTMAX || c->moe.pre_softmax)
    return "its router is not Mixtral's (a softmax over every expert, its top-k renormalised)";
  if (loom_gpt_has_dense_layers(c)) return "it has dense layers among its MoE layers, which Mixtral has not";
  return NULL;
}

/* Why Qwen2-MoE's class cannot hold a MoE model with a shared expert, or NULL where it can. */
static const char *not_qwen2_moe(const loom_gpt_config *c) {
  if (c->norm != LOOM_NORM_RMSNORM || c->mlp != LOOM_MLP_SWIGLU || c->position != LOOM_POSITION_ROPE || !c->no_bias ||
      !c->qkv_bias || c->out_bias)
    return "its layers are not Qwen2-MoE's (rmsnorm, swiglu experts, rope, biases on q, k and v alone)";
  if (!c->moe.shared_gate) return "its shared expert has no gate, which Qwen2-MoE's has (--moe-shared-expert-gate)";
  if (c->moe.score != LOOM_MOE_SCORE_SOFTMAX) return "its router is not Qwen2-MoE's (a softmax over every expert)";
  return NULL;
}

/* Why Qwen3-MoE's class cannot hold a MoE model with QK-norm, or NULL where it can. */
static const char *not_qwen3_moe(const loom_gpt_config *c) {
  if (c->norm != LOOM_NORM_RMSNORM || c->mlp != LOOM_MLP_SWIGLU || c->position != LOOM_POSITION_ROPE || !c->no_bias ||
      c->qkv_bias != c->out_bias)
    return "its layers are not Qwen3-MoE's (rmsnorm, swiglu experts, rope, biases on q, k, v and o together or none)";
  if (c->moe.shared_ffn > 0) return "it has a shared expert, which Qwen3-MoE has not";
  if (c->moe.score != LOOM_MOE_SCORE_SOFTMAX) return "its router is not Qwen3-MoE's (a softmax over every expert)";
  return NULL;
}

/* Why GPT-OSS's class cannot hold a MoE model with attention sinks, or NULL where it can. */
static const char *not_gpt_oss(const loom_gpt_config *c) {
  if (c->norm != LOOM_NORM_RMSNORM || c->mlp != LOOM_MLP_SWIGLU || c->position != LOOM_POSITION_ROPE || c->no_bias ||
      c->qk_norm)
    return "its layers are not GPT-OSS's (rmsnorm, swiglu experts, rope, biases on every linear, no QK-norm)";
  if (c->moe.shared_ffn > 0 || loom_gpt_has_dense_layers(c) || loom_gpt_expert_ffn(c) != c->ffn)
    return "its MLPs are not GPT-OSS's (experts in every layer, intermediate_size wide, no shared one)";
  if (c->moe.score != LOOM_MOE_SCORE_SOFTMAX || c->moe.pre_softmax || !c->moe.router_bias)
    return "its router is not GPT-OSS's (a softmax over the top-k logits, a bias on them: --moe-router-bias)";
  if (c->glu.alpha != LOOM_QUICK_GELU_ALPHA || c->glu.offset != 1.0f || !(c->glu.clamp > 0.0f))
    return "its experts' unit is not GPT-OSS's (--quick-geglu, --glu-linear-offset 1, --activation-func-clamp-value)";
  return NULL;
}

/* Why DeepSeek-V3's class cannot hold an MLA model, or NULL where it can. */
static const char *not_deepseek_v3(const loom_gpt_config *c) {
  if (!loom_gpt_is_moe(c)) return "it has no Mixture of Experts, which DeepSeek-V3's class holds MLA with";
  if (c->norm != LOOM_NORM_RMSNORM || c->mlp != LOOM_MLP_SWIGLU || c->position != LOOM_POSITION_ROPE || !c->no_bias ||
      c->qkv_bias || c->out_bias || !c->untied)
    return "its layers are not DeepSeek-V3's (rmsnorm, swiglu experts, rope, no biases, an untied head)";
  if (c->moe.score != LOOM_MOE_SCORE_SIGMOID || c->moe.pre_softmax || c->moe.router_bias || c->moe.shared_gate)
    return "its router is not DeepSeek-V3's (sigmoid scores, no router bias, no gate on the shared expert)";
  if (c->moe.shared_ffn % loom_gpt_expert_ffn(c)) return "its shared expert is not a whole number of experts wide";
  if (c->moe.router_groups > 1 && c->moe.topk != 2 * c->moe.router_group_topk)
    return "its groups are scored by their best topk / group-topk experts, and DeepSeek-V3's class by their best 2";
  int dense = 0; /* the dense layers: a run from the first (first_k_dense_replace) */
  while (dense < c->layers && !loom_gpt_layer_is_moe(c, dense)) dense++;
  if (loom_gpt_moe_layers(c, dense, c->layers) != c->layers - dense || dense == c->layers)
    return "its dense layers are not its first ones alone (first_k_dense_replace)";
  return NULL;
}

/* Why a MoE family's class cannot hold the model's router, or NULL where it can: none of them has a bias on it. */
static const char *not_router(const loom_gpt_config *c) {
  return c->moe.router_bias ? "its router has a bias (--moe-router-bias), which this class's has not" : NULL;
}

/* Why the dense family's class cannot hold the model, or NULL where it can. */
static const char *not_dense(const loom_gpt_config *c, int family) {
  if (c->norm != LOOM_NORM_RMSNORM || c->mlp != LOOM_MLP_SWIGLU || c->position != LOOM_POSITION_ROPE)
    return "a Hugging Face directory holds GPT-2's architecture (GPT2LMHeadModel) or rmsnorm + swiglu + rope "
           "(LlamaForCausalLM; MistralForCausalLM with --window-size; Qwen2ForCausalLM with --qkv-bias; Qwen3ForCausalLM "
           "with --qk-layernorm)";
  if ((family == QWEN3 || family == LLAMA) && loom_gpt_qkv_biased(c) != loom_gpt_out_biased(c))
    return "its attention_bias puts biases on q, k, v and o together or on none";
  if (family == MISTRAL && (!c->no_bias || c->qkv_bias || c->out_bias)) return "Mistral's linears have no biases";
  return NULL;
}

/* Why the family's config.json cannot say the model's sliding windows, or NULL where it can: Mistral and Mixtral
 * window every layer; the Qwen families the layers from max_window_layers on. */
static const char *not_windows(const loom_gpt_config *c, int family) {
  if (c->window <= 0 || family == GPT_OSS) return NULL; /* GPT-OSS's layer_types says each layer's */
  if ((family == MISTRAL || family == MIXTRAL) && loom_gpt_has_full_attention_layers(c))
    return "some of its layers attend in full, and Mistral's and Mixtral's sliding_window covers every layer";
  if (family != MISTRAL && family != MIXTRAL && family != QWEN2 && family != QWEN3 && family != QWEN2_MOE &&
      family != QWEN3_MOE)
    return "its class has no sliding window";
  bool windowed = false;
  for (int l = 0; l < c->layers; l++) {
    if (windowed && loom_gpt_layer_window(c, l) == 0)
      return "a full-attention layer follows a windowed one, and the Qwen classes window the layers from max_window_layers on";
    windowed = windowed || loom_gpt_layer_window(c, l) > 0;
  }
  return NULL;
}

loom_status loom_hf_check_class(const loom_gpt_config *c, loom_error *err) {
  if (loom_gpt_config_is_gpt2(c)) return LOOM_OK;
  const int family = loom_gpt_is_moe(c) ? moe_family(c) : dense_family(c);
  const char *why = loom_gpt_is_mla(c) ? not_deepseek_v3(c)
                    : c->mtp_layers > 0 ? "it predicts more tokens (--mtp-num-layers), which only DeepSeek-V3's class holds"
                    : family == GPT_OSS ? not_gpt_oss(c)
                    : c->softmax != LOOM_SOFTMAX_VANILLA ? "its attention's softmax has a sink (--softmax-type), which no "
                                                           "config.json field of this class says"
                    : family == MIXTRAL     ? not_mixtral(c)
                    : family == QWEN2_MOE ? not_qwen2_moe(c)
                    : family == QWEN3_MOE ? not_qwen3_moe(c)
                                          : not_dense(c, family);
  if (!why) why = not_windows(c, family);
  if (!why && loom_gpt_is_moe(c) && family != GPT_OSS && family != DEEPSEEK_V3) why = not_router(c);
  if (!why && !loom_glu_is_swiglu(c->glu) && family != GPT_OSS)
    why = "its SwiGLU unit is clamped or shifted (--quick-geglu, --activation-func-clamp-value, --glu-linear-offset), which "
          "this class's is not";
  /* Qwen2's classes size their heads hidden / heads: no config.json field of theirs says another width. */
  if (!why && (family == QWEN2 || family == QWEN2_MOE) && loom_gpt_attn_width(c) != c->hidden)
    why = "its heads are not hidden / heads wide, which Qwen2's classes take (--kv-channels: LlamaForCausalLM, or Qwen3's "
          "with --qk-layernorm)";
  if (!why) return LOOM_OK;
  if (loom_gpt_is_moe(c))
    return loom_fail(err, LOOM_ERR_USAGE, "this Mixture of Experts has no Hugging Face class (%s): %s; save it as a loom "
                     "checkpoint or a safetensors file", ARCHITECTURES[family], why);
  char arch[LOOM_ARCHITECTURE_LEN];
  return loom_fail(err, LOOM_ERR_USAGE, "this model (%s) has no Hugging Face class (%s): %s; save it as a loom checkpoint or "
                   "a safetensors file", loom_gpt_config_architecture(c, 1, arch, sizeof arch), ARCHITECTURES[family], why);
}

/* Bytes per layer the per-layer lists of a config.json take at most (mlp_only_layers, layer_types). */
#define LOOM_HF_LAYER_LIST_BYTES 28

/* sliding_window's value: null, or the keys a query sees, its own among them (loom's window + 1). */
static const char *sliding_window_json(const loom_gpt_config *c, char *buf, size_t n) {
  if (c->window > 0) snprintf(buf, n, "%d", c->window + 1);
  else snprintf(buf, n, "null");
  return buf;
}

/* The Qwen families' window fields: use_sliding_window, sliding_window, max_window_layers (the first windowed
 * layer; not_windows: every later one windowed) and layer_types. */
static const char *qwen_windows_json(const loom_gpt_config *c, char *buf, size_t n) {
  char size[32];
  int from = c->layers;
  while (c->window > 0 && from > 0 && loom_gpt_layer_window(c, from - 1) > 0) from--;
  size_t used = (size_t)snprintf(buf, n, "  \"use_sliding_window\": %s,\n  \"sliding_window\": %s,\n  \"max_window_layers\": %d,\n",
                                 c->window > 0 ? "true" : "false", sliding_window_json(c, size, sizeof size), from);
  for (int l = 0; c->window > 0 && l < c->layers && used < n; l++)
    used += (size_t)snprintf(buf + used, n - used, "%s\"%s\"%s", l ? ", " : "  \"layer_types\": [",
                             loom_gpt_layer_window(c, l) > 0 ? "sliding_attention" : "full_attention",
                             l + 1 == c->layers ? "],\n" : "");
  return buf;
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
  char scaling[384] = "null";
  const loom_rope *r = &c->rope;
  char attention[64] = "";
  if (r->yarn && r->attention_factor != (float)loom_yarn_mscale(r->factor, 1.0))
    snprintf(attention, sizeof attention, "\n    \"attention_factor\": %.9g,", (double)r->attention_factor);
  const float all = c->mla.mscale_all_dim;
  if (loom_gpt_is_mla(c) && r->yarn && r->factor > 1.0f && all > 0.0f && r->truncate) {
    /* DeepSeek's own form: the attention factor as mscale against mscale_all_dim (get_mscale's ratio), "type" */
    const double mscale = ((double)r->attention_factor * loom_yarn_mscale(r->factor, all) - 1.0) / (0.1 * log((double)r->factor));
    snprintf(scaling, sizeof scaling,
             "{\n    \"beta_fast\": %.9g,\n    \"beta_slow\": %.9g,\n    \"factor\": %.9g,\n    \"mscale\": %.9g,\n"
             "    \"mscale_all_dim\": %.9g,\n    \"original_max_position_embeddings\": %d,\n    \"type\": \"yarn\"\n  }",
             (double)r->beta_fast, (double)r->beta_slow, (double)r->factor, mscale, (double)all, r->original_max_position);
  } else if (r->factor > 0.0f && r->yarn) /* the defaults of truncate and the attention factor left out, as a Hub config leaves them */
    snprintf(scaling, sizeof scaling,
             "{\n    \"factor\": %.9g,\n    \"original_max_position_embeddings\": %d,\n    \"beta_fast\": %.9g,\n"
             "    \"beta_slow\": %.9g,%s%s\n    \"rope_type\": \"yarn\"\n  }",
             (double)r->factor, r->original_max_position, (double)r->beta_fast, (double)r->beta_slow,
             r->truncate ? "" : "\n    \"truncate\": false,", attention);
  else if (c->rope.factor > 0.0f)
    snprintf(scaling, sizeof scaling,
             "{\n    \"factor\": %.9g,\n    \"low_freq_factor\": %.9g,\n    \"high_freq_factor\": %.9g,\n"
             "    \"original_max_position_embeddings\": %d,\n    \"rope_type\": \"llama3\"\n  }",
             (double)c->rope.factor, (double)c->rope.low_freq_factor, (double)c->rope.high_freq_factor,
             c->rope.original_max_position);
  /* Qwen2 (biases on q, k and v alone) and the MoE families have no bias fields, Llama its two, Qwen3 its one. */
  const int family = loom_gpt_is_moe(c) ? moe_family(c) : dense_family(c);
  /* room for every layer in mlp_only_layers (6 bytes each) and layer_types (22) */
  char own[1024 + LOOM_HF_LAYER_LIST_BYTES * LOOM_GPT_MAX_LAYERS], dense[6 * LOOM_GPT_MAX_LAYERS] = "";
  char windows[256 + 22 * LOOM_GPT_MAX_LAYERS];
  char size[32];
  qwen_windows_json(c, windows, sizeof windows);
  for (int l = 0, used = 0; l < c->layers; l++) /* Qwen2-MoE's dense layers, by index */
    if (!loom_gpt_layer_is_moe(c, l)) used += snprintf(dense + used, sizeof dense - (size_t)used, "%s%d", used ? ", " : "", l);
  char types[22 * LOOM_GPT_MAX_LAYERS];
  for (int l = 0, used = 0; l < c->layers; l++) /* GPT-OSS's layer_types, every layer's */
    used += snprintf(types + used, sizeof types - (size_t)used, "%s\"%s\"", l ? ", " : "",
                     loom_gpt_layer_window(c, l) > 0 ? "sliding_attention" : "full_attention");
  if (family == GPT_OSS)
    snprintf(own, sizeof own, "  \"head_dim\": %d,\n  \"attention_bias\": true,\n  \"sliding_window\": %s,\n"
             "  \"layer_types\": [%s],\n  \"num_local_experts\": %d,\n  \"num_experts_per_tok\": %d,\n"
             "  \"swiglu_limit\": %.9g,\n  \"router_aux_loss_coef\": %.7g,\n  \"output_router_logits\": %s,\n",
             loom_gpt_head_dim(c), sliding_window_json(c, size, sizeof size), types, c->moe.experts, c->moe.topk,
             (double)c->glu.clamp, (double)c->moe.aux_loss_coeff, c->moe.aux_loss_coeff > 0.0f ? "true" : "false");
  else if (family == DEEPSEEK_V3) {
    int dense_layers = 0;
    while (!loom_gpt_layer_is_moe(c, dense_layers)) dense_layers++;
    const loom_mla_config *a = &c->mla;
    char q_rank[32] = "null", shared[32] = "null";
    if (a->q_lora_rank) snprintf(q_rank, sizeof q_rank, "%d", a->q_lora_rank);
    if (c->moe.shared_ffn) snprintf(shared, sizeof shared, "%d", c->moe.shared_ffn / loom_gpt_expert_ffn(c));
    snprintf(own, sizeof own, "  \"kv_lora_rank\": %d,\n  \"q_lora_rank\": %s,\n  \"qk_nope_head_dim\": %d,\n"
             "  \"qk_rope_head_dim\": %d,\n  \"v_head_dim\": %d,\n  \"rope_interleave\": true,\n  \"attention_bias\": false,\n"
             "  \"n_routed_experts\": %d,\n  \"n_shared_experts\": %s,\n  \"num_experts_per_tok\": %d,\n"
             "  \"moe_intermediate_size\": %d,\n  \"first_k_dense_replace\": %d,\n  \"moe_layer_freq\": 1,\n"
             "  \"n_group\": %d,\n  \"topk_group\": %d,\n  \"routed_scaling_factor\": %.9g,\n  \"norm_topk_prob\": %s,\n"
             "  \"scoring_func\": \"sigmoid\",\n  \"topk_method\": \"noaux_tc\",\n  \"aux_loss_alpha\": %.7g,\n"
             "  \"seq_aux\": true,\n  \"ep_size\": 1,\n  \"num_nextn_predict_layers\": %d,\n",
             a->kv_lora_rank, q_rank, a->qk_head_dim, a->qk_pos_emb_head_dim, a->v_head_dim, c->moe.experts, shared, c->moe.topk,
             loom_gpt_expert_ffn(c), dense_layers, c->moe.router_groups > 1 ? c->moe.router_groups : 1,
             c->moe.router_groups > 1 ? c->moe.router_group_topk : 1, (double)(c->moe.topk_scaling > 0.0f ? c->moe.topk_scaling : 1.0f),
             c->moe.topk > 1 ? "true" : "false", (double)c->moe.aux_loss_coeff, c->mtp_layers);
  } else if (family == QWEN3_MOE)
    snprintf(own, sizeof own, "  \"head_dim\": %d,\n  \"attention_bias\": %s,\n%s  \"num_experts\": %d,\n"
             "  \"num_experts_per_tok\": %d,\n"
             "  \"moe_intermediate_size\": %d,\n  \"norm_topk_prob\": %s,\n  \"decoder_sparse_step\": 1,\n"
             "  \"mlp_only_layers\": [%s],\n  \"router_aux_loss_coef\": %.7g,\n  \"output_router_logits\": %s,\n",
             loom_gpt_head_dim(c), attention_biased(c) ? "true" : "false", windows, c->moe.experts, c->moe.topk, loom_gpt_expert_ffn(c),
             c->moe.pre_softmax ? "false" : "true", dense, (double)c->moe.aux_loss_coeff,
             c->moe.aux_loss_coeff > 0.0f ? "true" : "false");
  else if (family == QWEN3)
    snprintf(own, sizeof own, "  \"head_dim\": %d,\n  \"attention_bias\": %s,\n%s", loom_gpt_head_dim(c),
             attention_biased(c) ? "true" : "false", windows);
  else if (family == QWEN2_MOE)
    snprintf(own, sizeof own, "%s"
             "  \"qkv_bias\": true,\n  \"num_experts\": %d,\n  \"num_experts_per_tok\": %d,\n  \"moe_intermediate_size\": %d,\n"
             "  \"shared_expert_intermediate_size\": %d,\n  \"norm_topk_prob\": %s,\n  \"decoder_sparse_step\": 1,\n"
             "  \"mlp_only_layers\": [%s],\n  \"router_aux_loss_coef\": %.7g,\n  \"output_router_logits\": %s,\n", windows,
             c->moe.experts, c->moe.topk, loom_gpt_expert_ffn(c), c->moe.shared_ffn, c->moe.pre_softmax ? "false" : "true",
             dense, (double)c->moe.aux_loss_coeff, c->moe.aux_loss_coeff > 0.0f ? "true" : "false");
  else if (family == MIXTRAL)
    snprintf(own, sizeof own, "  \"head_dim\": %d,\n  \"sliding_window\": %s,\n  \"num_local_experts\": %d,\n"
             "  \"num_experts_per_tok\": %d,\n  \"router_aux_loss_coef\": %.7g,\n  \"router_jitter_noise\": 0.0,\n"
             "  \"output_router_logits\": %s,\n", loom_gpt_head_dim(c), sliding_window_json(c, size, sizeof size),
             c->moe.experts, c->moe.topk,
             (double)c->moe.aux_loss_coeff, c->moe.aux_loss_coeff > 0.0f ? "true" : "false"); /* transformers adds the loss only then */
  else if (family == QWEN2)
    snprintf(own, sizeof own, "%s", windows);
  else if (family == MISTRAL)
    snprintf(own, sizeof own, "  \"head_dim\": %d,\n  \"sliding_window\": %s,\n", loom_gpt_head_dim(c),
             sliding_window_json(c, size, sizeof size));
  else
    snprintf(own, sizeof own, "  \"head_dim\": %d,\n  \"attention_bias\": %s,\n  \"mlp_bias\": %s,\n",
             loom_gpt_head_dim(c), attention_biased(c) ? "true" : "false", c->no_bias ? "false" : "true");
  snprintf(out, n,
           "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n  \"vocab_size\": %d,\n"
           "  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n  \"num_hidden_layers\": %d,\n"
           "  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n"
           "  \"max_position_embeddings\": %d,\n  \"rms_norm_eps\": %.7g,\n  \"rope_theta\": %.9g,\n  \"rope_scaling\": %s,\n"
           "  \"hidden_act\": \"silu\",\n%s  \"attention_dropout\": 0.0,\n"
           "  \"tie_word_embeddings\": %s,\n  \"torch_dtype\": \"%s\"\n}\n",
           ARCHITECTURES[family], MODEL_TYPES[family], c->vocab, c->hidden, family == MIXTRAL ? loom_gpt_expert_ffn(c) : c->ffn,
           c->layers, c->heads,
           loom_gpt_kv_heads(c), c->seq, (double)c->norm_eps, (double)c->rope.theta, scaling, own,
           c->untied ? "false" : "true", torch_dtype);
  return LOOM_OK;
}

/* Where each tensor goes when no file may hold more than max bytes of
 * data (a larger tensor gets a file of its own; tensors are never split),
 * in table order as transformers' save_pretrained fills its shards:
 * shard[k] for tensor k; returns the number of files. */
static int plan_shards(const loom_model_source *src, loom_dtype dtype, uint64_t max, int *shard) {
  int files = 0;
  uint64_t in_file = 0;
  for (int k = 0; k < src->count; k++) {
    loom_hf_stack s;
    const bool stacked = loom_hf_stack_of(src, k, &s);
    const int end = stacked ? s.first + s.count : k + 1; /* a stacked tensor: its every piece, in one file */
    uint64_t bytes = 0;
    for (int j = k; j < end; j++) bytes += loom_safetensors_bytes(src, j, dtype);
    if (files == 0 || (in_file > 0 && in_file + bytes > max)) files++, in_file = 0;
    for (; k < end; k++) shard[k] = files - 1;
    k--;
    in_file += bytes;
  }
  return files;
}

static void shard_name(char *out, size_t n, int i, int files) {
  snprintf(out, n, "model-%05d-of-%05d.safetensors", i + 1, files);
}

static int by_name(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* model.safetensors.index.json: the data's total size and each tensor's file, by name. */
static loom_status write_index(const char *dir, const loom_model_source *src, loom_dtype dtype, const int *shard, int files,
                               loom_error *err) {
  const char **names = malloc(((size_t)src->count + 1) * sizeof *names);
  loom_strbuf b = {0};
  if (!names) return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory writing the index", dir);
  uint64_t total = 0;
  char (*hf)[LOOM_NAME_LEN + 32] = malloc(((size_t)src->count + 1) * sizeof *hf);
  if (!hf) return free(names), loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory writing the index", dir);
  int listed = 0; /* a stacked tensor once, at its first piece */
  for (int k = 0; k < src->count; k++) {
    loom_hf_stack s;
    total += loom_safetensors_bytes(src, k, dtype);
    if (!loom_hf_stack_of(src, k, &s)) names[listed++] = loom_hf_tensor_name(&src->cfg, src->specs[k].name, hf[k], sizeof hf[k]);
    else if (s.piece == 0) names[listed++] = strcpy(hf[k], s.name);
  }
  qsort(names, (size_t)listed, sizeof *names, by_name);
  loom_strbuf_printf(&b, "{\n  \"metadata\": {\n    \"total_size\": %llu\n  },\n  \"weight_map\": {\n",
                     (unsigned long long)total);
  for (int i = 0; i < listed; i++) {
    int k = 0; /* the tensor whose name this is: each name points at its spec's, or at its hf[k] */
    while (names[i] != src->specs[k].name && names[i] != hf[k]) k++;
    char file[64];
    shard_name(file, sizeof file, shard[k], files);
    loom_strbuf_printf(&b, "    \"%s\": \"%s\"%s\n", names[i], file, i + 1 < listed ? "," : "");
  }
  loom_strbuf_printf(&b, "  }\n}\n");
  char path[4200];
  join(path, sizeof path, dir, LOOM_HF_INDEX);
  const loom_chunk chunk = {b.buf, b.len};
  const loom_status st = loom_write_file_atomic(path, &chunk, 1, err);
  free(b.buf);
  free(names);
  free(hf);
  return st;
}

/* The weights as one file, or as shards of at most max bytes with their
 * index, into a fresh directory (loom_hf_write swaps it in whole). */
static loom_status write_weights(const char *dir, const loom_model_source *src, loom_dtype dtype, uint64_t max,
                                 loom_error *err) {
  int *shard = malloc(((size_t)src->count + 1) * sizeof *shard);
  if (!shard) return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", dir);
  const int files = plan_shards(src, dtype, max, shard);
  char path[4200];
  loom_status st = LOOM_OK;
  if (files <= 1) {
    join(path, sizeof path, dir, LOOM_HF_WEIGHTS);
    st = loom_safetensors_write(path, src, 0, src->count, dtype, true, err);
  }
  for (int i = 0, first = 0; files > 1 && i < files && st == LOOM_OK; i++) {
    int last = first;
    while (last < src->count && shard[last] == i) last++;
    char file[64];
    shard_name(file, sizeof file, i, files);
    join(path, sizeof path, dir, file);
    st = loom_safetensors_write(path, src, first, last, dtype, true, err);
    first = last;
  }
  if (files > 1 && st == LOOM_OK) {
    st = write_index(dir, src, dtype, shard, files, err);
  }
  free(shard);
  return st;
}

/* The directory written whole, then swapped in for `dir` (an earlier
 * export there, which --force allowed, goes entirely: no stale shard, index
 * or tokenizer file of it survives). Until the swap the old one stays intact. */
static loom_status swap_in(const char *stage, const char *dir, loom_error *err) {
  char old[4200];
  snprintf(old, sizeof old, "%s.replaced-%d", dir, (int)getpid());
  const bool existed = rename(dir, old) == 0;
  if (!existed && errno != ENOENT)
    return loom_fail(err, LOOM_ERR_WRITE, "%s: cannot move the previous export aside: %s", dir, strerror(errno));
  if (rename(stage, dir) != 0) {
    const int e = errno;
    if (existed) rename(old, dir);
    return loom_fail(err, LOOM_ERR_WRITE, "%s: cannot put the new export in place: %s", dir, strerror(e));
  }
  if (existed) loom_ckpt_remove_step(old);
  return LOOM_OK;
}

loom_status loom_hf_write(const char *out_dir, const loom_model_source *src, loom_dtype dtype, uint64_t max_shard_bytes,
                          const loom_hf_tokenizer *tok, loom_error *err) {
  char json[4096 + LOOM_HF_LAYER_LIST_BYTES * LOOM_GPT_MAX_LAYERS], path[4200], target[4096], dir[4120]; /* config_json's */
  snprintf(target, sizeof target, "%s", out_dir);
  for (size_t n = strlen(target); n > 1 && target[n - 1] == '/'; n--) target[n - 1] = '\0';
  snprintf(dir, sizeof dir, "%s.partial-%d", target, (int)getpid());
  loom_status st = config_json(src, dtype, json, sizeof json, err);
  bool made = false; /* the staging directory, removed again with what is in it if the write fails */
  if (st == LOOM_OK && !(made = mkdir(dir, 0755) == 0))
    st = loom_fail(err, LOOM_ERR_WRITE, "%s: cannot create the model directory: %s", dir, strerror(errno));
  /* DeepSeek-V3's tensors beyond loom's table, unless the source (an opened directory) lists them already */
  loom_model_source extended = {0};
  const bool extend = st == LOOM_OK && loom_hf_deepseek_extras(&src->cfg, NULL, NULL) > 0 &&
                      src->count == loom_gpt_param_table(&src->cfg, NULL, 0, 1, NULL, NULL);
  if (extend) st = loom_hf_deepseek_writer_source(src, &extended, err);
  if (st == LOOM_OK)
    st = write_weights(dir, extend ? &extended : src, dtype, max_shard_bytes ? max_shard_bytes : LOOM_HF_MAX_SHARD_DEFAULT, err);
  if (extend) loom_model_source_free(&extended);
  if (st == LOOM_OK) st = loom_hf_write_tokenizer(dir, tok, src->cfg.seq, err);
  if (st == LOOM_OK) {
    join(path, sizeof path, dir, LOOM_HF_CONFIG);
    const loom_chunk chunk = {json, strlen(json)};
    st = loom_write_file_atomic(path, &chunk, 1, err);
  }
  if (st == LOOM_OK) st = swap_in(dir, target, err);
  if (st != LOOM_OK && made) loom_ckpt_remove_step(dir); /* its files, then itself */
  return st;
}
