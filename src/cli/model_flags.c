/* Model-shape flags and their resolution. */
#include <stdint.h>
#include <string.h>
#include "core/decimal.h"
#include "backend/op_math.h"
#include "ckpt/export.h"
#include "cli/names.h"
#include "cli/model_flags.h"
#include "plan/plan.h"

void loom_model_flags_table(loom_model_flags *mf, loom_flag *out) {
  const loom_flag table[LOOM_MODEL_FLAG_COUNT] = {
      {"--model", FLAG_STRING, &mf->preset, "model preset", LOOM_NO_RANGE, LOOM_GPT_PRESET_NAMES, false, NULL},
      {"--init-from", FLAG_STRING, &mf->init_from, "start from a model instead of random init: an llm.c file, a Hugging Face directory (config.json, model.safetensors) or a directory of loom checkpoints (its latest)", LOOM_NO_RANGE, NULL, false, NULL},
      {"--layers", FLAG_INT, &mf->layers, "transformer layers (overrides the preset)", 1, LOOM_PLAN_MAX_LAYERS, NULL, false, "model.layers"},
      {"--hidden", FLAG_INT, &mf->hidden, "hidden size", 1, LOOM_PLAN_MAX_HIDDEN, NULL, false, "model.hidden"},
      {"--heads", FLAG_INT, &mf->heads, "attention heads", 1, LOOM_PLAN_MAX_HEADS, NULL, false, "model.heads"},
      {"--ffn", FLAG_INT, &mf->ffn, "MLP width (0: 4 * hidden)", 0, LOOM_PLAN_MAX_FFN, NULL, false, "model.ffn"},
      {"--vocab", FLAG_INT, &mf->vocab, "vocabulary size", 2, LOOM_PLAN_MAX_VOCAB, NULL, false, "model.vocab"},
      {"--seq", FLAG_INT, &mf->seq, "sequence length", 1, LOOM_PLAN_MAX_SEQ, NULL, false, "model.seq"},
      {"--dropout", FLAG_FLOAT, &mf->dropout, "dropout probability", 0, 0.99, NULL, false, "model.dropout"},
      {"--kv-heads", FLAG_INT, &mf->kv_heads, "key/value heads: fewer than --heads for grouped-query attention, 1 for multi-query",
       1, LOOM_PLAN_MAX_HEADS, NULL, false, "model.kv_heads"},
      {"--kv-channels", FLAG_INT, &mf->kv_channels, "each attention head's width (unset: hidden / heads; Qwen3's 128)", 1,
       LOOM_ATTN_MAX_HEAD_DIM, NULL, false, "model.kv_channels"},
      {"--qk-layernorm", FLAG_BOOL, &mf->qk_layernorm, "RMSNorm over each head's q and k before RoPE (Qwen3)", LOOM_NO_RANGE,
       NULL, false, "model.qk_layernorm"},
      {"--multi-latent-attention", FLAG_BOOL, &mf->mla,
       "multi-head latent attention (DeepSeek-V3's): q from a low-rank latent, keys and values from one compressed "
       "latent and a shared RoPE key", LOOM_NO_RANGE, NULL, false, "model.mla"},
      {"--q-lora-rank", FLAG_INT, &mf->q_lora_rank, "MLA: q's latent width (unset: q from the hidden state; DeepSeek-V3's "
       "1536)", 1, LOOM_PLAN_MAX_HIDDEN, NULL, false, "model.mla.q_lora_rank"},
      {"--kv-lora-rank", FLAG_INT, &mf->kv_lora_rank, "MLA: the compressed keys and values' width (32; DeepSeek-V3's 512)",
       1, LOOM_PLAN_MAX_HIDDEN, NULL, false, "model.mla.kv_lora_rank"},
      {"--qk-head-dim", FLAG_INT, &mf->qk_head_dim, "MLA: a q or k head's part without RoPE (128)", 1,
       LOOM_ATTN_MAX_HEAD_DIM, NULL, false, "model.mla.qk_head_dim"},
      {"--qk-pos-emb-head-dim", FLAG_INT, &mf->qk_pos_emb_head_dim,
       "MLA: a q or k head's RoPE part, the key's shared by every head (64)", 2, LOOM_ATTN_MAX_HEAD_DIM, NULL, false,
       "model.mla.qk_pos_emb_head_dim"},
      {"--v-head-dim", FLAG_INT, &mf->v_head_dim, "MLA: a v head's width (128)", 1, LOOM_ATTN_MAX_HEAD_DIM, NULL, false,
       "model.mla.v_head_dim"},
      {"--mscale", FLAG_FLOAT, &mf->mscale, "YaRN: cos and sin times get_mscale(factor, this) / get_mscale(factor, "
       "--mscale-all-dim) (1)", 0, 1e3, NULL, false, "model.rope_scaling.attention_factor"},
      {"--mscale-all-dim", FLAG_FLOAT, &mf->mscale_all_dim,
       "YaRN with MLA: the softmax scale times get_mscale(factor, this)^2 (DeepSeek-V3's 1; unset: none)", 1e-6, 1e3, NULL,
       false, "model.mla.mscale_all_dim"},
      {"--mtp-num-layers", FLAG_INT, &mf->mtp_layers, "multi-token prediction modules after the layers, each predicting one "
       "token further ahead (DeepSeek-V3's 1; 0: none)", 0, LOOM_PLAN_MAX_LAYERS, NULL, false, "model.mtp_num_layers"},
      {"--mtp-loss-scaling-factor", FLAG_FLOAT, &mf->mtp_loss_scale, "multi-token prediction: the weight of the modules' "
       "mean loss in the training loss (0.1)", 0, 1e3, NULL, false, "model.mtp_loss_scaling_factor"},
      {"--softmax-type", FLAG_STRING, &mf->softmax_type,
       "the attention's softmax: learnable gives each head a logit in every row's denominator (GPT-OSS's attention sinks)",
       LOOM_NO_RANGE, LOOM_SOFTMAX_NAMES, false, "model.softmax_type"},
      {"--window-size", FLAG_STRING, &mf->window_size,
       "sliding-window attention: LEFT,0, a query seeing the keys at most LEFT positions back (Hugging Face's "
       "sliding_window is LEFT + 1)", LOOM_NO_RANGE, NULL, false, "model.window_size"},
      {"--window-attn-skip-freq", FLAG_STRING, &mf->window_skip_freq,
       "which layers attend in full under --window-size: N (one after every N - 1 windowed) or a list such as "
       "([1,0]*12) (1: windowed)", LOOM_NO_RANGE, NULL, false, "model.window_pattern"},
      {"--norm", FLAG_STRING, &mf->norm, "the blocks' and final norm", LOOM_NO_RANGE, LOOM_NORM_NAMES, false, "model.norm"},
      {"--mlp", FLAG_STRING, &mf->mlp, "the MLP's activation (swiglu: gated, gate and up each --ffn wide)", LOOM_NO_RANGE,
       LOOM_MLP_NAMES, false, "model.mlp"},
      {"--quick-geglu", FLAG_BOOL, &mf->quick_geglu, "with --mlp swiglu: the gate's activation g sigmoid(1.702 g) (GPT-OSS's)",
       LOOM_NO_RANGE, NULL, false, "model.glu_alpha"},
      {"--activation-func-clamp-value", FLAG_FLOAT, &mf->glu_clamp,
       "with --mlp swiglu: the gate capped at it and the up value clamped to it both ways (GPT-OSS's 7)", 0, 1e6, NULL, false,
       "model.glu_clamp"},
      {"--glu-linear-offset", FLAG_FLOAT, &mf->glu_offset, "with --mlp swiglu: added to the up value (GPT-OSS's 1)", -1e6, 1e6,
       NULL, false, "model.glu_offset"},
      {"--position", FLAG_STRING, &mf->position, "positions: a learned table, or rotary (RoPE) on q and k", LOOM_NO_RANGE,
       LOOM_POSITION_NAMES, false, "model.position"},
      {"--rope-theta", FLAG_FLOAT, &mf->rope_theta, "RoPE's base (10000; Llama 3: 500000)", 1.0001, 1e12, NULL, false,
       "model.rope_theta"},
      {"--rope-type", FLAG_STRING, &mf->rope_type,
       "RoPE's kind: rope, or yarn (YaRN's scaling by --rotary-scaling-factor from seq / factor original positions)",
       LOOM_NO_RANGE, LOOM_ROPE_TYPE_NAMES, false, "model.rope_scaling.yarn"},
      {"--rotary-scaling-factor", FLAG_FLOAT, &mf->rotary_scaling_factor, "YaRN's factor (GPT-OSS's 32, DeepSeek-V3's 40)",
       1.0, 1e6, NULL, false, "model.rope_scaling.factor"},
      {"--no-bias", FLAG_BOOL, &mf->no_bias, "linears without biases (Llama)", LOOM_NO_RANGE, NULL, false, "model.bias"},
      {"--qkv-bias", FLAG_BOOL, &mf->qkv_bias, "with --no-bias: q, k and v keep their biases (Qwen2)", LOOM_NO_RANGE, NULL,
       false, "model.qkv_bias"},
      {"--out-bias", FLAG_BOOL, &mf->out_bias,
       "with --no-bias: the attention's output projection keeps its bias (with --qkv-bias: q, k, v and o, GPT-OSS's)",
       LOOM_NO_RANGE, NULL, false, "model.out_bias"},
      {"--untied", FLAG_BOOL, &mf->untied, "an LM head of its own, not the input embedding", LOOM_NO_RANGE, NULL, false,
       "model.tied_embeddings"},
      {"--num-experts", FLAG_INT, &mf->experts, "experts in each layer's MLP: a Mixture of Experts (0: dense)", 0,
       LOOM_PLAN_MAX_EXPERTS, NULL, false, "model.moe.experts"},
      {"--moe-router-topk", FLAG_INT, &mf->moe_topk, "experts each token takes (2)", 1, LOOM_PLAN_MAX_EXPERTS, NULL, false,
       "model.moe.topk"},
      {"--moe-ffn-hidden-size", FLAG_INT, &mf->moe_ffn, "each expert's MLP width (0: --ffn)", 0, LOOM_PLAN_MAX_FFN, NULL, false,
       "model.moe.ffn"},
      {"--moe-shared-expert-intermediate-size", FLAG_INT, &mf->moe_shared_ffn,
       "the shared expert's MLP width, beside the routed ones (0: none)", 0, LOOM_PLAN_MAX_FFN, NULL, false,
       "model.moe.shared_ffn"},
      {"--moe-layer-freq", FLAG_STRING, &mf->moe_layer_freq,
       "which layers are MoE layers: N (one in every N) or Megatron's list form, such as ([0]*3+[1]*58) (1: every layer)",
       LOOM_NO_RANGE, NULL, false, "model.moe.layer_pattern"},
      {"--moe-router-bias", FLAG_BOOL, &mf->moe_router_bias,
       "a learned bias on the router's logits (GPT-OSS's router.bias; not --moe-router-enable-expert-bias)", LOOM_NO_RANGE,
       NULL, false, "model.moe.router_bias"},
      {"--moe-shared-expert-gate", FLAG_BOOL, &mf->moe_shared_gate,
       "the shared expert's output times a sigmoid gate of the token (Qwen2-MoE's shared_expert_gate)", LOOM_NO_RANGE, NULL,
       false, "model.moe.shared_gate"},
      {"--moe-router-score-function", FLAG_STRING, &mf->moe_score, "the router's scores (softmax; sigmoid: DeepSeek-V3's)",
       LOOM_NO_RANGE, LOOM_MOE_SCORE_NAMES, false, "model.moe.score"},
      {"--moe-router-pre-softmax", FLAG_BOOL, &mf->moe_pre_softmax,
       "softmax over every expert, then the top-k (Mixtral's order; else softmax over the chosen)", LOOM_NO_RANGE, NULL,
       false, "model.moe.pre_softmax"},
      {"--moe-aux-loss-coeff", FLAG_FLOAT, &mf->moe_aux_loss_coeff, "the load-balancing loss's weight (0: none; 1e-2 usual)",
       0, 1e6, NULL, false, "model.moe.aux_loss_coeff"},
      {"--moe-z-loss-coeff", FLAG_FLOAT, &mf->moe_z_loss_coeff, "the router z-loss's weight (0: none; 1e-3 usual)", 0, 1e6,
       NULL, false, "model.moe.z_loss_coeff"},
      {"--moe-expert-capacity-factor", FLAG_FLOAT, &mf->moe_capacity_factor,
       "tokens an expert takes over its even share, the rest dropped (unset: dropless)", 1e-6,
       LOOM_PLAN_MAX_CAPACITY_FACTOR, NULL, false, "model.moe.capacity_factor"},
      {"--moe-token-drop-policy", FLAG_STRING, &mf->moe_drop_policy,
       "over capacity, drop the choices of lowest weight (probs) or the latest tokens (position)", LOOM_NO_RANGE,
       LOOM_MOE_DROP_POLICY_NAMES, false, "model.moe.drop_by_position"},
      {"--moe-router-enable-expert-bias", FLAG_BOOL, &mf->moe_expert_bias,
       "DeepSeek-V3's aux-loss-free balancing: sigmoid scores plus a per-expert bias, moved each step toward the less "
       "loaded experts", LOOM_NO_RANGE, NULL, false, "model.moe.expert_bias"},
      {"--moe-router-bias-update-rate", FLAG_FLOAT, &mf->moe_bias_update_rate,
       "the expert bias's step each training step (1e-3)", 0, 1, NULL, false, "model.moe.bias_update_rate"},
      {"--moe-router-num-groups", FLAG_INT, &mf->moe_router_groups,
       "group-limited routing: the experts in this many equal groups, a token's top-k from the best "
       "--moe-router-group-topk of them (DeepSeek-V3's 8; 0: none)", 0, LOOM_PLAN_MAX_EXPERTS, NULL, false,
       "model.moe.router_groups"},
      {"--moe-router-group-topk", FLAG_INT, &mf->moe_router_group_topk,
       "the groups a token's experts come from, each scored by its best topk / group-topk scores (DeepSeek-V3's 4)", 0,
       LOOM_PLAN_MAX_EXPERTS, NULL, false, "model.moe.router_group_topk"},
      {"--moe-router-topk-scaling-factor", FLAG_FLOAT, &mf->moe_topk_scaling,
       "the chosen experts' weights times this (DeepSeek-V3's 2.5; unset: 1)", 1e-6, 1e6, NULL, false,
       "model.moe.topk_scaling"},
  };
  memcpy(out, table, sizeof table);
}

static bool flag_set(const loom_flag *table, const char *name) {
  return loom_flags_find(table, LOOM_MODEL_FLAG_COUNT, name)->set;
}

/* The MLA flags onto cfg: --multi-latent-attention makes the attention MLA
 * with Megatron's default sizes unless told (off: the q, k and v
 * projections again), and its sizes need it; --mscale and --mscale-all-dim
 * set YaRN's two factors, as Megatron's YarnRotaryEmbedding and DeepSeek's
 * attention take them. */
static loom_status resolve_mla(const char *cmd, const loom_model_flags *mf, const loom_flag *table, loom_gpt_config *cfg,
                               loom_error *err) {
  static const char *const SIZES[] = {"--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim",
                                      "--v-head-dim", "--mscale-all-dim"};
  loom_mla_config *a = &cfg->mla;
  if (flag_set(table, "--multi-latent-attention")) {
    if (!mf->mla) *a = (loom_mla_config){0};
    else if (!loom_gpt_is_mla(cfg)) *a = (loom_mla_config){.kv_lora_rank = 32, .qk_head_dim = 128, .qk_pos_emb_head_dim = 64,
                                                           .v_head_dim = 128};
    /* every head its own key and value, of MLA's widths: the preset's grouping and head width go (unless given) */
    if (mf->mla && !flag_set(table, "--kv-heads")) cfg->kv_heads = 0;
    if (mf->mla && !flag_set(table, "--kv-channels")) cfg->head_dim = 0;
  }
  for (size_t i = 0; i < sizeof SIZES / sizeof SIZES[0]; i++)
    if (flag_set(table, SIZES[i]) && !loom_gpt_is_mla(cfg))
      return loom_fail(err, LOOM_ERR_USAGE, "%s: %s sizes multi-head latent attention, but this model's attention is "
                       "not; add --multi-latent-attention", cmd, SIZES[i]);
  if (flag_set(table, "--q-lora-rank")) a->q_lora_rank = mf->q_lora_rank;
  if (flag_set(table, "--kv-lora-rank")) a->kv_lora_rank = mf->kv_lora_rank;
  if (flag_set(table, "--qk-head-dim")) a->qk_head_dim = mf->qk_head_dim;
  if (flag_set(table, "--qk-pos-emb-head-dim")) a->qk_pos_emb_head_dim = mf->qk_pos_emb_head_dim;
  if (flag_set(table, "--v-head-dim")) a->v_head_dim = mf->v_head_dim;
  if (flag_set(table, "--mscale-all-dim")) a->mscale_all_dim = mf->mscale_all_dim;
  if ((flag_set(table, "--mscale") || flag_set(table, "--mscale-all-dim")) && !cfg->rope.yarn)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: --mscale and --mscale-all-dim are YaRN's; add --rope-type yarn and "
                     "--rotary-scaling-factor", cmd);
  if (flag_set(table, "--mscale") || flag_set(table, "--mscale-all-dim"))
    cfg->rope.attention_factor = (float)(loom_yarn_mscale(cfg->rope.factor, flag_set(table, "--mscale") ? mf->mscale : 1.0) /
                                         loom_yarn_mscale(cfg->rope.factor, a->mscale_all_dim));
  return LOOM_OK;
}

/* The MoE flags onto cfg: --num-experts makes a dense preset a Mixture of
 * Experts (top 2 unless told), and the other flags need one. */
static loom_status resolve_moe(const char *cmd, const loom_model_flags *mf, const loom_flag *table, loom_gpt_config *cfg,
                               loom_error *err) {
  static const char *const SETTINGS[] = {"--moe-router-topk", "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size",
                                         "--moe-router-score-function", "--moe-router-pre-softmax", "--moe-aux-loss-coeff",
                                         "--moe-z-loss-coeff", "--moe-expert-capacity-factor", "--moe-token-drop-policy",
                                         "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate",
                                         "--moe-shared-expert-gate", "--moe-layer-freq", "--moe-router-bias",
                                         "--moe-router-num-groups", "--moe-router-group-topk",
                                         "--moe-router-topk-scaling-factor"};
  loom_moe_config *e = &cfg->moe;
  if (flag_set(table, "--num-experts")) {
    if (mf->experts == 0) *e = (loom_moe_config){0};
    else if (e->experts == 0) *e = (loom_moe_config){.experts = mf->experts, .topk = 2};
    else e->experts = mf->experts;
  }
  for (size_t i = 0; i < sizeof SETTINGS / sizeof SETTINGS[0]; i++)
    if (flag_set(table, SETTINGS[i]) && e->experts == 0)
      return loom_fail(err, LOOM_ERR_USAGE, "%s: %s configures a Mixture of Experts, but this model is dense; add "
                       "--num-experts", cmd, SETTINGS[i]);
  if (flag_set(table, "--moe-router-topk")) e->topk = mf->moe_topk;
  if (flag_set(table, "--moe-ffn-hidden-size")) e->ffn = mf->moe_ffn;
  if (flag_set(table, "--moe-shared-expert-intermediate-size")) e->shared_ffn = mf->moe_shared_ffn;
  if (flag_set(table, "--moe-shared-expert-gate")) e->shared_gate = mf->moe_shared_gate;
  if (flag_set(table, "--moe-router-bias")) e->router_bias = mf->moe_router_bias;
  char why[160];
  if (flag_set(table, "--moe-layer-freq") && loom_gpt_parse_moe_layer_freq(cfg, mf->moe_layer_freq, why, sizeof why) != 0)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: --moe-layer-freq %.*s%s: %s (give N, one MoE layer in every N, or Megatron's list "
                     "form such as ([0]*3+[1]*58))", cmd, LOOM_QUOTE(mf->moe_layer_freq), why);
  if (flag_set(table, "--moe-router-score-function"))
    e->score = (loom_moe_score)loom_flag_choice_index(LOOM_MOE_SCORE_NAMES, mf->moe_score);
  if (flag_set(table, "--moe-router-pre-softmax")) e->pre_softmax = mf->moe_pre_softmax;
  if (flag_set(table, "--moe-aux-loss-coeff")) e->aux_loss_coeff = mf->moe_aux_loss_coeff;
  if (flag_set(table, "--moe-z-loss-coeff")) e->z_loss_coeff = mf->moe_z_loss_coeff;
  if (flag_set(table, "--moe-expert-capacity-factor")) e->capacity_factor = mf->moe_capacity_factor;
  if (flag_set(table, "--moe-token-drop-policy"))
    e->drop_by_position = loom_flag_choice_index(LOOM_MOE_DROP_POLICY_NAMES, mf->moe_drop_policy) == 1;
  if (flag_set(table, "--moe-router-enable-expert-bias")) e->expert_bias = mf->moe_expert_bias;
  if (e->expert_bias && e->bias_update_rate == 0.0f) e->bias_update_rate = LOOM_MOE_BIAS_UPDATE_RATE;
  if (flag_set(table, "--moe-router-bias-update-rate")) e->bias_update_rate = mf->moe_bias_update_rate;
  if (flag_set(table, "--moe-router-num-groups")) e->router_groups = mf->moe_router_groups;
  if (flag_set(table, "--moe-router-group-topk")) e->router_group_topk = mf->moe_router_group_topk;
  if (flag_set(table, "--moe-router-topk-scaling-factor")) e->topk_scaling = mf->moe_topk_scaling;
  return LOOM_OK;
}

/* Megatron's --window-size, a (left, right) tuple ("128,0", "(128, 0)"): the left half, right 0 (loom's attention is
 * causal); a left of -1 is no window. */
static loom_status parse_window_size(const char *cmd, const char *text, int *window, loom_error *err) {
  char body[64];
  size_t n = 0;
  for (const char *c = text; *c && n + 1 < sizeof body; c++)
    if (*c != '(' && *c != ')' && *c != ' ') body[n++] = *c;
  body[n] = '\0';
  int64_t left = 0, right = 0;
  const char *at = body;
  loom_decimal d = loom_parse_decimal(body, &at, -1, LOOM_PLAN_MAX_SEQ, &left);
  if (d == LOOM_DECIMAL_OK && *at == ',') d = loom_parse_decimal(at + 1, &at, INT32_MIN, INT32_MAX, &right);
  if (d != LOOM_DECIMAL_OK || *at != '\0' || left == 0)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: --window-size " LOOM_QUOTE_FMT ": give LEFT,RIGHT as Megatron does (128,0: "
                     "each query sees the 128 keys before it), LEFT from 1 to %d or -1 for none", cmd, LOOM_QUOTE(text),
                     LOOM_PLAN_MAX_SEQ);
  if (right != 0)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: --window-size " LOOM_QUOTE_FMT ": the right half must be 0: loom's attention "
                     "is causal, no query sees a later key", cmd, LOOM_QUOTE(text));
  *window = left < 0 ? 0 : (int)left;
  return LOOM_OK;
}

/* The window's flags on cfg (whose layers are set). */
static loom_status resolve_window(const char *cmd, const loom_model_flags *mf, const loom_flag *table, loom_gpt_config *cfg,
                                  loom_error *err) {
  if (flag_set(table, "--window-size")) {
    const loom_status st = parse_window_size(cmd, mf->window_size, &cfg->window, err);
    if (st != LOOM_OK) return st;
  }
  if (!flag_set(table, "--window-attn-skip-freq")) return LOOM_OK;
  if (cfg->window <= 0)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: --window-attn-skip-freq says which layers skip the window, but there is no "
                     "window; add --window-size", cmd);
  char why[160];
  if (loom_gpt_parse_window_skip_freq(cfg, mf->window_skip_freq, why, sizeof why) != 0)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: --window-attn-skip-freq " LOOM_QUOTE_FMT ": %s (give N, one full-attention "
                     "layer after N - 1 windowed ones, or a list such as ([1,0]*12), 1 for a windowed layer)", cmd,
                     LOOM_QUOTE(mf->window_skip_freq), why);
  return LOOM_OK;
}

loom_status loom_model_flags_resolve(const char *cmd, const loom_model_flags *mf, const loom_flag *table,
                                     loom_gpt_config *cfg, int *T, loom_error *err) {
  static const char *const SHAPE[] = {"--layers", "--hidden", "--heads", "--ffn", "--vocab", "--model", "--kv-heads",
                                      "--kv-channels", "--qk-layernorm", "--softmax-type", "--window-size",
                                      "--window-attn-skip-freq", "--rope-type", "--rotary-scaling-factor", "--quick-geglu",
                                      "--activation-func-clamp-value", "--glu-linear-offset", "--norm", "--mlp", "--position", "--rope-theta", "--no-bias", "--qkv-bias", "--out-bias", "--untied",
                                      "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size",
                                      "--moe-shared-expert-intermediate-size", "--moe-router-score-function",
                                      "--moe-router-pre-softmax", "--moe-layer-freq", "--moe-shared-expert-gate", "--moe-router-bias"};
  if (mf->init_from) {
    for (size_t i = 0; i < sizeof SHAPE / sizeof SHAPE[0]; i++)
      if (loom_flags_find(table, LOOM_MODEL_FLAG_COUNT, SHAPE[i])->set)
        return loom_fail(err, LOOM_ERR_USAGE, "%s: %s cannot be combined with --init-from: the model file fixes the model",
                         cmd, SHAPE[i]);
    /* Opened as a source, not only its config read: the weights' header is
     * checked against the config before anything the config sizes is built
     * (a config claiming a larger model than its file holds is refused here). */
    loom_model_source src;
    loom_status st = loom_model_file_source(&src, mf->init_from, err);
    if (st != LOOM_OK) return st;
    *cfg = src.cfg;
    loom_model_source_free(&src);
    /* The config's dropout (hf.c reads it as loom's one probability), unless --dropout replaces it. */
    if (flag_set(table, "--dropout")) cfg->dropout = mf->dropout;
    *T = loom_flags_find(table, LOOM_MODEL_FLAG_COUNT, "--seq")->set ? mf->seq : cfg->seq;
    if (*T > cfg->seq)
      return loom_fail(err, LOOM_ERR_USAGE, "%s: --seq %d exceeds the model's maximum sequence length %d",
                       cmd, *T, cfg->seq);
    return LOOM_OK;
  }
  loom_cli_preset(mf->preset, cfg); /* the flag's choices guarantee a known preset */
  const bool multi_head = cfg->kv_heads == cfg->heads; /* then kv heads follow --heads */
  const int overrides[] = {mf->layers, mf->hidden, mf->heads, mf->ffn, mf->vocab, mf->seq, mf->kv_heads, mf->kv_channels};
  int *fields[] = {&cfg->layers, &cfg->hidden, &cfg->heads, &cfg->ffn, &cfg->vocab, &cfg->seq, &cfg->kv_heads, &cfg->head_dim};
  static const char *const NAMES[] = {"--layers", "--hidden", "--heads", "--ffn", "--vocab", "--seq", "--kv-heads",
                                      "--kv-channels"};
  for (int i = 0; i < 8; i++)
    if (flag_set(table, NAMES[i])) *fields[i] = overrides[i];
  if (!flag_set(table, "--ffn") && flag_set(table, "--hidden"))
    cfg->ffn = 0; /* follow the new hidden size */
  if (!flag_set(table, "--kv-heads") && flag_set(table, "--heads") && multi_head) cfg->kv_heads = 0;
  if (flag_set(table, "--norm")) cfg->norm = (loom_norm_kind)loom_flag_choice_index(LOOM_NORM_NAMES, mf->norm);
  if (flag_set(table, "--mlp")) cfg->mlp = (loom_mlp_kind)loom_flag_choice_index(LOOM_MLP_NAMES, mf->mlp);
  if (flag_set(table, "--quick-geglu")) cfg->glu.alpha = mf->quick_geglu ? LOOM_QUICK_GELU_ALPHA : 0.0f;
  if (flag_set(table, "--activation-func-clamp-value")) cfg->glu.clamp = mf->glu_clamp;
  if (flag_set(table, "--glu-linear-offset")) cfg->glu.offset = mf->glu_offset;
  if (flag_set(table, "--position")) cfg->position = (loom_position_kind)loom_flag_choice_index(LOOM_POSITION_NAMES, mf->position);
  if (flag_set(table, "--rope-theta")) cfg->rope.theta = mf->rope_theta;
  if (flag_set(table, "--rope-theta") && cfg->position != LOOM_POSITION_ROPE)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: --rope-theta sets RoPE's base, but this model has learned positions; add "
                     "--position rope", cmd);
  if (flag_set(table, "--rope-type") || flag_set(table, "--rotary-scaling-factor")) {
    const bool yarn = flag_set(table, "--rope-type") ? loom_flag_choice_index(LOOM_ROPE_TYPE_NAMES, mf->rope_type) == 1
                                                     : cfg->rope.yarn != 0;
    if (!yarn || cfg->position != LOOM_POSITION_ROPE || !flag_set(table, "--rotary-scaling-factor"))
      return loom_fail(err, LOOM_ERR_USAGE, "%s: --rope-type yarn and --rotary-scaling-factor go together, on a model with "
                       "--position rope", cmd);
    const float factor = mf->rotary_scaling_factor;
    cfg->rope = (loom_rope){.theta = cfg->rope.theta, .factor = factor, .original_max_position = (int)(cfg->seq / factor),
                            .yarn = 1, .beta_fast = LOOM_YARN_BETA_FAST, .beta_slow = LOOM_YARN_BETA_SLOW, .truncate = 1,
                            .attention_factor = (float)loom_yarn_mscale(factor, 1.0)};
  }
  if (flag_set(table, "--no-bias")) cfg->no_bias = mf->no_bias;
  if (flag_set(table, "--qkv-bias") && !cfg->no_bias)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: --qkv-bias keeps q, k and v's biases where the others are dropped, but this "
                     "model has biases on every linear; add --no-bias", cmd);
  if (flag_set(table, "--qkv-bias")) cfg->qkv_bias = mf->qkv_bias;
  if (flag_set(table, "--out-bias") && !cfg->no_bias)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: --out-bias keeps the attention output's bias where the others are dropped, "
                     "but this model has biases on every linear; add --no-bias", cmd);
  if (flag_set(table, "--out-bias")) cfg->out_bias = mf->out_bias;
  if (flag_set(table, "--untied")) cfg->untied = mf->untied;
  if (flag_set(table, "--qk-layernorm")) cfg->qk_norm = mf->qk_layernorm;
  if (flag_set(table, "--softmax-type"))
    cfg->softmax = (loom_softmax_kind)loom_flag_choice_index(LOOM_SOFTMAX_NAMES, mf->softmax_type);
  loom_status st = resolve_moe(cmd, mf, table, cfg, err);
  if (st == LOOM_OK) st = resolve_window(cmd, mf, table, cfg, err);
  if (st == LOOM_OK) st = resolve_mla(cmd, mf, table, cfg, err);
  if (st != LOOM_OK) return st;
  if (flag_set(table, "--mtp-num-layers")) cfg->mtp_layers = mf->mtp_layers;
  if (flag_set(table, "--mtp-num-layers") && !flag_set(table, "--mtp-loss-scaling-factor") && cfg->mtp_loss_scale == 0.0f)
    cfg->mtp_loss_scale = LOOM_MTP_LOSS_SCALE_DEFAULT;
  if (flag_set(table, "--mtp-loss-scaling-factor") && cfg->mtp_layers == 0)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: --mtp-loss-scaling-factor weighs the multi-token prediction loss, but this "
                     "model has no MTP modules; add --mtp-num-layers", cmd);
  if (flag_set(table, "--mtp-loss-scaling-factor")) cfg->mtp_loss_scale = mf->mtp_loss_scale;
  cfg->dropout = mf->dropout;
  loom_gpt_config_finish(cfg); /* the plan's rules check the shape */
  *T = cfg->seq;
  return LOOM_OK;
}
