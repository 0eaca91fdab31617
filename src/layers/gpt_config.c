/* Model presets, derived sizes and descriptions (the rules are the plan's: loom_plan_check_model). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "backend/op_math.h"
#include "core/decimal.h"
#include "layers/gpt_config.h"

const char *const LOOM_NORM_NAMES[] = {"layernorm", "rmsnorm", NULL};
const char *const LOOM_MLP_NAMES[] = {"gelu", "swiglu", NULL};
const char *const LOOM_POSITION_NAMES[] = {"learned", "rope", NULL};
const char *const LOOM_MOE_SCORE_NAMES[] = {"softmax", "sigmoid", NULL};
const char *const LOOM_SOFTMAX_NAMES[] = {"vanilla", "off-by-one", "learnable", NULL};
const char *const LOOM_ROPE_TYPE_NAMES[] = {"rope", "yarn", NULL};
const char *const LOOM_MOE_DROP_POLICY_NAMES[] = {"probs", "position", NULL};

/* The Llama family's settings; the sizes are Meta's published configs
 * (Llama 3 model card and params.json: rms_norm_eps 1e-5, rope_theta 500000,
 * vocab 128256, 8192 positions). */
#define LLAMA .norm = LOOM_NORM_RMSNORM, .mlp = LOOM_MLP_SWIGLU, .position = LOOM_POSITION_ROPE, .no_bias = true, \
              .untied = true, .norm_eps = 1e-5f

/* The presets, each named once: PRESETS[i] is LOOM_GPT_PRESET_NAMES[i].
 * gpt-tiny is the default: small enough to learn 2-digit addition on 2 cores
 * in about a minute (wider or deeper models sit longer on the plateau before
 * attention finds the digits it needs). llama-tiny is its Llama-family twin:
 * 4 query heads of 16 sharing 2 key/value heads, a SwiGLU width near 8h/3
 * that every tp up to 8 divides, and a third layer: with two, grouped-query
 * attention sat on the plateau at 2000 steps for one seed of two, and 8
 * heads of 8 for most (measured with seeds 1, 2, 5 and 1337). */
const char *const LOOM_GPT_PRESET_NAMES[] = {"gpt-tiny", "gpt2-small", "gpt-1.3b", "gpt-13b", "gpt50b",
                                             "gpt-175b", "llama-tiny", "llama3-8b", "llama3-70b", "moe-tiny",
                                             "mixtral-8x7b", "mixtral-8x22b", "qwen1.5-moe-a2.7b", "qwen3-8b",
                                             "qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-20b",
                                             "gpt-oss-120b", "deepseek-v3", "deepseek-v3-tiny", NULL};
static const loom_gpt_config PRESETS[] = {
    {.layers = 2, .hidden = 64, .heads = 4, .vocab = 256, .seq = 64, .norm_eps = 1e-5f},
    {.layers = 12, .hidden = 768, .heads = 12, .vocab = 50257, .seq = 1024, .norm_eps = 1e-5f},
    {.layers = 24, .hidden = 2048, .heads = 16, .vocab = 50257, .seq = 2048, .norm_eps = 1e-5f},
    {.layers = 40, .hidden = 5120, .heads = 40, .vocab = 50257, .seq = 2048, .norm_eps = 1e-5f},
    {.layers = 64, .hidden = 8192, .heads = 64, .ffn = 32768, .vocab = 51200, .seq = 2048, .norm_eps = 1e-5f},
    {.layers = 96, .hidden = 12288, .heads = 96, .vocab = 50257, .seq = 2048, .norm_eps = 1e-5f},
    {.layers = 3, .hidden = 64, .heads = 4, .kv_heads = 2, .ffn = 176, .vocab = 256, .seq = 64, LLAMA, .rope = {.theta = 10000.0f}},
    {.layers = 32, .hidden = 4096, .heads = 32, .kv_heads = 8, .ffn = 14336, .vocab = 128256, .seq = 8192, LLAMA,
     .rope = {.theta = 500000.0f}},
    {.layers = 80, .hidden = 8192, .heads = 64, .kv_heads = 8, .ffn = 28672, .vocab = 128256, .seq = 8192, LLAMA,
     .rope = {.theta = 500000.0f}},
    /* moe-tiny: llama-tiny's attention with 8 SwiGLU experts of 64, top 2,
     * and the load-balancing loss at Megatron's usual 1e-2. */
    {.layers = 2, .hidden = 64, .heads = 4, .kv_heads = 2, .ffn = 64, .vocab = 256, .seq = 64, LLAMA, .rope = {.theta = 10000.0f},
     .moe = {.experts = 8, .topk = 2, .aux_loss_coeff = 1e-2f}},
    /* Mistral AI's Mixtral 8x7B (its config.json: 32768 positions, rope_theta
     * 1e6, vocab 32000, 8 experts of 14336, top 2; router_aux_loss_coef 0.02). */
    {.layers = 32, .hidden = 4096, .heads = 32, .kv_heads = 8, .ffn = 14336, .vocab = 32000, .seq = 32768, LLAMA,
     .rope = {.theta = 1000000.0f}, .moe = {.experts = 8, .topk = 2, .aux_loss_coeff = 2e-2f}},
    /* Mixtral 8x22B (its config.json: 56 layers, hidden 6144, 48 heads, 8 kv
     * heads, 8 experts of 16384, top 2, vocab 32768, 65536 positions,
     * rope_theta 1e6, router_aux_loss_coef 0.001). */
    {.layers = 56, .hidden = 6144, .heads = 48, .kv_heads = 8, .ffn = 16384, .vocab = 32768, .seq = 65536, LLAMA,
     .rope = {.theta = 1000000.0f}, .moe = {.experts = 8, .topk = 2, .aux_loss_coeff = 1e-3f}},
    /* Qwen1.5-MoE-A2.7B (its config.json, Qwen2MoeForCausalLM: 24 layers,
     * hidden 2048, 16 heads, 60 experts of 1408, top 4 taken as their
     * probabilities (norm_topk_prob false: the pre-softmax order), a gated
     * shared expert of 5632, biases on q, k and v, vocab 151936, 8192
     * positions, rope_theta 1e6, rms_norm_eps 1e-6, router_aux_loss_coef 0.001). */
    {.layers = 24, .hidden = 2048, .heads = 16, .ffn = 5632, .vocab = 151936, .seq = 8192, .norm = LOOM_NORM_RMSNORM,
     .mlp = LOOM_MLP_SWIGLU, .position = LOOM_POSITION_ROPE, .no_bias = true, .qkv_bias = true, .untied = true,
     .norm_eps = 1e-6f, .rope = {.theta = 1000000.0f},
     .moe = {.experts = 60, .topk = 4, .ffn = 1408, .shared_ffn = 5632, .shared_gate = true, .pre_softmax = true,
             .aux_loss_coeff = 1e-3f}},
    /* Qwen3 (the Qwen team's config.json files, Qwen3ForCausalLM and
     * Qwen3MoeForCausalLM): heads 128 wide whatever hidden / heads is, QK-norm,
     * no biases, untied, vocab 151936, 40960 positions, rope_theta 1e6,
     * rms_norm_eps 1e-6. The MoE models' every layer has 128 experts, top 8
     * renormalised (norm_topk_prob), no shared expert; router_aux_loss_coef
     * 0.001. */
#define QWEN3 .norm = LOOM_NORM_RMSNORM, .mlp = LOOM_MLP_SWIGLU, .position = LOOM_POSITION_ROPE, .no_bias = true, \
              .untied = true, .norm_eps = 1e-6f, .head_dim = 128, .qk_norm = true, .vocab = 151936, .seq = 40960, \
              .rope = {.theta = 1000000.0f}
    {.layers = 36, .hidden = 4096, .heads = 32, .kv_heads = 8, .ffn = 12288, QWEN3},
    {.layers = 64, .hidden = 5120, .heads = 64, .kv_heads = 8, .ffn = 25600, QWEN3},
    {.layers = 48, .hidden = 2048, .heads = 32, .kv_heads = 4, .ffn = 6144, QWEN3,
     .moe = {.experts = 128, .topk = 8, .ffn = 768, .aux_loss_coeff = 1e-3f}},
    {.layers = 94, .hidden = 4096, .heads = 64, .kv_heads = 4, .ffn = 12288, QWEN3,
     .moe = {.experts = 128, .topk = 8, .ffn = 1536, .aux_loss_coeff = 1e-3f}},
#undef QWEN3
    /* GPT-OSS (OpenAI's config.json files, GptOssForCausalLM): hidden 2880,
     * 64 query heads of 64 sharing 8 key/value heads, biases on every linear,
     * learned attention sinks, a sliding window of 128 (loom's 127 keys
     * back) in the even layers and full attention in the odd ones, YaRN
     * (factor 32 over 4096 positions, beta_fast 32, beta_slow 1, not
     * truncated; its attention factor 0.1 ln 32 + 1) on rope_theta 150000,
     * every MLP 32 or 128 experts of 2880, top 4, with the clamped unit
     * (swiglu_limit 7) and a router bias; rms_norm_eps 1e-5, untied, vocab
     * 201088, router_aux_loss_coef 0.9. */
#define GPT_OSS .hidden = 2880, .heads = 64, .kv_heads = 8, .head_dim = 64, .ffn = 2880, .vocab = 201088, .seq = 131072, \
                .norm = LOOM_NORM_RMSNORM, .mlp = LOOM_MLP_SWIGLU, .position = LOOM_POSITION_ROPE, .untied = true, \
                .norm_eps = 1e-5f, .softmax = LOOM_SOFTMAX_LEARNABLE, .window = 127, \
                .glu = {.alpha = LOOM_QUICK_GELU_ALPHA, .clamp = 7.0f, .offset = 1.0f}, \
                .rope = {.theta = 150000.0f, .factor = 32.0f, .original_max_position = 4096, .yarn = 1, .beta_fast = 32.0f, \
                         .beta_slow = 1.0f, .attention_factor = 1.34657359f}
    {.layers = 24, GPT_OSS, .full_attention = {0xAAAAAAull},
     .moe = {.experts = 32, .topk = 4, .router_bias = true, .aux_loss_coeff = 0.9f}},
    {.layers = 36, GPT_OSS, .full_attention = {0xAAAAAAAAAull},
     .moe = {.experts = 128, .topk = 4, .router_bias = true, .aux_loss_coeff = 0.9f}},
#undef GPT_OSS
    /* DeepSeek-V3 (its config.json, DeepseekV3ForCausalLM): 61 layers, hidden
     * 7168, 128 heads under multi-head latent attention (q latent 1536, kv
     * latent 512, heads 128 + 64 RoPE dims, v 128), YaRN (factor 40 over 4096
     * positions, mscale and mscale_all_dim 1) on rope_theta 10000, the first
     * 3 layers dense (first_k_dense_replace, ffn 18432), the rest 256 experts
     * of 2048 beside one shared, top 8 from the best 4 of 8 groups
     * (noaux_tc), sigmoid scores with the expert bias, weights normalised and
     * scaled by 2.5; rms_norm_eps 1e-6, untied, vocab 129280; the
     * sequence-wise balance loss's coefficient (aux_loss_alpha 1e-4) on
     * loom's per-micro-batch one; one MTP module (num_nextn_predict_layers)
     * at Megatron's loss scale 0.1 (DeepSeek's 0.3 for its first 10T tokens). */
#define DEEPSEEK_V3 .norm = LOOM_NORM_RMSNORM, .mlp = LOOM_MLP_SWIGLU, .position = LOOM_POSITION_ROPE, .no_bias = true, \
                    .untied = true, .norm_eps = 1e-6f
    {.layers = 61, .hidden = 7168, .heads = 128, .ffn = 18432, .vocab = 129280, .seq = 163840, DEEPSEEK_V3,
     .rope = {.theta = 10000.0f, .factor = 40.0f, .original_max_position = 4096, .yarn = 1, .beta_fast = 32.0f,
              .beta_slow = 1.0f, .truncate = 1, .attention_factor = 1.0f},
     .mla = {.q_lora_rank = 1536, .kv_lora_rank = 512, .qk_head_dim = 128, .qk_pos_emb_head_dim = 64, .v_head_dim = 128,
             .mscale_all_dim = 1.0f},
     .moe = {.experts = 256, .topk = 8, .ffn = 2048, .shared_ffn = 2048, .score = LOOM_MOE_SCORE_SIGMOID, .expert_bias = true,
             .bias_update_rate = LOOM_MOE_BIAS_UPDATE_RATE, .router_groups = 8, .router_group_topk = 4, .topk_scaling = 2.5f,
             .aux_loss_coeff = 1e-4f, .dense = {0x7}},
     .mtp_layers = 1, .mtp_loss_scale = LOOM_MTP_LOSS_SCALE_DEFAULT},
    /* deepseek-v3-tiny: its architecture at llama-tiny's scale for tests: 4
     * layers (the first dense), hidden 64, 4 heads (q latent 32, kv latent
     * 16, heads 16 + 8 RoPE dims, v 16), 16 experts of 32 beside a shared
     * one, top 4 from the best 2 of 4 groups, and one MTP module. */
    {.layers = 4, .hidden = 64, .heads = 4, .ffn = 128, .vocab = 256, .seq = 64, DEEPSEEK_V3, .rope = {.theta = 10000.0f},
     .mla = {.q_lora_rank = 32, .kv_lora_rank = 16, .qk_head_dim = 16, .qk_pos_emb_head_dim = 8, .v_head_dim = 16},
     .moe = {.experts = 16, .topk = 4, .ffn = 32, .shared_ffn = 32, .score = LOOM_MOE_SCORE_SIGMOID, .expert_bias = true,
             .bias_update_rate = LOOM_MOE_BIAS_UPDATE_RATE, .router_groups = 4, .router_group_topk = 2, .topk_scaling = 2.5f,
             .aux_loss_coeff = 1e-4f, .dense = {0x1}},
     .mtp_layers = 1, .mtp_loss_scale = LOOM_MTP_LOSS_SCALE_DEFAULT},
#undef DEEPSEEK_V3
};
#define NPRESETS (sizeof PRESETS / sizeof PRESETS[0])
_Static_assert(sizeof LOOM_GPT_PRESET_NAMES / sizeof LOOM_GPT_PRESET_NAMES[0] == NPRESETS + 1,
               "every preset has its name in the list");

int loom_gpt_config_preset(loom_gpt_config *cfg, int i) {
  if (i < 0 || (size_t)i >= NPRESETS) return -1;
  *cfg = PRESETS[i];
  loom_gpt_config_finish(cfg);
  return 0;
}

void loom_gpt_config_finish(loom_gpt_config *cfg) {
  if (cfg->ffn <= 0) cfg->ffn = 4 * cfg->hidden;
  if (cfg->kv_heads <= 0) cfg->kv_heads = cfg->heads;
  if (cfg->heads > 0 && cfg->head_dim * cfg->heads == cfg->hidden) cfg->head_dim = 0; /* hidden / heads: one way to say it */
  if (!cfg->no_bias) cfg->qkv_bias = cfg->out_bias = false; /* every linear's bias already: one way to say it */
  if (cfg->position == LOOM_POSITION_ROPE && !(cfg->rope.theta > 0.0f)) cfg->rope.theta = LOOM_ROPE_THETA_DEFAULT;
  if (cfg->moe.experts > 0 && cfg->moe.ffn <= 0) cfg->moe.ffn = cfg->ffn;
  if (cfg->vocab > 0) {
    cfg->padded_vocab = (cfg->vocab + LOOM_VOCAB_ALIGN - 1) / LOOM_VOCAB_ALIGN * LOOM_VOCAB_ALIGN;
  }
}

loom_gpt_config loom_gpt_config_for_tp(const loom_gpt_config *cfg, int tp) {
  loom_gpt_config c = *cfg;
  const int align = LOOM_VOCAB_ALIGN * tp;
  c.padded_vocab = (c.vocab + align - 1) / align * align;
  return c;
}

int loom_gpt_vocab_shard(const loom_gpt_config *cfg, int tp) { return loom_gpt_config_for_tp(cfg, tp).padded_vocab / tp; }

loom_gpt_config loom_gpt_config_for_ep(const loom_gpt_config *cfg, int etp, int ep, int ep_rank) {
  loom_gpt_config c = *cfg;
  if (loom_gpt_is_moe(&c)) c.moe.etp = etp, c.moe.ep = ep, c.moe.ep_rank = ep_rank;
  return c;
}

bool loom_gpt_config_is_gpt2(const loom_gpt_config *c) {
  return c->norm == LOOM_NORM_LAYERNORM && c->mlp == LOOM_MLP_GELU && c->position == LOOM_POSITION_LEARNED &&
         !c->no_bias && loom_gpt_kv_heads(c) == c->heads && !loom_gpt_is_moe(c) && loom_gpt_attn_width(c) == c->hidden &&
         !c->qk_norm && c->softmax == LOOM_SOFTMAX_VANILLA && c->window == 0 && !loom_gpt_is_mla(c);
}

/* DeepSeek's: 1 / sqrt(q's head width), times YaRN's get_mscale(factor, mscale_all_dim) squared. */
float loom_gpt_softmax_scale(const loom_gpt_config *c) {
  if (!loom_gpt_is_mla(c) || c->mla.mscale_all_dim <= 0.0f || !c->rope.yarn || c->position != LOOM_POSITION_ROPE) return 0.0f;
  const double m = loom_yarn_mscale(c->rope.factor, c->mla.mscale_all_dim);
  return (float)(m * m / sqrt((double)loom_gpt_qk_head_dim(c)));
}

bool loom_gpt_config_same_model(const loom_gpt_config *a, const loom_gpt_config *b) {
  return a->layers == b->layers && a->hidden == b->hidden && a->heads == b->heads &&
         loom_gpt_head_dim(a) == loom_gpt_head_dim(b) && a->qk_norm == b->qk_norm && a->softmax == b->softmax &&
         memcmp(&a->mla, &b->mla, sizeof a->mla) == 0 &&
         memcmp(&a->glu, &b->glu, sizeof a->glu) == 0 &&
         a->window == b->window && memcmp(a->full_attention, b->full_attention, sizeof a->full_attention) == 0 &&
         loom_gpt_kv_heads(a) == loom_gpt_kv_heads(b) && a->ffn == b->ffn && a->vocab == b->vocab && a->seq == b->seq &&
         a->norm == b->norm && a->mlp == b->mlp && a->position == b->position &&
         (a->position != LOOM_POSITION_ROPE || memcmp(&a->rope, &b->rope, sizeof a->rope) == 0) && a->no_bias == b->no_bias &&
         loom_gpt_qkv_biased(a) == loom_gpt_qkv_biased(b) && loom_gpt_out_biased(a) == loom_gpt_out_biased(b) &&
         a->untied == b->untied && a->mtp_layers == b->mtp_layers && a->moe.experts == b->moe.experts &&
         (!loom_gpt_is_moe(a) || (a->moe.topk == b->moe.topk && loom_gpt_expert_ffn(a) == loom_gpt_expert_ffn(b) &&
                                  a->moe.shared_ffn == b->moe.shared_ffn && a->moe.score == b->moe.score &&
                                  a->moe.pre_softmax == b->moe.pre_softmax && a->moe.shared_gate == b->moe.shared_gate &&
                                  a->moe.router_bias == b->moe.router_bias && a->moe.router_groups == b->moe.router_groups &&
                                  a->moe.router_group_topk == b->moe.router_group_topk &&
                                  a->moe.topk_scaling == b->moe.topk_scaling &&
                                  memcmp(a->moe.dense, b->moe.dense, sizeof a->moe.dense) == 0));
}

/* Megatron's list form of c's MoE layers, run by run: "([0]*3+[1]*58)". */
static const char *layer_freq(const loom_gpt_config *c, char *buf, size_t n) {
  size_t used = (size_t)snprintf(buf, n, "(");
  for (int l = 0; l < c->layers && used < n;) {
    const bool moe = loom_gpt_layer_is_moe(c, l);
    int run = 1;
    while (l + run < c->layers && loom_gpt_layer_is_moe(c, l + run) == moe) run++;
    used += (size_t)snprintf(buf + used, n - used, "%s[%d]*%d", l ? "+" : "", moe, run);
    l += run;
  }
  if (used < n) snprintf(buf + used, n - used, ")");
  return buf;
}

const char *loom_gpt_config_describe(const loom_gpt_config *c, char *buf, size_t n) {
  char rope[48] = "learned positions";
  if (c->position == LOOM_POSITION_ROPE)
    snprintf(rope, sizeof rope, "rope %g%s", (double)c->rope.theta,
             c->rope.factor > 0.0f ? (c->rope.yarn ? " scaled (yarn)" : " scaled (llama3)") : "");
  snprintf(buf, n, "layers %d, hidden %d, heads %d, kv heads %d, ffn %d, vocab %d, seq %d, %s, %s, %s, %s, %s",
           c->layers, c->hidden, c->heads, loom_gpt_kv_heads(c), c->ffn, c->vocab, c->seq, LOOM_NORM_NAMES[c->norm & 1],
           LOOM_MLP_NAMES[c->mlp & 1], rope, !c->no_bias ? "biases" : c->qkv_bias && c->out_bias ? "attention biases only" : c->qkv_bias ? "qkv bias only" : c->out_bias ? "output bias only" : "no bias", c->untied ? "untied" : "tied");
  size_t used = strlen(buf);
  if (loom_gpt_is_mla(c) && used < n)
    snprintf(buf + used, n - used, ", mla q rank %d, kv rank %d, heads %d+%d, v %d", c->mla.q_lora_rank, c->mla.kv_lora_rank,
             c->mla.qk_head_dim, c->mla.qk_pos_emb_head_dim, c->mla.v_head_dim),
        used = strlen(buf);
  else if (loom_gpt_attn_width(c) != c->hidden && used < n)
    snprintf(buf + used, n - used, ", head dim %d", loom_gpt_head_dim(c)), used = strlen(buf);
  if (c->qk_norm && used < n) snprintf(buf + used, n - used, ", qk norm"), used = strlen(buf);
  if (c->softmax && used < n) snprintf(buf + used, n - used, ", softmax %s", LOOM_SOFTMAX_NAMES[c->softmax % 3]), used = strlen(buf);
  if (c->window > 0 && used < n)
    snprintf(buf + used, n - used, ", window %d%s", c->window, loom_gpt_has_full_attention_layers(c) ? " (some layers full)" : ""),
        used = strlen(buf);
  if (loom_gpt_is_moe(c) && used < n)
    snprintf(buf + used, n - used, ", %d experts of %d, top %d%s", c->moe.experts, loom_gpt_expert_ffn(c), c->moe.topk,
             c->moe.shared_ffn ? ", shared" : "");
  const size_t more = strlen(buf);
  char freq[160];
  if (loom_gpt_has_dense_layers(c) && more < n)
    snprintf(buf + more, n - more, ", MoE layers %s", layer_freq(c, freq, sizeof freq));
  return buf;
}

const char *loom_gpt_config_architecture(const loom_gpt_config *c, int tp, char *buf, size_t n) {
  size_t used = 0;
  buf[0] = '\0';
#define PUT(...) (used += (size_t)snprintf(buf + used, used < n ? n - used : 0, __VA_ARGS__), used = used < n ? used : n)
  const int kv = loom_gpt_kv_heads(c);
  if (kv != c->heads) {
    PUT("%s attention, %d kv head%s", kv == 1 ? "multi-query" : "grouped-query", kv, kv == 1 ? "" : "s");
    if (loom_gpt_kv_replicas(c, tp) > 1) PUT(" (each replicated on %d tp ranks)", loom_gpt_kv_replicas(c, tp));
    else if (tp > 1) PUT(" (%d per tp rank)", loom_gpt_local_kv_heads(c, tp));
  }
  if (loom_gpt_is_mla(c)) {
    PUT("%smulti-head latent attention (", used ? ", " : "");
    if (c->mla.q_lora_rank) PUT("q rank %d, ", c->mla.q_lora_rank);
    PUT("kv rank %d, q and k heads of %d + %d RoPE, v heads of %d)", c->mla.kv_lora_rank, c->mla.qk_head_dim,
        c->mla.qk_pos_emb_head_dim, c->mla.v_head_dim);
  } else if (loom_gpt_attn_width(c) != c->hidden) PUT("%sheads of %d", used ? ", " : "", loom_gpt_head_dim(c));
  if (c->qk_norm) PUT("%sqk-layernorm", used ? ", " : "");
  if (c->softmax == LOOM_SOFTMAX_LEARNABLE) PUT("%sattention sinks", used ? ", " : "");
  if (c->softmax == LOOM_SOFTMAX_OFF_BY_ONE) PUT("%soff-by-one softmax", used ? ", " : "");
  if (c->window > 0) {
    int windowed = 0;
    for (int l = 0; l < c->layers; l++) windowed += loom_gpt_layer_window(c, l) > 0;
    PUT("%ssliding window of %d keys back in %d of %d layers", used ? ", " : "", c->window, windowed, c->layers);
  }
  if (c->norm != LOOM_NORM_LAYERNORM) PUT("%s%s", used ? ", " : "", LOOM_NORM_NAMES[c->norm & 1]);
  if (c->mlp != LOOM_MLP_GELU) PUT("%s%s", used ? ", " : "", LOOM_MLP_NAMES[c->mlp & 1]);
  if (!loom_glu_is_swiglu(c->glu))
    PUT(" (gate sigmoid(%g gate), clamp %g, offset %g)", (double)(c->glu.alpha > 0.0f ? c->glu.alpha : 1.0f),
        (double)c->glu.clamp, (double)c->glu.offset);
  if (c->position == LOOM_POSITION_ROPE) PUT("%srope theta %g", used ? ", " : "", (double)c->rope.theta);
  if (c->position == LOOM_POSITION_ROPE && c->rope.factor > 0.0f)
    PUT(" scaled by %g (%s)", (double)c->rope.factor, c->rope.yarn ? "yarn" : "llama3");
  if (c->no_bias)
    PUT("%s%s", used ? ", " : "", c->qkv_bias && c->out_bias ? "biases on q, k, v and o only"
                                  : c->qkv_bias              ? "biases on q, k and v only"
                                  : c->out_bias              ? "a bias on o only"
                                                             : "no biases");
  if (c->untied) PUT("%suntied head", used ? ", " : "");
  if (loom_gpt_is_moe(c)) {
    PUT("%s%d experts of %d, top %d (%s%s%s)", used ? ", " : "", c->moe.experts, loom_gpt_expert_ffn(c), c->moe.topk,
        LOOM_MOE_SCORE_NAMES[c->moe.score & 1], c->moe.pre_softmax ? ", pre-softmax" : "",
        c->moe.expert_bias ? ", expert bias" : "");
    if (c->moe.router_bias) PUT(", a router bias");
    if (c->moe.router_groups > 1) PUT(", from the best %d of %d groups", c->moe.router_group_topk, c->moe.router_groups);
    if (c->moe.topk_scaling > 0.0f) PUT(", weights scaled by %g", (double)c->moe.topk_scaling);
    if (loom_gpt_experts_biased(c)) PUT(", biases on the experts");
    if (c->moe.shared_ffn) PUT(", a shared expert of %d%s", c->moe.shared_ffn, c->moe.shared_gate ? " (gated)" : "");
    char freq[160];
    if (loom_gpt_has_dense_layers(c))
      PUT(", in %d of %d layers %s", loom_gpt_moe_layers(c, 0, c->layers), c->layers, layer_freq(c, freq, sizeof freq));
  }
  if (c->mtp_layers > 0)
    PUT("%smulti-token prediction: %d module%s, loss scale %g", used ? ", " : "", c->mtp_layers, c->mtp_layers == 1 ? "" : "s",
        (double)c->mtp_loss_scale);
#undef PUT
  return buf;
}

const char *const LOOM_FLOPS_FORMULA_NAMES[] = {"megatron", "sc21", "nemo", NULL};

const char *loom_flops_formula_name(loom_flops_formula f) {
  return LOOM_FLOPS_FORMULA_NAMES[f == LOOM_FLOPS_SC21 || f == LOOM_FLOPS_NEMO ? f : LOOM_FLOPS_MEGATRON];
}

/* ---- --moe-layer-freq ---- */

int loom_gpt_moe_layers(const loom_gpt_config *c, int begin, int end) {
  int n = 0;
  for (int l = begin; l < end; l++) n += loom_gpt_layer_is_moe(c, l);
  return n;
}

/* Python's list form, read into out[cap]: expr = term ('+' term)*, term =
 * ('[' 0|1 (',' 0|1)* ']' | '(' expr ')') ('*' count)?. */
typedef struct {
  const char *at;
  uint8_t *out;
  int len, cap;
  const char *why;
} freq_parser;

static void skip_spaces(freq_parser *p) {
  while (*p->at == ' ') p->at++;
}

static bool fail_freq(freq_parser *p, const char *why) {
  if (!p->why) p->why = why;
  return false;
}

/* A count of at most LOOM_GPT_MAX_LAYERS: an entry or a repetition. */
static bool read_count(freq_parser *p, long *v) {
  skip_spaces(p);
  int64_t n;
  const loom_decimal d = loom_parse_decimal(p->at, &p->at, 0, LOOM_GPT_MAX_LAYERS, &n);
  if (d == LOOM_DECIMAL_NONE) return fail_freq(p, "expected a number");
  if (d == LOOM_DECIMAL_RANGE) return fail_freq(p, "a count out of range");
  *v = (long)n;
  return true;
}

static bool freq_expr(freq_parser *p);

static bool freq_term(freq_parser *p) {
  skip_spaces(p);
  const int from = p->len;
  if (*p->at == '[') {
    p->at++;
    do {
      long v;
      if (!read_count(p, &v)) return false;
      if (v != 0 && v != 1) return fail_freq(p, "each entry must be 1 (a Mixture of Experts) or 0 (dense)");
      if (p->len == p->cap) return fail_freq(p, "more entries than the model's layers");
      p->out[p->len++] = (uint8_t)v;
      skip_spaces(p);
    } while (*p->at == ',' && p->at++);
    if (*p->at != ']') return fail_freq(p, "expected ']'");
    p->at++;
  } else if (*p->at == '(') {
    p->at++;
    if (!freq_expr(p)) return false;
    skip_spaces(p);
    if (*p->at != ')') return fail_freq(p, "expected ')'");
    p->at++;
  } else {
    return fail_freq(p, "expected '[' or '('");
  }
  skip_spaces(p);
  if (*p->at != '*') return true;
  p->at++;
  long times;
  if (!read_count(p, &times)) return false;
  if (times < 0 || times > LOOM_GPT_MAX_LAYERS) return fail_freq(p, "a repetition count out of range");
  const int one = p->len - from;
  if (times == 0) p->len = from;
  for (long t = 1; t < times; t++) {
    if (p->len + one > p->cap) return fail_freq(p, "more entries than the model's layers");
    memmove(p->out + p->len, p->out + from, (size_t)one);
    p->len += one;
  }
  return true;
}

static bool freq_expr(freq_parser *p) {
  if (!freq_term(p)) return false;
  for (skip_spaces(p); *p->at == '+'; skip_spaces(p)) {
    p->at++;
    if (!freq_term(p)) return false;
  }
  return true;
}

/* Megatron's layer pattern (moe_freq_type): an integer N, or the list
 * form, read into on[layers] (1 or 0 per layer); the integer N is left to
 * the caller (*every = N; on untouched), whose meaning differs per flag.
 * 0 on success, else -1 with why filled. */
static int parse_layer_pattern(const char *text, int layers, const char *one_means, uint8_t *on, int64_t *every, char *why,
                               size_t n) {
  char body[4096];
  size_t len = strlen(text);
  if (len >= 2 && (text[0] == '\'' || text[0] == '"') && text[len - 1] == text[0]) text++, len -= 2;
  if (len >= sizeof body) {
    snprintf(why, n, "too long");
    return -1;
  }
  memcpy(body, text, len);
  body[len] = '\0';
  *every = 0;
  const loom_decimal whole = loom_parse_decimal(body, NULL, 1, LOOM_GPT_MAX_LAYERS, every);
  freq_parser p = {.at = body, .out = on, .cap = layers < LOOM_GPT_MAX_LAYERS ? layers : LOOM_GPT_MAX_LAYERS};
  if (whole == LOOM_DECIMAL_RANGE) {
    snprintf(why, n, "an integer must be in [1, %d] (1: %s)", LOOM_GPT_MAX_LAYERS, one_means);
    return -1;
  }
  if (whole != LOOM_DECIMAL_NONE) return 0;
  if (freq_expr(&p)) {
    skip_spaces(&p);
    if (*p.at != '\0') p.why = "unexpected text after the list";
  }
  if (p.why) {
    snprintf(why, n, "%s", p.why);
    return -1;
  }
  if (p.len != layers) {
    snprintf(why, n, "gives %d entries for the model's %d layers", p.len, layers);
    return -1;
  }
  return 0;
}

int loom_gpt_parse_moe_layer_freq(loom_gpt_config *c, const char *text, char *why, size_t n) {
  uint8_t moe[LOOM_GPT_MAX_LAYERS] = {0};
  int64_t every;
  if (parse_layer_pattern(text, c->layers, "every layer a Mixture of Experts", moe, &every, why, n) != 0) return -1;
  for (int l = 0; l < c->layers; l++) loom_gpt_set_dense_layer(c, l, every ? l % every != 0 : !moe[l]);
  return 0;
}

int loom_gpt_parse_window_skip_freq(loom_gpt_config *c, const char *text, char *why, size_t n) {
  uint8_t windowed[LOOM_GPT_MAX_LAYERS] = {0};
  int64_t every;
  if (parse_layer_pattern(text, c->layers, "every layer attends in full", windowed, &every, why, n) != 0) return -1;
  for (int l = 0; l < c->layers; l++) loom_gpt_set_full_attention_layer(c, l, every ? (l + 1) % every == 0 : !windowed[l]);
  return 0;
}
