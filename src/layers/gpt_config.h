/* The model configuration: one decoder-only transformer whose norm, MLP,
 * positions, attention heads, biases and embedding tie are settings, as
 * Megatron-Core builds GPT and Llama from one TransformerConfig. GPT-2 is
 * the zero setting of every switch, so a config written with designated
 * initialisers for GPT-2 needs none of them. Presets, derived sizes and
 * validation. */
#ifndef LOOM_GPT_CONFIG_H
#define LOOM_GPT_CONFIG_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "tensor_parallel/fp8_linear.h"
#include "backend/ops.h"

/* What a stage recomputes in backward: its first `layers` layers (0: none;
 * LOOM_RECOMPUTE_ALL or any count past its layers: every one), in groups
 * of `group` consecutive layers (0 or 1: each layer alone) of which a slot
 * keeps only the first one's input and backward reruns the whole group's
 * forward before the group's backwards (Megatron-LM's uniform method with
 * --recompute-num-layers; its block method is `layers` with groups of 1). */
#define LOOM_RECOMPUTE_ALL INT_MAX
typedef struct {
  int layers, group;
} loom_recompute;

/* Each enum's values are those of its proto enum (proto/loom.proto). */
typedef enum { LOOM_NORM_LAYERNORM = 0, LOOM_NORM_RMSNORM = 1 } loom_norm_kind;
typedef enum { LOOM_MLP_GELU = 0, LOOM_MLP_SWIGLU = 1 } loom_mlp_kind;
/* The first MLP GEMM's outputs per unit of its width: SwiGLU's gate and up halves (2), GELU's one (1); the MLP's
 * weight matrices are that many and the down projection. The one statement of SwiGLU's doubling. */
static inline int loom_mlp_fc_factor(loom_mlp_kind mlp) { return mlp == LOOM_MLP_SWIGLU ? 2 : 1; }
static inline int loom_mlp_matrices(loom_mlp_kind mlp) { return loom_mlp_fc_factor(mlp) + 1; }
typedef enum { LOOM_POSITION_LEARNED = 0, LOOM_POSITION_ROPE = 1 } loom_position_kind;
typedef enum { LOOM_MOE_SCORE_SOFTMAX = 0, LOOM_MOE_SCORE_SIGMOID = 1 } loom_moe_score;
/* The attention's softmax: plain; a logit 0 in every row's denominator; each head's learned logit there (attention
 * sinks, ops.h's attention_sink_forward). */
typedef enum { LOOM_SOFTMAX_VANILLA = 0, LOOM_SOFTMAX_OFF_BY_ONE = 1, LOOM_SOFTMAX_LEARNABLE = 2 } loom_softmax_kind;

/* Their names, indexed by value and NULL-terminated (flags, messages). */
extern const char *const LOOM_NORM_NAMES[];
extern const char *const LOOM_MLP_NAMES[];
extern const char *const LOOM_POSITION_NAMES[];
extern const char *const LOOM_MOE_SCORE_NAMES[];
extern const char *const LOOM_SOFTMAX_NAMES[];
extern const char *const LOOM_ROPE_TYPE_NAMES[]; /* "rope", "yarn": loom_rope's yarn 0 and 1 (Megatron's --rope-type) */
extern const char *const LOOM_MOE_DROP_POLICY_NAMES[]; /* by drop_by_position */

/* A Mixture-of-Experts model's MLPs, with Megatron-Core's settings (its
 * flag names in the comments): experts 0 is a dense model. Each MoE layer's
 * MLP is a router over `experts` MLPs of the model's kind (GELU or SwiGLU),
 * each `ffn` wide, of which every token takes its top `topk`, plus the
 * shared experts' MLP (one MLP `shared_ffn` wide, which every token takes).
 * The first group of fields is the architecture; the rest are training's. */
#define LOOM_MOE_BIAS_UPDATE_RATE 1e-3f /* Megatron-Core's default --moe-router-bias-update-rate */
#define LOOM_GPT_MAX_LAYERS 4096        /* a model's layers at most (the plan's bound) */
#define LOOM_LAYER_PATTERN_WORDS (LOOM_GPT_MAX_LAYERS / 64)
/* A per-layer bit set (bit l in word l / 64): layer l's bit, set or cleared, and whether any is set. */
static inline bool loom_layer_bit(const uint64_t *bits, int l) { return (bits[l >> 6] >> (l & 63)) & 1u; }
static inline void loom_layer_bit_set(uint64_t *bits, int l, bool on) {
  const uint64_t bit = (uint64_t)1 << (l & 63);
  bits[l >> 6] = on ? bits[l >> 6] | bit : bits[l >> 6] & ~bit;
}
static inline bool loom_layer_bits_any(const uint64_t *bits) {
  for (int w = 0; w < LOOM_LAYER_PATTERN_WORDS; w++)
    if (bits[w]) return true;
  return false;
}
typedef struct {
  int experts;            /* --num-experts */
  int topk;               /* --moe-router-topk */
  int ffn;                /* --moe-ffn-hidden-size (0: the model's ffn) */
  int shared_ffn;         /* --moe-shared-expert-intermediate-size (0: none) */
  bool shared_gate;       /* --moe-shared-expert-gate: the shared expert's output times sigmoid(x . w), w [1, h] (Qwen2-MoE) */
  loom_moe_score score;   /* --moe-router-score-function */
  bool pre_softmax;       /* --moe-router-pre-softmax: softmax over every expert, then the top-k */
  float aux_loss_coeff;   /* --moe-aux-loss-coeff: the Switch/GShard load-balancing loss */
  float z_loss_coeff;     /* --moe-z-loss-coeff: ST-MoE's router z-loss */
  double capacity_factor; /* --moe-expert-capacity-factor (0: dropless) */
  bool drop_by_position;  /* --moe-token-drop-policy position (else probs) */
  /* --moe-router-enable-expert-bias: DeepSeek-V3's aux-loss-free balancing.
   * Sigmoid routers choose by score plus a per-layer, per-expert bias (not a
   * parameter: no grad) that each step moves by bias_update_rate
   * (--moe-router-bias-update-rate) toward the experts below the mean load
   * (loom_moe_expert_bias_update); the trainer keeps it, checkpoints too. */
  bool expert_bias;
  float bias_update_rate;
  bool router_bias;       /* a learned bias on the router's logits (GPT-OSS's router.bias; not the expert bias above) */
  /* Group-limited selection (--moe-router-num-groups, --moe-router-group-topk;
   * DeepSeek-V3's 8 and 4; 0: none): a token's top-k come from the best
   * router_group_topk of router_groups equal groups of experts, each group
   * scored by its best topk / router_group_topk scores (moe_router.h). */
  int router_groups, router_group_topk;
  float topk_scaling;     /* --moe-router-topk-scaling-factor: the chosen weights' factor (DeepSeek-V3's 2.5; 0: 1) */
  /* --moe-layer-freq: bit l of dense (l / 64, l % 64) set makes layer l a
   * dense MLP of the model's ffn (DeepSeek-V3's first layers, Llama 4's
   * every other one); all clear: every layer a Mixture of Experts. The
   * plan's rules refuse dense layers so far: every layer computes as a MoE
   * layer (loom_gpt_is_moe). */
  uint64_t dense[LOOM_LAYER_PATTERN_WORDS];
  /* Where the experts are, not what they are: a rank of an expert-parallel
   * group of ep (0 or 1: every expert here) holds experts
   * [ep_rank E / ep, (ep_rank + 1) E / ep) (loom_gpt_config_for_ep),
   * each expert's MLP whole (etp 0 or 1) or split over the tp group as the
   * dense MLP is (etp = tp). */
  int ep, ep_rank, etp;
} loom_moe_config;

/* Multi-head latent attention (DeepSeek-V2 and V3's; Megatron's
 * --multi-latent-attention), where kv_lora_rank > 0: each token's q from a
 * low-rank latent (x W_qa, RMSNorm, W_qb; or x W_q where q_lora_rank is 0),
 * its keys and values from one compressed latent (x W_kva's first
 * kv_lora_rank, RMSNorm, W_kvb: each head's k without RoPE and its v)
 * beside a RoPE key every head shares (W_kva's last qk_pos_emb_head_dim).
 * q and k heads are qk_head_dim + qk_pos_emb_head_dim wide, RoPE turning
 * their last qk_pos_emb_head_dim; v heads v_head_dim. */
typedef struct {
  int q_lora_rank;         /* --q-lora-rank (0: none) */
  int kv_lora_rank;        /* --kv-lora-rank */
  int qk_head_dim;         /* --qk-head-dim: a q or k head's part without RoPE */
  int qk_pos_emb_head_dim; /* --qk-pos-emb-head-dim: its RoPE part */
  int v_head_dim;          /* --v-head-dim */
  float mscale_all_dim;    /* --mscale-all-dim: with YaRN the softmax scale times get_mscale(factor, it)^2 (0: none) */
} loom_mla_config;

typedef struct {
  int layers;
  int hidden;
  int heads;
  int kv_heads;     /* key/value heads: heads (multi-head), fewer (grouped-query), 1 (multi-query); 0 means heads */
  int head_dim;     /* each attention head's width (Megatron's --kv-channels), for q, k, v and the output projection's
                     * input; 0 means hidden / heads (loom_gpt_head_dim) */
  int ffn;          /* MLP inner width: 4*hidden for GPT-2; SwiGLU's gate and up projections are each this wide */
  int vocab;        /* real vocabulary size V */
  int padded_vocab; /* V rounded up to a multiple of 128 (Megatron, llm.c) */
  int seq;          /* maximum sequence length = rows of wpe */
  float dropout;
  float norm_eps;
  loom_norm_kind norm;
  loom_mlp_kind mlp;
  loom_glu glu;     /* SwiGLU's unit: all 0 SwiGLU itself; GPT-OSS's quick-GeGLU with its clamp and offset (loom_glu) */
  loom_position_kind position;
  loom_rope rope;   /* RoPE's base (0 means 10000) and Llama 3.1's scaling (factor 0: none) */
  bool no_bias;     /* linears without biases (Llama); a LayerNorm keeps its own */
  bool qkv_bias;    /* with no_bias: q, k and v keep their biases (Qwen2; Megatron's --add-qkv-bias) */
  bool out_bias;    /* with no_bias: the attention's output projection keeps its bias (with qkv_bias: Hugging Face's
                     * attention_bias, GPT-OSS's) */
  bool untied;      /* an LM head of its own instead of the input embedding */
  bool qk_norm;     /* RMSNorm over each head's q and k before RoPE, weights [head_dim] each (--qk-layernorm; Qwen3) */
  loom_softmax_kind softmax; /* --softmax-type: learnable is GPT-OSS's attention sinks, a [heads] logit per layer */
  /* Sliding-window attention (Megatron's --window-size, its left half): a
   * windowed layer's query sees the keys at most `window` positions back
   * (0: every layer attends in full); bit l of full_attention (l / 64,
   * l % 64) set makes layer l attend in full (--window-attn-skip-freq;
   * GPT-OSS alternates, from a windowed first layer). */
  int window;
  uint64_t full_attention[LOOM_LAYER_PATTERN_WORDS];
  bool bf16;        /* mixed precision: bf16 weights and activations, fp32 master weights and grads */
  loom_fp8_config fp8; /* beside bf16: the linears' GEMMs in FP8 (fp8.on) */
  loom_mla_config mla; /* multi-head latent attention (kv_lora_rank > 0) in place of the q, k and v projections */
  loom_moe_config moe; /* every layer's MLP a Mixture of Experts (experts > 0) */
  /* Multi-token prediction (DeepSeek-V3's; Megatron's --mtp-num-layers,
   * --mtp-loss-scaling-factor): mtp_layers modules after the model's
   * layers, module k (0-based) predicting the token k + 2 ahead from the
   * previous depth's normed hidden states and the embedding of the token
   * k + 1 ahead, each one transformer block (global layer layers + k, of
   * the model's last layer's kind) with its own final norm, sharing the
   * embedding and the head. The loss is the main loss plus mtp_loss_scale
   * times the depths' mean loss (loom_mtp.h). 0: none. */
  int mtp_layers;
  float mtp_loss_scale;
  /* Where the sequence is, not what the model is: split over a context-
   * parallel group of cp ranks (0 or 1: whole), each holding T / cp rows of
   * a micro-batch's sequence of T (loom_cp_position); its attention meets
   * the other ranks' keys and values round a ring, or (cp_all_gather) all
   * gathered at once. */
  int cp;
  bool cp_all_gather;
} loom_gpt_config;

#define LOOM_VOCAB_ALIGN 128
#define LOOM_MTP_LOSS_SCALE_DEFAULT 0.1f /* Megatron's --mtp-loss-scaling-factor */
#define LOOM_ROPE_THETA_DEFAULT 10000.0f

/* Fills cfg from preset i (LOOM_GPT_PRESET_NAMES[i] names it: "gpt-tiny",
 * "llama3-8b"; cli/names.h finds a name's); 0 on success, -1 if there is
 * no such preset. */
int loom_gpt_config_preset(loom_gpt_config *cfg, int i);
/* The preset names, NULL-terminated, for flag choices, help and errors. */
extern const char *const LOOM_GPT_PRESET_NAMES[];
/* Recomputes derived fields (ffn, kv_heads and RoPE's theta if 0, padded_vocab). */
void loom_gpt_config_finish(loom_gpt_config *cfg);
/* The config a tp-way split uses: vocab padded to a multiple of 128 * tp, as
 * Megatron does, so every rank holds an equal vocab range. */
loom_gpt_config loom_gpt_config_for_tp(const loom_gpt_config *cfg, int tp);
/* Rows of the vocabulary (its padded table: embedding, head, logits) each of tp ranks holds. */
int loom_gpt_vocab_shard(const loom_gpt_config *cfg, int tp);

/* The config one rank of an expert-parallel group of ep holds: its
 * experts' share of a MoE model (sizes and names; ep_rank 0 for sizes),
 * each expert split over etp (1, or the tp size). */
loom_gpt_config loom_gpt_config_for_ep(const loom_gpt_config *cfg, int etp, int ep, int ep_rank);
/* Experts this rank holds, and the global index of its first. */
static inline int loom_gpt_local_experts(const loom_gpt_config *c) { return c->moe.ep > 1 ? c->moe.experts / c->moe.ep : c->moe.experts; }
static inline int loom_gpt_first_expert(const loom_gpt_config *c) { return c->moe.ep > 1 ? c->moe.ep_rank * loom_gpt_local_experts(c) : 0; }

/* Whether a and b are the same architecture and shape (what a checkpoint
 * or model file must match; dropout and precision are the run's own). */
bool loom_gpt_config_same_model(const loom_gpt_config *a, const loom_gpt_config *b);
/* "layers 2, hidden 64, heads 8, kv heads 2, ffn 176, vocab 256, seq 64,
 * rmsnorm, swiglu, rope 10000, no bias, untied": for messages. */
const char *loom_gpt_config_describe(const loom_gpt_config *c, char *buf, size_t n);

#define LOOM_ARCHITECTURE_LEN 512 /* loom_gpt_config_architecture's buffer: GPT-OSS's line is some 330 characters */
/* What sets the architecture apart from GPT-2, for logs and `plan show`
 * ("" for GPT-2): "grouped-query attention, 8 kv heads (1 per tp rank),
 * rmsnorm, swiglu, rope theta 500000, no biases, untied head". tp says
 * where the key/value heads live: split, or each replicated on tp / kv
 * ranks. */
const char *loom_gpt_config_architecture(const loom_gpt_config *c, int tp, char *buf, size_t n);

static inline int loom_gpt_kv_heads(const loom_gpt_config *c) { return c->kv_heads > 0 ? c->kv_heads : c->heads; }
/* Each head's width: the explicit one, else hidden / heads. */
static inline int loom_gpt_head_dim(const loom_gpt_config *c) { return c->head_dim > 0 ? c->head_dim : c->hidden / c->heads; }
/* Whether the attention is multi-head latent attention. */
static inline bool loom_gpt_is_mla(const loom_gpt_config *c) { return c->mla.kv_lora_rank > 0; }
/* A q or k head's width (MLA's two parts), and a v head's: each head's width elsewhere. */
static inline int loom_gpt_qk_head_dim(const loom_gpt_config *c) {
  return loom_gpt_is_mla(c) ? c->mla.qk_head_dim + c->mla.qk_pos_emb_head_dim : loom_gpt_head_dim(c);
}
static inline int loom_gpt_v_head_dim(const loom_gpt_config *c) {
  return loom_gpt_is_mla(c) ? c->mla.v_head_dim : loom_gpt_head_dim(c);
}
/* The attention's softmax scale (loom_attn_shape's; 0: 1 / sqrt of a q head's width). */
float loom_gpt_softmax_scale(const loom_gpt_config *c);
/* The attention's output width, the output projection's input: heads times a v head's width. */
static inline int loom_gpt_attn_width(const loom_gpt_config *c) { return c->heads * loom_gpt_v_head_dim(c); }
/* The context-parallel split (1: none), and the rows of a sequence of T one rank holds. */
static inline int loom_gpt_cp(const loom_gpt_config *c) { return c->cp > 1 ? c->cp : 1; }
static inline int loom_gpt_local_seq(const loom_gpt_config *c, int T) { return T / loom_gpt_cp(c); }
/* The ranks one micro-batch's tokens are spread over, each routing its own through a MoE layer: the tp group's under
 * sequence parallelism, times the cp group's. */
static inline int loom_gpt_seq_ranks(const loom_gpt_config *c, int tp, bool sequence_parallel) {
  return (sequence_parallel ? tp : 1) * loom_gpt_cp(c);
}
/* Whether q, k and v have biases: every linear's, or theirs alone (qkv_bias). */
static inline bool loom_gpt_qkv_biased(const loom_gpt_config *c) { return !c->no_bias || c->qkv_bias; }
/* Whether the attention's output projection has a bias: every linear's, or its own (out_bias). */
static inline bool loom_gpt_out_biased(const loom_gpt_config *c) { return !c->no_bias || c->out_bias; }
/* Whether the model's MLPs are Mixtures of Experts, and its experts' width. */
static inline bool loom_gpt_is_moe(const loom_gpt_config *c) { return c->moe.experts > 0; }
static inline int loom_gpt_expert_ffn(const loom_gpt_config *c) { return c->moe.ffn > 0 ? c->moe.ffn : c->ffn; }
/* The experts' split over the tp group (1: whole), and an expert's width on one rank of it. */
static inline int loom_gpt_expert_tp(const loom_gpt_config *c) { return c->moe.etp > 1 ? c->moe.etp : 1; }
static inline int loom_gpt_local_expert_ffn(const loom_gpt_config *c) { return loom_gpt_expert_ffn(c) / loom_gpt_expert_tp(c); }
/* Whether the experts' linears have biases: as every other linear's (Megatron's --add-bias-linear; GPT-OSS's). */
static inline bool loom_gpt_experts_biased(const loom_gpt_config *c) { return loom_gpt_is_moe(c) && !c->no_bias; }
/* The blocks of the model's table: its layers, then the MTP modules' (global layers [layers, blocks)). */
static inline int loom_gpt_blocks(const loom_gpt_config *c) { return c->layers + c->mtp_layers; }
/* Whether global layer l is an MTP module's block. */
static inline bool loom_gpt_layer_is_mtp(const loom_gpt_config *c, int l) { return l >= c->layers; }
/* Whether layer l's MLP is a Mixture of Experts (else the dense MLP); an MTP block's is the model's last layer's. */
static inline bool loom_gpt_layer_is_moe(const loom_gpt_config *c, int l) {
  return loom_gpt_is_moe(c) && !loom_layer_bit(c->moe.dense, l < c->layers ? l : c->layers - 1);
}
/* Layer l's attention window (loom_attn_shape's: 0, every earlier key); an MTP block's is the last layer's. */
static inline int loom_gpt_layer_window(const loom_gpt_config *c, int l) {
  return c->window > 0 && !loom_layer_bit(c->full_attention, l < c->layers ? l : c->layers - 1) ? c->window : 0;
}
/* Whether a windowed model has layers that attend in full; makes layer l one (or a windowed one again). */
static inline bool loom_gpt_has_full_attention_layers(const loom_gpt_config *c) {
  return c->window > 0 && loom_layer_bits_any(c->full_attention);
}
static inline void loom_gpt_set_full_attention_layer(loom_gpt_config *c, int l, bool full) {
  loom_layer_bit_set(c->full_attention, l, full);
}
/* Parses Megatron-LM's --window-attn-skip-freq for c's layers into
 * c->full_attention: an integer N (one full-attention layer after N - 1
 * windowed ones: layer l full where (l + 1) % N == 0), or the list form of
 * --moe-layer-freq with 1 for a windowed layer and 0 for a full one; 0 on
 * success, else -1 with why filled. */
int loom_gpt_parse_window_skip_freq(loom_gpt_config *c, const char *text, char *why, size_t n);
/* Whether a MoE model has dense layers among its MoE layers. */
static inline bool loom_gpt_has_dense_layers(const loom_gpt_config *c) {
  return loom_gpt_is_moe(c) && loom_layer_bits_any(c->moe.dense);
}
/* Layers of [begin, end) whose MLP is a Mixture of Experts. */
int loom_gpt_moe_layers(const loom_gpt_config *c, int begin, int end);
/* Makes layer l of a MoE model dense (or a MoE layer again). */
static inline void loom_gpt_set_dense_layer(loom_gpt_config *c, int l, bool dense) { loom_layer_bit_set(c->moe.dense, l, dense); }
/* Parses Megatron-LM's --moe-layer-freq for a model of `layers` layers
 * into c->moe.dense: an integer N (layer l a MoE layer where l % N == 0),
 * or Python's list form of 1 (MoE) and 0 (dense) per layer, with its
 * repetitions and sums ("[0,1,1]", "([0]*3+[1]*58)", "([1,1,0]*4)"),
 * quotes around it allowed; 0 on success, else -1 with why filled. */
int loom_gpt_parse_moe_layer_freq(loom_gpt_config *c, const char *text, char *why, size_t n);
/* Whether the config is GPT-2's architecture (LayerNorm, GELU, learned
 * positions, biases, multi-head): its tensors then carry GPT-2's names, else
 * the Llama family's (Hugging Face's LlamaForCausalLM names). */
bool loom_gpt_config_is_gpt2(const loom_gpt_config *c);

/* Ranks of a tp-way split holding each key/value head: 1 when tp divides
 * kv_heads, else tp / kv_heads (each head replicated, as Megatron does). */
static inline int loom_gpt_kv_replicas(const loom_gpt_config *c, int tp) {
  const int k = loom_gpt_kv_heads(c);
  return tp > k ? tp / k : 1;
}
/* Key/value heads one rank of a tp-way split holds. */
static inline int loom_gpt_local_kv_heads(const loom_gpt_config *c, int tp) {
  return loom_gpt_kv_heads(c) * loom_gpt_kv_replicas(c, tp) / tp;
}

/* Megatron-LM's two definitions of a step's model FLOPs (which count the
 * model's work, never recompute's extra):
 * - MEGATRON, its current code (training.py): 3 passes (forward, input and
 *   weight grads) over every GEMM, with the GQA, SwiGLU and untied terms,
 *   and causal attention halved;
 * - SC21, Narayanan et al. 2021 (Appendix), for runs with full recompute:
 *   4 passes over the layers' GEMMs, attention whole, 3 over the LM head,
 *   96 B s l h^2 (1 + s/6h + V/16lh) for a GPT;
 * - NEMO, NeMo's and Megatron Bridge's published TFLOP/s (their
 *   flops_formulas.py): MEGATRON's with attention counted whole, not causal. */
typedef enum { LOOM_FLOPS_MEGATRON = 0, LOOM_FLOPS_SC21, LOOM_FLOPS_NEMO } loom_flops_formula;
/* "megatron", "sc21", "nemo", by enum value, NULL-terminated (flag choices); a
 * formula's name. */
extern const char *const LOOM_FLOPS_FORMULA_NAMES[];
const char *loom_flops_formula_name(loom_flops_formula f);

/* Model FLOPs of one training step on `tokens` tokens of length T (see
 * loom_gpt_stage_train_flops in gpt_params.h, over the whole model). */
double loom_gpt_train_flops(const loom_gpt_config *cfg, int T, double tokens, loom_flops_formula formula);

#endif
