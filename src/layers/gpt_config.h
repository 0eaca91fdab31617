/* GPT model shape: presets, derived sizes and validation. */
#ifndef LOOM_GPT_CONFIG_H
#define LOOM_GPT_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
  int layers;
  int hidden;
  int heads;
  int ffn;          /* MLP inner width, 4*hidden for GPT-2 */
  int vocab;        /* real vocabulary size V */
  int padded_vocab; /* V rounded up to a multiple of 128 (Megatron, llm.c) */
  int seq;          /* maximum sequence length = rows of wpe */
  float dropout;
  float norm_eps;
  bool bf16;        /* mixed precision: bf16 weights and activations, fp32 master weights and grads */
} loom_gpt_config;

#define LOOM_VOCAB_ALIGN 128

/* Fills cfg from a preset name ("gpt-tiny", "gpt2-small"); 0 on success, -1 if unknown. */
int loom_gpt_config_preset(loom_gpt_config *cfg, const char *name);
/* Comma-separated list of preset names, for help and error messages. */
const char *loom_gpt_config_preset_names(void);
/* Recomputes derived fields (ffn if 0, padded_vocab). */
void loom_gpt_config_finish(loom_gpt_config *cfg);
/* The config a tp-way split uses: vocab padded to a multiple of 128 * tp, as
 * Megatron does, so every rank holds an equal vocab range. */
loom_gpt_config loom_gpt_config_for_tp(const loom_gpt_config *cfg, int tp);
/* NULL if valid, else a one-line reason naming the field: the shape rules
 * beyond the size bounds that loom_plan_check_sizes holds. */
const char *loom_gpt_config_check(const loom_gpt_config *cfg, char *msg, size_t msg_len);

/* Model FLOPs of one training step on `tokens` tokens of length T:
 * 6 * matmul params * tokens + 12 * layers * hidden * T * tokens (attention);
 * the whole model's loom_gpt_stage_train_flops (gpt_params.h). */
double loom_gpt_train_flops(const loom_gpt_config *cfg, int T, double tokens);

#endif
