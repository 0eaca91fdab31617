/* The plan: its model's config, its stages and schedule, as every other
 * part reads them. Building is plan_build.c, estimates plan_estimates.c,
 * the rules plan_rules.c. */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/op_math.h"
#include "core/check.h"
#include "layers/gpt.h"
#include "plan/grad_compression.h"
#include "plan/memory.h"
#include "plan/plan.h"
#include "plan/rank_sheet.h"
#include "schedule/verify.h"
#include "tensor_parallel/parallel_state.h"

/* The model's enums and the plan's are one list each, bridged by the casts below. */
_Static_assert(LOOM_NORM_LAYERNORM == (int)LOOM__NORM__NORM_LAYERNORM && LOOM_NORM_RMSNORM == (int)LOOM__NORM__NORM_RMSNORM,
               "loom_norm_kind follows loom.proto's Norm");
_Static_assert(LOOM_MLP_GELU == (int)LOOM__MLP__MLP_GELU && LOOM_MLP_SWIGLU == (int)LOOM__MLP__MLP_SWIGLU,
               "loom_mlp_kind follows loom.proto's Mlp");
_Static_assert(LOOM_MOE_SCORE_SOFTMAX == (int)LOOM__MOE_SCORE__MOE_SCORE_SOFTMAX &&
                   LOOM_MOE_SCORE_SIGMOID == (int)LOOM__MOE_SCORE__MOE_SCORE_SIGMOID,
               "loom_moe_score follows loom.proto's MoeScore");
_Static_assert(LOOM_SOFTMAX_VANILLA == (int)LOOM__SOFTMAX_TYPE__SOFTMAX_VANILLA &&
                   LOOM_SOFTMAX_OFF_BY_ONE == (int)LOOM__SOFTMAX_TYPE__SOFTMAX_OFF_BY_ONE &&
                   LOOM_SOFTMAX_LEARNABLE == (int)LOOM__SOFTMAX_TYPE__SOFTMAX_LEARNABLE,
               "loom_softmax_kind follows loom.proto's SoftmaxType");
_Static_assert(LOOM_POSITION_LEARNED == (int)LOOM__POSITION__POSITION_LEARNED &&
                   LOOM_POSITION_ROPE == (int)LOOM__POSITION__POSITION_ROPE,
               "loom_position_kind follows loom.proto's Position");

void loom_model_proto_config(const Loom__Model *m, loom_gpt_config *cfg) {
  *cfg = (loom_gpt_config){.layers = m->layers, .hidden = m->hidden, .heads = m->heads, .ffn = m->ffn,
                           .kv_heads = m->has_kv_heads ? m->kv_heads : 0, .vocab = m->vocab, .seq = m->seq,
                           .dropout = m->dropout, .norm_eps = m->norm_eps, .norm = (loom_norm_kind)m->norm,
                           .mlp = (loom_mlp_kind)m->mlp, .position = (loom_position_kind)m->position,
                           .rope = {.theta = m->rope_theta}, .no_bias = !m->bias, .qkv_bias = m->qkv_bias, .out_bias = m->out_bias,
                           .glu = {.alpha = m->glu_alpha, .clamp = m->glu_clamp, .offset = m->glu_offset},
                           .untied = !m->tied_embeddings, .head_dim = m->has_kv_channels ? m->kv_channels : 0,
                           .qk_norm = m->qk_layernorm, .softmax = (loom_softmax_kind)m->softmax_type,
                           .mtp_layers = m->mtp_num_layers,
                           .mtp_loss_scale = m->has_mtp_loss_scaling_factor ? m->mtp_loss_scaling_factor : LOOM_MTP_LOSS_SCALE_DEFAULT};
  if (m->mla)
    cfg->mla = (loom_mla_config){.q_lora_rank = m->mla->q_lora_rank, .kv_lora_rank = m->mla->kv_lora_rank,
                                 .qk_head_dim = m->mla->qk_head_dim, .qk_pos_emb_head_dim = m->mla->qk_pos_emb_head_dim,
                                 .v_head_dim = m->mla->v_head_dim, .mscale_all_dim = m->mla->mscale_all_dim};
  if (m->moe)
    cfg->moe = (loom_moe_config){.experts = m->moe->experts, .topk = m->moe->topk, .ffn = m->moe->ffn,
                                 .shared_ffn = m->moe->shared_ffn, .shared_gate = m->moe->shared_gate, .score = (loom_moe_score)m->moe->score,
                                 .pre_softmax = m->moe->pre_softmax, .aux_loss_coeff = m->moe->aux_loss_coeff,
                                 .z_loss_coeff = m->moe->z_loss_coeff, .capacity_factor = m->moe->capacity_factor,
                                 .drop_by_position = m->moe->drop_by_position, .expert_bias = m->moe->expert_bias,
                                 .router_bias = m->moe->router_bias, .router_groups = m->moe->router_groups,
                                 .router_group_topk = m->moe->router_group_topk, .topk_scaling = m->moe->topk_scaling,
                                 .bias_update_rate = m->moe->has_bias_update_rate ? m->moe->bias_update_rate
                                                                                  : LOOM_MOE_BIAS_UPDATE_RATE};
  cfg->window = m->window_size;
  for (size_t l = 0; l < m->n_window_pattern && l < (size_t)LOOM_GPT_MAX_LAYERS; l++)
    if (m->window_pattern[l] == 0) loom_gpt_set_full_attention_layer(cfg, (int)l, true);
  for (size_t l = 0; m->moe && l < m->moe->n_layer_pattern && l < (size_t)LOOM_GPT_MAX_LAYERS; l++)
    if (m->moe->layer_pattern[l] == 0) loom_gpt_set_dense_layer(cfg, (int)l, true);
  const Loom__RopeScaling *sc = m->rope_scaling;
  if (sc)
    cfg->rope = (loom_rope){.theta = m->rope_theta, .factor = sc->factor, .low_freq_factor = sc->low_freq_factor,
                            .high_freq_factor = sc->high_freq_factor, .original_max_position = sc->original_max_position_embeddings,
                            .yarn = sc->yarn, .beta_fast = sc->has_beta_fast ? sc->beta_fast : LOOM_YARN_BETA_FAST,
                            .beta_slow = sc->has_beta_slow ? sc->beta_slow : LOOM_YARN_BETA_SLOW, .truncate = sc->truncate,
                            .attention_factor = sc->has_attention_factor ? sc->attention_factor : loom_yarn_mscale(sc->factor, 1.0)};
  if (sc && !sc->yarn) cfg->rope.beta_fast = cfg->rope.beta_slow = cfg->rope.attention_factor = 0.0f, cfg->rope.truncate = 0;
  loom_gpt_config_finish(cfg);
}

void loom_model_proto_fill(Loom__Model *m, const loom_gpt_config *c, loom_model_rooms *rooms) {
  Loom__RopeScaling *room = &rooms->scaling;
  Loom__Moe *moe_room = &rooms->moe;
  m->has_layers = m->has_hidden = m->has_heads = m->has_ffn = m->has_vocab = m->has_seq = 1;
  m->layers = c->layers, m->hidden = c->hidden, m->heads = c->heads, m->vocab = c->vocab, m->seq = c->seq;
  m->ffn = c->ffn > 0 ? c->ffn : 4 * c->hidden;
  m->has_dropout = c->dropout > 0.0f;
  m->dropout = c->dropout;
  m->has_norm_eps = c->norm_eps > 0.0f;
  if (m->has_norm_eps) m->norm_eps = c->norm_eps;
  /* Architecture fields only where they leave GPT-2, so GPT-2 plans read as before. */
  m->has_kv_heads = loom_gpt_kv_heads(c) != c->heads;
  m->kv_heads = loom_gpt_kv_heads(c);
  m->has_norm = c->norm != LOOM_NORM_LAYERNORM;
  m->norm = (Loom__Norm)c->norm;
  m->has_mlp = c->mlp != LOOM_MLP_GELU;
  m->mlp = (Loom__Mlp)c->mlp;
  m->has_position = c->position != LOOM_POSITION_LEARNED;
  m->position = (Loom__Position)c->position;
  m->has_rope_theta = c->position == LOOM_POSITION_ROPE;
  if (m->has_rope_theta) m->rope_theta = c->rope.theta > 0.0f ? c->rope.theta : LOOM_ROPE_THETA_DEFAULT;
  if (c->position == LOOM_POSITION_ROPE && c->rope.factor > 0.0f) {
    const loom_rope *r = &c->rope;
    loom__rope_scaling__init(room);
    room->has_factor = room->has_original_max_position_embeddings = 1;
    room->factor = r->factor, room->original_max_position_embeddings = r->original_max_position;
    room->has_low_freq_factor = room->has_high_freq_factor = !r->yarn;
    room->low_freq_factor = r->low_freq_factor, room->high_freq_factor = r->high_freq_factor;
    room->has_yarn = room->yarn = r->yarn;
    room->has_beta_fast = r->yarn && r->beta_fast != LOOM_YARN_BETA_FAST, room->beta_fast = r->beta_fast;
    room->has_beta_slow = r->yarn && r->beta_slow != LOOM_YARN_BETA_SLOW, room->beta_slow = r->beta_slow;
    room->has_attention_factor = r->yarn && r->attention_factor != (float)loom_yarn_mscale(r->factor, 1.0);
    room->attention_factor = r->attention_factor;
    room->has_truncate = r->yarn && !r->truncate, room->truncate = r->truncate;
    m->rope_scaling = room;
  }
  m->has_bias = c->no_bias;
  m->bias = !c->no_bias;
  m->has_qkv_bias = c->no_bias && c->qkv_bias;
  m->qkv_bias = m->has_qkv_bias;
  m->has_out_bias = m->out_bias = c->no_bias && c->out_bias;
  m->has_glu_alpha = c->glu.alpha != 0.0f, m->glu_alpha = c->glu.alpha;
  m->has_glu_clamp = c->glu.clamp != 0.0f, m->glu_clamp = c->glu.clamp;
  m->has_glu_offset = c->glu.offset != 0.0f, m->glu_offset = c->glu.offset;
  m->has_tied_embeddings = c->untied;
  m->tied_embeddings = !c->untied;
  m->has_kv_channels = c->head_dim > 0; /* only where it leaves hidden / heads (loom_gpt_config_finish) */
  m->kv_channels = c->head_dim;
  m->has_qk_layernorm = m->qk_layernorm = c->qk_norm;
  m->has_mtp_num_layers = c->mtp_layers > 0, m->mtp_num_layers = c->mtp_layers;
  m->has_mtp_loss_scaling_factor = c->mtp_layers > 0, m->mtp_loss_scaling_factor = c->mtp_loss_scale;
  m->has_softmax_type = c->softmax != LOOM_SOFTMAX_VANILLA;
  m->softmax_type = (Loom__SoftmaxType)c->softmax;
  m->has_window_size = c->window > 0, m->window_size = c->window;
  if (loom_gpt_is_mla(c)) {
    Loom__Mla *mla = &rooms->mla;
    loom__mla__init(mla);
    mla->has_q_lora_rank = c->mla.q_lora_rank > 0, mla->q_lora_rank = c->mla.q_lora_rank;
    mla->has_kv_lora_rank = mla->has_qk_head_dim = mla->has_qk_pos_emb_head_dim = mla->has_v_head_dim = 1;
    mla->kv_lora_rank = c->mla.kv_lora_rank, mla->qk_head_dim = c->mla.qk_head_dim;
    mla->qk_pos_emb_head_dim = c->mla.qk_pos_emb_head_dim, mla->v_head_dim = c->mla.v_head_dim;
    mla->has_mscale_all_dim = c->mla.mscale_all_dim > 0.0f, mla->mscale_all_dim = c->mla.mscale_all_dim;
    m->mla = mla;
  }
  if (loom_gpt_has_full_attention_layers(c)) {
    for (int l = 0; l < c->layers; l++) rooms->window_pattern[l] = loom_gpt_layer_window(c, l) > 0;
    m->n_window_pattern = (size_t)c->layers, m->window_pattern = rooms->window_pattern;
  }
  if (!loom_gpt_is_moe(c)) return;
  const loom_moe_config *e = &c->moe;
  loom__moe__init(moe_room);
  moe_room->has_experts = moe_room->has_topk = 1;
  moe_room->experts = e->experts, moe_room->topk = e->topk;
  moe_room->has_ffn = e->ffn > 0 && e->ffn != c->ffn, moe_room->ffn = e->ffn;
  moe_room->has_shared_ffn = e->shared_ffn > 0, moe_room->shared_ffn = e->shared_ffn;
  moe_room->has_shared_gate = e->shared_gate, moe_room->shared_gate = e->shared_gate;
  moe_room->has_score = e->score != LOOM_MOE_SCORE_SOFTMAX, moe_room->score = (Loom__MoeScore)e->score;
  moe_room->has_pre_softmax = e->pre_softmax, moe_room->pre_softmax = e->pre_softmax;
  moe_room->has_aux_loss_coeff = e->aux_loss_coeff != 0.0f, moe_room->aux_loss_coeff = e->aux_loss_coeff;
  moe_room->has_z_loss_coeff = e->z_loss_coeff != 0.0f, moe_room->z_loss_coeff = e->z_loss_coeff;
  moe_room->has_capacity_factor = e->capacity_factor != 0.0, moe_room->capacity_factor = e->capacity_factor;
  moe_room->has_drop_by_position = e->drop_by_position, moe_room->drop_by_position = e->drop_by_position;
  moe_room->has_expert_bias = e->expert_bias, moe_room->expert_bias = e->expert_bias;
  moe_room->has_router_bias = e->router_bias, moe_room->router_bias = e->router_bias;
  moe_room->has_router_groups = e->router_groups > 0, moe_room->router_groups = e->router_groups;
  moe_room->has_router_group_topk = e->router_group_topk > 0, moe_room->router_group_topk = e->router_group_topk;
  moe_room->has_topk_scaling = e->topk_scaling > 0.0f, moe_room->topk_scaling = e->topk_scaling;
  moe_room->has_bias_update_rate = e->expert_bias && e->bias_update_rate != LOOM_MOE_BIAS_UPDATE_RATE;
  moe_room->bias_update_rate = e->bias_update_rate;
  if (loom_gpt_has_dense_layers(c)) {
    for (int l = 0; l < c->layers; l++) rooms->pattern[l] = loom_gpt_layer_is_moe(c, l);
    moe_room->n_layer_pattern = (size_t)c->layers, moe_room->layer_pattern = rooms->pattern;
  }
  m->moe = moe_room;
}

_Static_assert((int)LOOM__FP8_RECIPE__FP8_MXFP8 == (int)LOOM_FP8_RECIPE_MXFP8 &&
                   (int)LOOM__FP8_RECIPE__FP8_BLOCKWISE == (int)LOOM_FP8_RECIPE_BLOCKWISE &&
                   (int)LOOM__FP8_RECIPE__FP8_TENSORWISE == (int)LOOM_FP8_RECIPE_TENSORWISE,
               "Fp8Recipe in loom_fp8_recipe's order");

loom_fp8_config loom_plan_fp8(const loom_plan *p) {
  const Loom__Fp8Scaling *f = p->fp8_scaling;
  const Loom__Fp8Scaling none = LOOM__FP8_SCALING__INIT;
  if (!f) f = &none;
  return (loom_fp8_config){.on = p->fp8 != LOOM__FP8_FORMAT__FP8_NONE, .hybrid = p->fp8 == LOOM__FP8_FORMAT__FP8_HYBRID,
                           .recipe = (loom_fp8_recipe)f->recipe, .history = (int)f->amax_history_len,
                           .most_recent = f->amax_compute_algo == LOOM__FP8_AMAX_ALGO__FP8_AMAX_MOST_RECENT,
                           .margin = f->margin, .bf16_first = (int)f->bf16_first_layers, .bf16_last = (int)f->bf16_last_layers};
}

void loom_plan_model_config(const loom_plan *p, loom_gpt_config *cfg) {
  loom_model_proto_config(p->model, cfg);
  cfg->bf16 = p->precision == LOOM__PRECISION__PRECISION_BF16;
  cfg->fp8 = loom_plan_fp8(p);
}

void loom_plan_rank_config(const loom_plan *p, loom_gpt_config *cfg) {
  loom_plan_model_config(p, cfg);
  *cfg = loom_gpt_config_for_ep(cfg, p->parallel->etp, p->parallel->ep, 0);
  loom_plan_context_config(p, cfg);
}

void loom_plan_context_config(const loom_plan *p, loom_gpt_config *cfg) {
  cfg->cp = p->parallel->cp;
  cfg->cp_all_gather = p->parallel->cp_comm_type == LOOM__CP_COMM_TYPE__CP_COMM_ALL_GATHER;
}

/* The head is untied and no MTP module embeds on the last stage: the schedule has no tied-embedding reduction. */
static bool untied(const loom_plan *p) {
  return p->model->has_tied_embeddings && !p->model->tied_embeddings && p->model->mtp_num_layers == 0;
}

loom_status loom_plan_schedule(const loom_plan *p, loom_schedule *s, loom_error *err) {
  const loom_status st = loom_schedule_build(s, p->schedule, p->parallel->pp, p->parallel->virtual_chunks,
                                             loom_plan_micro_batches(p), err);
  if (st == LOOM_OK && untied(p)) loom_schedule_untie(s);
  return st;
}

loom_dtype loom_plan_compute_dtype(const loom_plan *p) {
  return p->precision == LOOM__PRECISION__PRECISION_BF16 ? LOOM_DTYPE_BF16 : LOOM_DTYPE_F32;
}

loom_dtype loom_plan_grad_reduce_dtype(const loom_plan *p) {
  return p->grad_reduce == LOOM__PRECISION__PRECISION_BF16 ? LOOM_DTYPE_BF16 : LOOM_DTYPE_F32;
}

int loom_plan_expert_replicas(const loom_plan *p) {
  const Loom__Parallel *l = p->parallel;
  return l->ep > 1 ? loom_expert_data_size(l->tp, l->cp * l->dp, l->etp > 1 ? l->etp : 1, l->ep) : loom_plan_grad_replicas(p);
}

int loom_plan_train_seq(const loom_plan *p) { return p->batch->has_seq ? p->batch->seq : p->model->seq; }

loom_plan_overlap loom_plan_overlaps(const loom_plan *p) {
  const Loom__Overlap *o = p->overlap;
  return (loom_plan_overlap){.tp_comm = o && o->tp_comm, .grad_reduce = !o || !o->has_grad_reduce || o->grad_reduce,
                             .param_gather = o && o->param_gather, .p2p = !o || !o->has_p2p || o->p2p};
}

int loom_plan_grad_replicas(const loom_plan *p) { return p->parallel->dp * p->parallel->cp; }

loom_compression loom_plan_compression(const loom_plan *p) {
  const Loom__GradCompression *gc = p->grad_compression;
  return (loom_compression){.kind = gc ? gc->kind : LOOM__COMPRESSION_KIND__COMPRESSION_NONE,
                            .rank = gc ? gc->rank : 0, .dp = loom_plan_grad_replicas(p)};
}

int loom_plan_pipeline_rank(const loom_plan *p, int pp_rank) {
  const Loom__Parallel *l = p->parallel;
  return loom_parallel_rank((loom_grid_coords){.pp = pp_rank}, (loom_grid_coords){l->tp, l->cp, l->dp, l->pp});
}

int64_t loom_plan_ranks(const loom_plan *p) {
  const Loom__Parallel *l = p->parallel;
  return (int64_t)l->tp * l->cp * l->dp * l->pp;
}

int64_t loom_plan_total_parameters(const loom_plan *p) {
  loom_gpt_config cfg;
  loom_plan_model_config(p, &cfg);
  return (int64_t)loom_gpt_param_count(&cfg, NULL, 1);
}

bool loom_plan_recompute(const loom_plan *p) { return p->n_stages > 0 && p->stages[0]->recompute; }

loom_recompute loom_plan_stage_recompute(const loom_plan *p, int v) {
  const Loom__Stage *s = p->stages[v];
  const int layers = s->layer_end - s->layer_begin;
  if (!s->recompute) return (loom_recompute){0, 1};
  return (loom_recompute){.layers = s->has_recompute_layers && s->recompute_layers < layers ? s->recompute_layers : layers,
                          .group = s->has_recompute_group && s->recompute_group > 1 ? s->recompute_group : 1};
}

int loom_plan_micro_batches(const loom_plan *p) {
  const int64_t per = (int64_t)p->batch->micro_batch * p->parallel->dp;
  return per > 0 ? (int)(p->batch->global_batch / per) : 0;
}

int loom_plan_stage_index(const loom_plan *p, int pp_rank, int chunk) {
  return loom_stage_of(loom_schedule_kind_v_shape(p->schedule), p->parallel->pp, pp_rank, chunk);
}

loom_stage_range loom_plan_stage_range(const loom_plan *p, int v) {
  for (size_t k = 0; k < p->n_stages; k++) {
    const Loom__Stage *s = p->stages[k];
    if (loom_plan_stage_index(p, s->pp_rank, s->chunk) == v)
      return (loom_stage_range){s->layer_begin, s->layer_end, s->embedding, s->head};
  }
  LOOM_CHECK(0, "a checked plan has every virtual stage");
  return (loom_stage_range){0};
}

int loom_plan_layer_counts(const loom_plan *plan, int *counts) {
  for (size_t k = 0; k < plan->n_stages; k++) {
    const Loom__Stage *s = plan->stages[k];
    counts[loom_plan_stage_index(plan, s->pp_rank, s->chunk)] = s->layer_end - s->layer_begin;
  }
  return (int)plan->n_stages;
}

/* ---- one rank's part, resolved ---- */

void loom_plan_resolve(const loom_plan *p, int rank, loom_rank_sheet *s) {
  const Loom__Parallel *l = p->parallel;
  memset(s, 0, sizeof *s);
  /* The batch, the dtypes and what crosses dp: the plan's own fields. */
  s->size = (loom_grid_coords){.tp = l->tp, .cp = l->cp, .dp = l->dp, .pp = l->pp};
  s->etp = l->etp > 1 ? l->etp : 1, s->ep = l->ep > 1 ? l->ep : 1;
  s->grad_replicas = loom_plan_grad_replicas(p);
  s->sequence_parallel = l->sequence_parallel;
  s->seq = loom_plan_train_seq(p);
  s->micro_batch = p->batch->micro_batch, s->global_batch = p->batch->global_batch;
  s->micro_batches = loom_plan_micro_batches(p);
  s->compute_dtype = loom_plan_compute_dtype(p);
  s->grad_dtype = s->grad_replicas > 1 ? loom_plan_grad_reduce_dtype(p) : LOOM_DTYPE_F32;
  s->zero_stage = l->zero_stage;
  s->overlap = loom_plan_overlaps(p);
  s->compression = loom_plan_compression(p);
  if (s->grad_replicas < 2) s->compression.kind = LOOM__COMPRESSION_KIND__COMPRESSION_NONE;
  s->kind = p->schedule;
  s->untied = untied(p);
  /* Where the rank sits in the grids (tensor_parallel/'s one rule), and its chunks' stages. */
  const int64_t ranks = loom_plan_ranks(p);
  s->rank = rank;
  s->at = loom_parallel_coords(rank, s->size);
  const int placed = loom_expert_coords_of(rank, l->tp, l->cp * l->dp, s->etp, s->ep, &s->expert);
  s->chunks = l->virtual_chunks;
  for (int c = 0; c < s->chunks; c++) {
    loom_sheet_chunk *k = &s->chunk[c];
    k->stage = loom_plan_stage_index(p, s->at.pp, c);
    k->range = loom_plan_stage_range(p, k->stage);
    k->recompute = loom_plan_stage_recompute(p, k->stage);
  }
  /* The model, whole (with the context split) and as one rank holds it: the layers' configs. */
  loom_plan_model_config(p, &s->model);
  s->rank_model = loom_gpt_config_for_ep(&s->model, s->etp, s->ep, 0);
  loom_plan_context_config(p, &s->model);
  loom_plan_context_config(p, &s->rank_model);
  LOOM_CHECK(rank >= 0 && rank < ranks && placed == 0, "a rank of the plan, its experts' grid dividing its stage");
}
