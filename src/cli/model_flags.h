/* The flags that shape the model, shared by every subcommand that builds one
 * (train, ckpt export), and their one resolution into a loom_gpt_config. */
#ifndef LOOM_MODEL_FLAGS_H
#define LOOM_MODEL_FLAGS_H

#include "cli/flags.h"
#include "layers/gpt_config.h"

typedef struct {
  const char *preset;
  const char *init_from;
  int layers, hidden, heads, vocab, seq, ffn, kv_heads, kv_channels;
  float dropout, rope_theta, rotary_scaling_factor, glu_clamp, glu_offset;
  const char *norm, *mlp, *position, *softmax_type, *window_size, *window_skip_freq, *rope_type;
  bool no_bias, qkv_bias, out_bias, untied, qk_layernorm, quick_geglu;
  /* Multi-head latent attention, in Megatron's flag names */
  bool mla;
  int q_lora_rank, kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim, v_head_dim;
  float mscale, mscale_all_dim;
  /* Multi-token prediction */
  int mtp_layers;
  float mtp_loss_scale;
  /* Mixture of Experts, in Megatron-Core's flag names */
  int experts, moe_topk, moe_ffn, moe_shared_ffn, moe_router_groups, moe_router_group_topk;
  const char *moe_score, *moe_drop_policy, *moe_layer_freq;
  bool moe_pre_softmax, moe_expert_bias, moe_shared_gate, moe_router_bias;
  float moe_aux_loss_coeff, moe_z_loss_coeff, moe_capacity_factor, moe_bias_update_rate, moe_topk_scaling;
} loom_model_flags;

#define LOOM_MODEL_FLAG_COUNT 56
/* Writes the model flags' table entries into out[LOOM_MODEL_FLAG_COUNT]. */
void loom_model_flags_table(loom_model_flags *mf, loom_flag *out);
/* Builds the config: a preset (default gpt-tiny) or the --init-from file's
 * header, then any size flags. Size flags cannot change an --init-from
 * model's shape. *T gets the training sequence length (--seq, else cfg.seq). */
loom_status loom_model_flags_resolve(const char *cmd, const loom_model_flags *mf, const loom_flag *table,
                                     loom_gpt_config *cfg, int *T, loom_error *err);

#endif
