/* GPT-OSS's stacked experts (hf_stack.h). */
#include <stdio.h>
#include <string.h>
#include "ckpt/hf.h"
#include "ckpt/hf_stack.h"

bool loom_hf_stack_of(const loom_model_source *src, int k, loom_hf_stack *s) {
  const loom_gpt_config *c = &src->cfg;
  if (!loom_hf_stacks_experts(c)) return false;
  int head = k;
  while (head > 0 && src->meta[head].role == LOOM_ROLE_FUSED) head--;
  static const loom_param_role ROLES[] = {LOOM_ROLE_EXPERTS_FC_W, LOOM_ROLE_EXPERTS_PROJ_W, LOOM_ROLE_EXPERTS_FC_B,
                                          LOOM_ROLE_EXPERTS_PROJ_B};
  static const char *const NAMES[] = {"gate_up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias"};
  int which = 0;
  while (which < 4 && src->meta[head].role != ROLES[which]) which++;
  const char *mlp = strstr(src->specs[head].name, ".mlp.experts.");
  if (which == 4 || !mlp) return false;
  const int64_t h = c->hidden, f = loom_gpt_expert_ffn(c);
  const bool up = which % 2 == 0; /* gate and up, or down */
  *s = (loom_hf_stack){.first = head, .experts = c->moe.experts, .per_expert = up ? loom_mlp_fc_factor(c->mlp) : 1,
                       .piece = k - head, .matrix = which < 2};
  s->count = s->experts * s->per_expert;
  s->rows = !s->matrix ? 1 : up ? h : f;
  s->cols = up ? s->per_expert * f : h;
  snprintf(s->name, sizeof s->name, "%.*s.mlp.experts.%s", (int)(mlp - src->specs[head].name), src->specs[head].name,
           NAMES[which]);
  return s->piece < s->count;
}

/* Element o (of the projection's outputs) and i (of its inputs) of the piece, in the slab. */
static size_t at(const loom_hf_stack *s, int64_t o, int64_t i) {
  return (size_t)(i * s->cols + o * s->per_expert + s->piece % s->per_expert);
}

void loom_hf_stack_take(const loom_hf_stack *s, const float *slab, float *dst) {
  const int64_t outs = s->cols / s->per_expert;
  for (int64_t o = 0; o < outs; o++)
    for (int64_t i = 0; i < s->rows; i++) dst[o * s->rows + i] = slab[at(s, o, i)];
}

void loom_hf_stack_put(const loom_hf_stack *s, const float *src, float *slab) {
  const int64_t outs = s->cols / s->per_expert;
  for (int64_t o = 0; o < outs; o++)
    for (int64_t i = 0; i < s->rows; i++) slab[at(s, o, i)] = src[o * s->rows + i];
}
