/* The canonical parameter table of GPT-2 and its initialisation. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "core/rng.h"
#include "layers/gpt_params.h"
#include "layers/run_buffers.h"
#include "tensor_parallel/parallel_state.h"

typedef struct {
  loom_tensor *specs;
  loom_param_meta *meta;
  int count;
  int tp_rank, tp_size;
} table;

/* Appends a tensor of global shape [d0, d1] (d1 = 0: a vector) in `role`;
 * its spec gets the local shape. With specs NULL, only counts. */
static void add(table *t, loom_param_role role, const char *name, int ndim, int64_t d0, int64_t d1, loom_param_meta m) {
  if (!t->specs) {
    t->count++;
    return;
  }
  m.role = role;
  m.layout.rows = d0;
  m.layout.cols = ndim == 2 ? d1 : 1;
  m.init_rows = m.init_rows ? m.init_rows : d0;
  int64_t rows, cols;
  loom_shard_local_shape(&m.layout, t->tp_rank, t->tp_size, &rows, &cols);
  const int64_t shape[2] = {rows, cols};
  t->specs[t->count] = loom_tensor_spec(name, LOOM_DTYPE_F32, ndim, shape);
  t->meta[t->count] = m;
  t->count++;
}

static const loom_param_meta NORM_W = {.init = LOOM_INIT_ONES, .layout = {.partition_dim = -1}, .tp_replicated = true};
static const loom_param_meta HEAD_NORM_W = {.init = LOOM_INIT_ONES, .layout = {.partition_dim = -1}, .tp_replicated = true,
                                            .per_head = true};
static const loom_param_meta ZERO_B = {.init = LOOM_INIT_ZEROS, .layout = {.partition_dim = -1}, .tp_replicated = true};

/* A weight with GPT-2's normal init, split along `dim` (in `parts` row blocks) under TP. */
static loom_param_meta weight(float std, int dim, int parts) {
  return (loom_param_meta){.init = LOOM_INIT_NORMAL, .init_std = std, .weight_decay = true,
                           .layout = {.partition_dim = dim, .parts = parts}, .tp_replicated = dim < 0};
}

/* The bias of a column-parallel weight: split with it, zero at first. */
static loom_param_meta column_bias(loom_param_meta w) {
  return (loom_param_meta){.init = LOOM_INIT_ZEROS, .layout = w.layout};
}

/* A tensor's name: the family's prefix and the tensor's own suffix. */
typedef struct {
  char buf[LOOM_NAME_LEN];
} name;

static const char *named(name *n, const char *prefix, int layer, const char *suffix) {
  const int len = snprintf(n->buf, sizeof n->buf, "%s%d.%s", prefix, layer, suffix);
  LOOM_CHECK(len > 0 && (size_t)len < sizeof n->buf, "parameter names fit LOOM_NAME_LEN");
  return n->buf;
}

/* A norm's weight and, for LayerNorm, its bias (which no_bias, a setting
 * of the linears, leaves alone: LayerNorm without one is another norm). */
static void add_norm(table *t, const loom_gpt_config *c, loom_param_role w_role, const char *w_name, const char *b_name) {
  add(t, w_role, w_name, 1, c->hidden, 0, NORM_W);
  if (c->norm == LOOM_NORM_LAYERNORM) add(t, w_role + 1, b_name, 1, c->hidden, 0, ZERO_B); /* its bias is its own */
}

/* GPT-2's block: its names, c_attn fused as q|k|v, every bias. */
static void add_gpt2_block(table *t, int i, const loom_gpt_config *c) {
  const int64_t h = c->hidden, f = c->ffn;
  const float resid_std = 0.02f / sqrtf(2.0f * (float)c->layers);
  const loom_param_meta qkv = weight(0.02f, 0, 3), fc = weight(0.02f, 0, 1);
  name n, m;
  add_norm(t, c, LOOM_ROLE_LN_1_W, named(&n, "h.", i, "ln_1.weight"), named(&m, "h.", i, "ln_1.bias"));
  add(t, LOOM_ROLE_QKV_W, named(&n, "h.", i, "attn.c_attn.weight"), 2, 3 * h, h, qkv);
  add(t, LOOM_ROLE_QKV_B, named(&n, "h.", i, "attn.c_attn.bias"), 1, 3 * h, 0, column_bias(qkv));
  add(t, LOOM_ROLE_ATTN_PROJ_W, named(&n, "h.", i, "attn.c_proj.weight"), 2, h, h, weight(resid_std, 1, 1));
  add(t, LOOM_ROLE_ATTN_PROJ_B, named(&n, "h.", i, "attn.c_proj.bias"), 1, h, 0, ZERO_B);
  add_norm(t, c, LOOM_ROLE_LN_2_W, named(&n, "h.", i, "ln_2.weight"), named(&m, "h.", i, "ln_2.bias"));
  add(t, LOOM_ROLE_FC_W, named(&n, "h.", i, "mlp.c_fc.weight"), 2, f, h, fc);
  add(t, LOOM_ROLE_FC_B, named(&n, "h.", i, "mlp.c_fc.bias"), 1, f, 0, column_bias(fc));
  add(t, LOOM_ROLE_MLP_PROJ_W, named(&n, "h.", i, "mlp.c_proj.weight"), 2, h, f, weight(resid_std, 1, 1));
  add(t, LOOM_ROLE_MLP_PROJ_B, named(&n, "h.", i, "mlp.c_proj.bias"), 1, h, 0, ZERO_B);
}

/* Consecutive column-parallel projections read as one (q|k|v, gate|up):
 * their weights, then their biases, each after the first LOOM_ROLE_FUSED. */
typedef struct {
  const char *suffix;
  int64_t rows;
  loom_param_meta meta;
} projection;

static void add_fused(table *t, const loom_gpt_config *c, int i, loom_param_role w_role, const projection *p, int np,
                      bool biased) {
  name n;
  char what[64];
  for (int j = 0; j < np; j++) {
    snprintf(what, sizeof what, "%s.weight", p[j].suffix);
    add(t, j ? LOOM_ROLE_FUSED : w_role, named(&n, "model.layers.", i, what), 2, p[j].rows, c->hidden, p[j].meta);
  }
  for (int j = 0; j < np && biased; j++) {
    snprintf(what, sizeof what, "%s.bias", p[j].suffix);
    add(t, j ? LOOM_ROLE_FUSED : w_role + 1, named(&n, "model.layers.", i, what), 1, p[j].rows, 0, column_bias(p[j].meta));
  }
}

/* A row-parallel output projection and, where biased, its bias. */
static void add_output(table *t, const loom_gpt_config *c, int i, loom_param_role w_role, const char *suffix, int64_t in,
                       bool biased) {
  name n;
  char what[64];
  snprintf(what, sizeof what, "%s.weight", suffix);
  add(t, w_role, named(&n, "model.layers.", i, what), 2, c->hidden, in, weight(0.02f / sqrtf(2.0f * (float)c->layers), 1, 1));
  snprintf(what, sizeof what, "%s.bias", suffix);
  if (biased) add(t, w_role + 1, named(&n, "model.layers.", i, what), 1, c->hidden, 0, ZERO_B);
}

/* A Mixture-of-Experts MLP, in Hugging Face's Qwen2-MoE names: the router
 * (mlp.gate), each expert's gate and up projections, expert after expert,
 * then their down projections, so that every expert's matrices lie back to
 * back (one view each, the grouped GEMMs' operands), their biases the same
 * way where the linears have biases (GPT-OSS's), and the shared expert's
 * MLP, split across tp as the dense MLP is. Every expert is whole on the
 * ranks that hold it, or under expert tensor parallelism split over tp as
 * the dense MLP is (gate and up by rows, down by columns): drawn from its
 * global name, it is the same under every split. The down projection's bias
 * is then whole on every rank of the group: one rank adds it and computes
 * its grad, which the group sums (a row-parallel bias under sequence
 * parallelism, which expert tensor parallelism requires). */
static void add_experts(table *t, const loom_gpt_config *c, int i) {
  const int64_t h = c->hidden, fe = loom_gpt_expert_ffn(c), fs = c->moe.shared_ffn;
  const bool swiglu = c->mlp == LOOM_MLP_SWIGLU, split = loom_gpt_expert_tp(c) > 1;
  const float resid_std = 0.02f / sqrtf(2.0f * (float)c->layers);
  loom_param_meta whole = weight(0.02f, -1, 1), expert = weight(0.02f, split ? 0 : -1, 1), resid = weight(resid_std, split ? 1 : -1, 1);
  /* Under expert parallelism the group's ranks hold different experts, and under expert tensor parallelism
   * different slices of them: none is the same on every tp rank. */
  expert.expert = resid.expert = true;
  expert.tp_replicated = resid.tp_replicated = c->moe.ep <= 1 && !split;
  loom_param_meta fc_bias = column_bias(expert), proj_bias = ZERO_B;
  fc_bias.expert = proj_bias.expert = true;
  fc_bias.tp_replicated = expert.tp_replicated;
  proj_bias.tp_replicated = c->moe.ep <= 1 || split;
  const int first = loom_gpt_first_expert(c), end = first + loom_gpt_local_experts(c);
  name n;
  char what[96];
  add(t, LOOM_ROLE_ROUTER_W, named(&n, "model.layers.", i, "mlp.gate.weight"), 2, c->moe.experts, h, whole);
  if (c->moe.router_bias) add(t, LOOM_ROLE_ROUTER_B, named(&n, "model.layers.", i, "mlp.gate.bias"), 1, c->moe.experts, 0, ZERO_B);
  for (int b = 0; b < (loom_gpt_experts_biased(c) ? 2 : 1); b++) { /* the weights, then the biases */
    for (int e = first; e < end; e++)
      for (int j = swiglu ? 0 : 1; j < 2; j++) {
        snprintf(what, sizeof what, "mlp.experts.%d.%s.%s", e, j ? "up_proj" : "gate_proj", b ? "bias" : "weight");
        const bool head = e == first && j == (swiglu ? 0 : 1);
        add(t, head ? (b ? LOOM_ROLE_EXPERTS_FC_B : LOOM_ROLE_EXPERTS_FC_W) : LOOM_ROLE_FUSED, named(&n, "model.layers.", i, what),
            b ? 1 : 2, fe, b ? 0 : h, b ? fc_bias : expert);
      }
    for (int e = first; e < end; e++) {
      snprintf(what, sizeof what, "mlp.experts.%d.down_proj.%s", e, b ? "bias" : "weight");
      add(t, e > first ? LOOM_ROLE_FUSED : b ? LOOM_ROLE_EXPERTS_PROJ_B : LOOM_ROLE_EXPERTS_PROJ_W,
          named(&n, "model.layers.", i, what), b ? 1 : 2, h, b ? 0 : fe, b ? proj_bias : resid);
    }
  }
  if (fs == 0) return;
  const projection gate_up[2] = {{"mlp.shared_expert.gate_proj", fs, weight(0.02f, 0, 1)},
                                 {"mlp.shared_expert.up_proj", fs, weight(0.02f, 0, 1)}};
  add_fused(t, c, i, LOOM_ROLE_FC_W, swiglu ? gate_up : gate_up + 1, loom_mlp_fc_factor(c->mlp), !c->no_bias);
  add_output(t, c, i, LOOM_ROLE_MLP_PROJ_W, "mlp.shared_expert.down_proj", fs, !c->no_bias);
  if (c->moe.shared_gate) add(t, LOOM_ROLE_SHARED_GATE_W, named(&n, "model.layers.", i, "mlp.shared_expert_gate.weight"), 2, 1, h, whole);
}

/* Multi-head latent attention, in DeepSeek-V3's Hugging Face names: the
 * down projections q_a_proj and kv_a_proj_with_mqa (one view, one GEMM's
 * rows), replicated over tp as the norms are, the latents' norms, then the
 * up projections split by heads (column-parallel) and o_proj. Under
 * sequence parallelism a replicated projection's grad is this rank's rows'
 * share, summed over tp with the norms'. */
static void add_mla(table *t, const loom_gpt_config *c, int i) {
  const loom_mla_config *a = &c->mla;
  const int64_t D = loom_gpt_qk_head_dim(c), P = a->qk_pos_emb_head_dim;
  const loom_param_meta down = weight(0.02f, -1, 1), up = weight(0.02f, 0, 1);
  loom_param_meta norm = NORM_W;
  name n;
  if (a->q_lora_rank) add(t, LOOM_ROLE_MLA_DOWN_W, named(&n, "model.layers.", i, "self_attn.q_a_proj.weight"), 2, a->q_lora_rank, c->hidden, down);
  add(t, a->q_lora_rank ? LOOM_ROLE_FUSED : LOOM_ROLE_MLA_DOWN_W, named(&n, "model.layers.", i, "self_attn.kv_a_proj_with_mqa.weight"), 2,
      a->kv_lora_rank + P, c->hidden, down);
  if (a->q_lora_rank) add(t, LOOM_ROLE_MLA_Q_NORM_W, named(&n, "model.layers.", i, "self_attn.q_a_layernorm.weight"), 1, a->q_lora_rank, 0, norm);
  add(t, LOOM_ROLE_MLA_KV_NORM_W, named(&n, "model.layers.", i, "self_attn.kv_a_layernorm.weight"), 1, a->kv_lora_rank, 0, norm);
  add(t, LOOM_ROLE_MLA_Q_UP_W, named(&n, "model.layers.", i, a->q_lora_rank ? "self_attn.q_b_proj.weight" : "self_attn.q_proj.weight"), 2,
      c->heads * D, a->q_lora_rank ? a->q_lora_rank : c->hidden, up);
  add(t, LOOM_ROLE_MLA_KV_UP_W, named(&n, "model.layers.", i, "self_attn.kv_b_proj.weight"), 2,
      c->heads * (int64_t)(a->qk_head_dim + a->v_head_dim), a->kv_lora_rank, up);
  add_output(t, c, i, LOOM_ROLE_ATTN_PROJ_W, "self_attn.o_proj", loom_gpt_attn_width(c), false);
}

/* The Llama family's block, in Hugging Face's names: separate q, k and v
 * projections (k and v of kv_heads heads, whole heads per rank, replicated
 * when tp exceeds them), and SwiGLU's gate and up projections. */
static void add_llama_block(table *t, int i, const loom_gpt_config *c) {
  const int64_t D = loom_gpt_head_dim(c), K = loom_gpt_kv_heads(c), f = c->ffn;
  loom_param_meta kv = weight(0.02f, 0, 1);
  kv.layout.groups = (int)K;
  const projection qkv[3] = {{"self_attn.q_proj", c->heads * D, weight(0.02f, 0, 1)},
                             {"self_attn.k_proj", K * D, kv}, {"self_attn.v_proj", K * D, kv}};
  const projection gate_up[2] = {{"mlp.gate_proj", f, weight(0.02f, 0, 1)}, {"mlp.up_proj", f, weight(0.02f, 0, 1)}};
  const bool swiglu = c->mlp == LOOM_MLP_SWIGLU;
  name n, m;
  add_norm(t, c, LOOM_ROLE_LN_1_W, named(&n, "model.layers.", i, "input_layernorm.weight"),
           named(&m, "model.layers.", i, "input_layernorm.bias"));
  if (loom_gpt_is_mla(c)) add_mla(t, c, i);
  else add_fused(t, c, i, LOOM_ROLE_QKV_W, qkv, 3, loom_gpt_qkv_biased(c));
  if (!loom_gpt_is_mla(c)) add_output(t, c, i, LOOM_ROLE_ATTN_PROJ_W, "self_attn.o_proj", c->heads * D, loom_gpt_out_biased(c));
  if (c->qk_norm) { /* Qwen3's names, after o_proj as its attention registers them */
    add(t, LOOM_ROLE_Q_NORM_W, named(&n, "model.layers.", i, "self_attn.q_norm.weight"), 1, D, 0, HEAD_NORM_W);
    add(t, LOOM_ROLE_K_NORM_W, named(&n, "model.layers.", i, "self_attn.k_norm.weight"), 1, D, 0, HEAD_NORM_W);
  }
  if (c->softmax == LOOM_SOFTMAX_LEARNABLE) { /* GPT-OSS's name; split with the heads, undecayed as a 1-D parameter */
    loom_param_meta sinks = weight(0.02f, 0, 1);
    sinks.weight_decay = false;
    add(t, LOOM_ROLE_SINKS, named(&n, "model.layers.", i, "self_attn.sinks"), 1, c->heads, 0, sinks);
  }
  add_norm(t, c, LOOM_ROLE_LN_2_W, named(&n, "model.layers.", i, "post_attention_layernorm.weight"),
           named(&m, "model.layers.", i, "post_attention_layernorm.bias"));
  if (loom_gpt_layer_is_moe(c, i)) {
    add_experts(t, c, i);
    return;
  }
  add_fused(t, c, i, LOOM_ROLE_FC_W, swiglu ? gate_up : gate_up + 1, loom_mlp_fc_factor(c->mlp), !c->no_bias);
  add_output(t, c, i, LOOM_ROLE_MLP_PROJ_W, "mlp.down_proj", f, !c->no_bias);
}

/* An MTP module's own tensors, in DeepSeek-V3's names for its layer i:
 * enorm, hnorm, eh_proj (replicated over tp, as the norms are: under
 * sequence parallelism its grad is summed with theirs) and the final norm. */
static void add_mtp(table *t, const loom_gpt_config *c, int i) {
  name n, m;
  add_norm(t, c, LOOM_ROLE_MTP_ENORM_W, named(&n, "model.layers.", i, "enorm.weight"), named(&m, "model.layers.", i, "enorm.bias"));
  add_norm(t, c, LOOM_ROLE_MTP_HNORM_W, named(&n, "model.layers.", i, "hnorm.weight"), named(&m, "model.layers.", i, "hnorm.bias"));
  add(t, LOOM_ROLE_MTP_EH_PROJ_W, named(&n, "model.layers.", i, "eh_proj.weight"), 2, c->hidden, 2 * (int64_t)c->hidden,
      weight(0.02f, -1, 1));
  add_norm(t, c, LOOM_ROLE_MTP_NORM_W, named(&n, "model.layers.", i, "shared_head.norm.weight"),
           named(&m, "model.layers.", i, "shared_head.norm.bias"));
}

static void add_block(table *t, int i, const loom_gpt_config *c) {
  if (loom_gpt_config_is_gpt2(c)) add_gpt2_block(t, i, c);
  else add_llama_block(t, i, c);
}

int loom_gpt_block_tensors(const loom_gpt_config *cfg, int layer) {
  table t = {0};
  add_block(&t, layer, cfg);
  return t.count;
}

loom_stage_range loom_stage_whole(const loom_gpt_config *cfg) {
  return (loom_stage_range){.layer_begin = 0, .layer_end = loom_gpt_blocks(cfg), .first = true, .last = true};
}

void loom_stage_range_kinds(const loom_gpt_config *cfg, const loom_stage_range *r, loom_stage_range *edges,
                            loom_stage_range kinds[LOOM_LAYER_KINDS], int counts[LOOM_LAYER_KINDS]) {
  *edges = (loom_stage_range){r->layer_begin, r->layer_begin, r->first, r->last};
  counts[0] = counts[1] = 0;
  for (int l = r->layer_begin; l < r->layer_end; l++) {
    const int k = loom_gpt_layer_is_moe(cfg, l);
    if (counts[k]++ == 0) kinds[k] = (loom_stage_range){l, l + 1, false, false};
  }
}

/* Whether a stage holds the embedding: the first, and the last where the head is tied to it or the MTP modules
 * embed the tokens ahead with it. */
static bool holds_wte(const loom_gpt_config *cfg, const loom_stage_range *r) {
  return r->first || (r->last && (!cfg->untied || cfg->mtp_layers > 0));
}

int loom_gpt_tensors_before_blocks(const loom_gpt_config *cfg, const loom_stage_range *r) {
  const bool wte = holds_wte(cfg, r);
  return wte + (r->first && cfg->position == LOOM_POSITION_LEARNED);
}

int loom_gpt_first_block_tensor(const loom_gpt_params *p) { return loom_gpt_tensors_before_blocks(&p->cfg, &p->range); }

/* The table of the stage r on tp rank 0 of tp: names, shapes and metadata (free both). */
static int table_of(const loom_gpt_config *cfg, const loom_stage_range *r, int tp, loom_tensor **specs,
                    loom_param_meta **meta) {
  const int count = loom_gpt_param_table(cfg, r, 0, tp, NULL, NULL);
  *specs = loom_xmalloc((size_t)(count > 0 ? count : 1) * sizeof **specs, "parameter table");
  *meta = loom_xmalloc((size_t)(count > 0 ? count : 1) * sizeof **meta, "parameter table");
  loom_gpt_param_table(cfg, r, 0, tp, *specs, *meta);
  return count;
}

/* loom_gpt_zero_buckets over a table of `count` tensors whose metadata
 * (which tensors are experts') the caller has where the experts are apart. */
static int cut_table(const loom_gpt_config *cfg, const loom_stage_range *range, int stage, const loom_param_meta *meta,
                     int count, int *first) {
  const loom_stage_range r = *range;
  const bool apart = loom_gpt_zero_experts_apart(cfg);
  int n = 0;
#define CUT(k) \
  do { \
    if (first) first[n] = (k); \
    n++; \
  } while (0)
  if (loom_gpt_zero_in_place(cfg, stage)) {
    CUT(0);
  } else {
    int at = loom_gpt_tensors_before_blocks(cfg, &r);
    for (int k = 0; k < at; k++) CUT(k);
    for (int l = r.layer_begin; l < r.layer_end; l++) {
      const int end = at + loom_gpt_block_tensors(cfg, l);
      CUT(at);
      for (int k = at + 1; apart && k < end; k++)
        if (meta[k].expert != meta[k - 1].expert) CUT(k);
      at = end;
    }
    if (at < count) CUT(at);
  }
#undef CUT
  if (first) first[n] = count;
  return count > 0 ? n : 0;
}

int loom_gpt_zero_buckets(const loom_gpt_config *cfg, const loom_stage_range *range, int stage, int *first) {
  const loom_stage_range r = range ? *range : loom_stage_whole(cfg);
  if (!loom_gpt_zero_experts_apart(cfg))
    return cut_table(cfg, &r, stage, NULL, loom_gpt_param_table(cfg, &r, 0, 1, NULL, NULL), first);
  loom_tensor *specs;
  loom_param_meta *meta;
  const int count = table_of(cfg, &r, 1, &specs, &meta);
  const int n = cut_table(cfg, &r, stage, meta, count, first);
  free(specs);
  free(meta);
  return n;
}

/* Points w's views at tensors [k0, k1): at addr[k - k0], or (addr NULL) at views[k].data. */
static void bind_range(const loom_gpt_params *p, int k0, int k1, float *const *addr, const loom_tensor *views,
                       loom_gpt_weights *w) {
  int block = -1, depth = -1;
  float *prev = NULL;
  size_t prev_len = 0;
  for (int k = k0; k < k1; k++) {
    const loom_param_role role = p->meta[k].role;
    float *at = addr ? addr[k - k0] : views[k].data;
    const size_t len = loom_tensor_numel(&p->params.views[k]);
    if (role == LOOM_ROLE_LN_1_W) block++;
    if (role < LOOM_BLOCK_VIEWS) ((float **)&w->h[block])[role] = at;
    else if (role == LOOM_ROLE_FUSED)
      LOOM_CHECK(at == (prev ? prev + prev_len : NULL), "fused projections lie back to back");
    else if (role == LOOM_ROLE_WTE) w->wte = at;
    else if (role == LOOM_ROLE_WPE) w->wpe = at;
    else if (role == LOOM_ROLE_LN_F_W) w->ln_f_w = at;
    else if (role == LOOM_ROLE_LN_F_B) w->ln_f_b = at;
    else if (role == LOOM_ROLE_LM_HEAD) w->lm_head = at;
    else if (role >= LOOM_ROLE_MTP_ENORM_W) {
      if (role == LOOM_ROLE_MTP_ENORM_W) depth++;
      ((float **)&w->mtp[depth])[role - LOOM_ROLE_MTP_ENORM_W] = at;
    }
    prev = at, prev_len = len;
  }
  if (p->range.last && !p->cfg.untied) w->lm_head = w->wte;
}

void loom_gpt_bind_views(const loom_gpt_params *p, int k0, int k1, float *const *addr, loom_gpt_weights *w) {
  bind_range(p, k0, k1, addr, NULL, w);
}

/* Points a struct of views at a buffer's tensors (views a config lacks stay NULL). */
static void bind(const loom_gpt_params *p, loom_gpt_weights *w, const loom_buffer *b) {
  *w = (loom_gpt_weights){.h = w->h, .mtp = w->mtp};
  bind_range(p, 0, b->count, NULL, b->views, w);
}

int loom_gpt_param_table(const loom_gpt_config *cfg, const loom_stage_range *range, int tp_rank, int tp_size,
                         loom_tensor *specs, loom_param_meta *meta) {
  const loom_stage_range r = range ? *range : loom_stage_whole(cfg);
  table t = {specs, meta, 0, tp_rank, tp_size};
  const bool gpt2 = loom_gpt_config_is_gpt2(cfg);
  loom_param_meta vocab = weight(0.02f, 0, 1);
  vocab.init_rows = cfg->vocab; /* padded rows stay zero and never reach the loss */
  loom_param_meta wte = vocab;
  wte.shared = !cfg->untied || cfg->mtp_layers > 0; /* on the first and the last stage */
  if (holds_wte(cfg, &r)) add(&t, LOOM_ROLE_WTE, gpt2 ? "wte.weight" : "model.embed_tokens.weight", 2,
                                               cfg->padded_vocab, cfg->hidden, wte);
  if (r.first && cfg->position == LOOM_POSITION_LEARNED)
    add(&t, LOOM_ROLE_WPE, gpt2 ? "wpe.weight" : "model.embed_positions.weight", 2, cfg->seq, cfg->hidden,
        weight(0.02f, -1, 1));
  for (int i = r.layer_begin; i < r.layer_end; i++) add_block(&t, i, cfg);
  if (r.last) {
    add(&t, LOOM_ROLE_LN_F_W, gpt2 ? "ln_f.weight" : "model.norm.weight", 1, cfg->hidden, 0, NORM_W);
    if (cfg->norm == LOOM_NORM_LAYERNORM)
      add(&t, LOOM_ROLE_LN_F_B, gpt2 ? "ln_f.bias" : "model.norm.bias", 1, cfg->hidden, 0, ZERO_B);
    if (cfg->untied) add(&t, LOOM_ROLE_LM_HEAD, "lm_head.weight", 2, cfg->padded_vocab, cfg->hidden, vocab);
    for (int k = 0; k < cfg->mtp_layers; k++) add_mtp(&t, cfg, cfg->layers + k);
  }
  return t.count;
}

/* What a run keeps of each of its three buffers. */
typedef enum { NONE, LAYOUT, STORED } keep;
typedef struct {
  keep params, grads, compute; /* compute: bf16 runs only */
} keeps;

static loom_status make_buffer(loom_buffer *b, keep k, const loom_tensor *specs, int count, const loom_allocator *mem,
                               size_t pad, loom_run_buffer name) {
  if (k == NONE) return LOOM_OK;
  return k == STORED ? loom_buffer_init_padded(b, specs, count, mem, pad, loom_run_buffer_name(name))
                     : loom_buffer_layout(b, specs, count, mem);
}

static loom_status init_params(loom_gpt_params *p, const loom_gpt_config *cfg, int tp_rank, int tp_size,
                               const loom_stage_range *range, keeps kept, size_t pad, const loom_allocator *mem) {
  memset(p, 0, sizeof *p);
  const loom_stage_range r = range ? *range : loom_stage_whole(cfg);
  LOOM_CHECK(r.layer_begin >= 0 && r.layer_begin <= r.layer_end && r.layer_end <= loom_gpt_blocks(cfg), "stage layer range");
  LOOM_CHECK(r.layer_end <= cfg->layers || r.last, "the MTP modules are on the last stage");
  const int kv = loom_gpt_kv_heads(cfg);
  LOOM_CHECK(cfg->padded_vocab % tp_size == 0 && cfg->heads % tp_size == 0 && cfg->ffn % tp_size == 0 &&
                 (kv % tp_size == 0 || tp_size % kv == 0),
             "tensor-parallel split must be even (check the layout before building the model)");
  p->cfg = *cfg;
  p->range = r;
  p->layers = r.layer_end - r.layer_begin;
  p->layer_tensor = loom_xmalloc(((size_t)p->layers + 1) * sizeof *p->layer_tensor, "layer tensors");
  p->layer_tensor[0] = loom_gpt_tensors_before_blocks(cfg, &r);
  for (int l = 0; l < p->layers; l++) p->layer_tensor[l + 1] = p->layer_tensor[l] + loom_gpt_block_tensors(cfg, r.layer_begin + l);
  p->tp_rank = tp_rank;
  p->tp_size = tp_size;
  const int count = loom_gpt_param_table(cfg, &r, tp_rank, tp_size, NULL, NULL);
  table t = {loom_xcalloc((size_t)count, sizeof(loom_tensor), "param specs"),
             loom_xcalloc((size_t)count, sizeof(loom_param_meta), "param meta"), count, tp_rank, tp_size};
  loom_gpt_param_table(cfg, &r, tp_rank, tp_size, t.specs, t.meta);
  p->meta = t.meta;
  p->w.h = loom_xcalloc((size_t)p->layers + 1, sizeof(loom_block_weights), "block views");
  p->g.h = loom_xcalloc((size_t)p->layers + 1, sizeof(loom_block_weights), "block views");
  p->w.mtp = loom_xcalloc((size_t)cfg->mtp_layers + 1, sizeof(loom_mtp_weights), "MTP views");
  p->g.mtp = loom_xcalloc((size_t)cfg->mtp_layers + 1, sizeof(loom_mtp_weights), "MTP views");
  loom_status st = make_buffer(&p->params, kept.params, t.specs, count, mem, pad, LOOM_BUF_PARAMS);
  if (st == LOOM_OK) st = make_buffer(&p->grads, kept.grads, t.specs, count, mem, pad, LOOM_BUF_GRADS);
  if (st == LOOM_OK && cfg->bf16 && kept.compute != NONE) { /* the bf16 copy that runs; params are the fp32 master */
    for (int k = 0; k < count; k++) t.specs[k].dtype = LOOM_DTYPE_BF16;
    st = make_buffer(&p->compute, kept.compute, t.specs, count, mem, pad, LOOM_BUF_COMPUTE);
  }
  free(t.specs);
  if (st != LOOM_OK) {
    loom_gpt_params_free(p);
    return st;
  }
  loom_gpt_params_rebind(p);
  return LOOM_OK;
}

void loom_gpt_params_rebind(loom_gpt_params *p) {
  bind(p, &p->w, &p->params);
  if (p->grads.count) bind(p, &p->g, &p->grads);
}

void loom_gpt_params_point(loom_gpt_params *p, loom_buffer *b, int k0, int k1, void *base) {
  const size_t esize = loom_dtype_size(b->dtype), first = loom_buffer_offset(b, k0);
  size_t at = first;
  for (int k = k0; k < k1; k++) {
    b->views[k].data = base ? (char *)base + (at - first) * esize : NULL;
    at += loom_tensor_numel(&b->views[k]);
  }
  loom_gpt_params_rebind(p);
}



/* What ZeRO `stage` (0: none) keeps of the model's buffers, and the multiple
 * it pads them to: ZeRO-1 all three, padded to dp pieces where it reduces them in place; ZeRO-2 the weights
 * it computes with; ZeRO-3 nothing whole. The fp32 weights are a layout
 * only where the optimizer holds the master pieces (bf16, or ZeRO-3). */
static keeps keeps_for(const loom_gpt_config *cfg, int stage, int dp, size_t *pad) {
  *pad = loom_gpt_zero_in_place(cfg, stage) ? (size_t)dp : 1;
  if (stage == 0) return (keeps){STORED, STORED, STORED};
  const keep master = cfg->bf16 || stage == 3 ? LAYOUT : STORED;
  if (stage == 1) return (keeps){master, STORED, STORED};
  return (keeps){master, LAYOUT, stage == 2 ? STORED : LAYOUT};
}

loom_status loom_gpt_params_init(loom_gpt_params *p, const loom_gpt_config *cfg, int tp_rank, int tp_size,
                                 const loom_stage_range *range, const loom_allocator *mem) {
  size_t pad;
  const keeps kept = keeps_for(cfg, 0, 1, &pad);
  return init_params(p, cfg, tp_rank, tp_size, range, kept, pad, mem);
}

loom_status loom_gpt_params_init_for_zero(loom_gpt_params *p, const loom_gpt_config *cfg, int tp_rank, int tp_size,
                                          const loom_stage_range *range, const loom_allocator *mem, int dp, int stage) {
  LOOM_CHECK(dp >= 1 && stage >= 1 && stage <= 3, "ZeRO stage 1-3 over one replica or more");
  size_t pad;
  const keeps kept = keeps_for(cfg, stage, dp, &pad);
  return init_params(p, cfg, tp_rank, tp_size, range, kept, pad, mem);
}

loom_gpt_params_elements loom_gpt_params_stored_elements(const loom_gpt_config *cfg, const loom_stage_range *range, int tp,
                                                         int dp, int stage) {
  size_t pad;
  const keeps kept = keeps_for(cfg, stage, dp, &pad);
  const size_t n = (size_t)loom_gpt_param_count(cfg, range, tp), stored = (n + pad - 1) / pad * pad;
  const size_t whole = stored ? stored : 1; /* as loom_buffer_init_padded allocates */
  return (loom_gpt_params_elements){.params = kept.params == STORED ? whole : 0, .grads = kept.grads == STORED ? whole : 0,
                                    .compute = cfg->bf16 && kept.compute == STORED ? whole : 0};
}

loom_status loom_gpt_params_init_weights(loom_gpt_params *p, const loom_gpt_config *cfg, int tp_rank, int tp_size,
                                         const loom_stage_range *range, const loom_allocator *mem) {
  return init_params(p, cfg, tp_rank, tp_size, range, (keeps){STORED, NONE, NONE}, 1, mem);
}

void loom_gpt_params_free(loom_gpt_params *p) {
  loom_buffer_free(&p->params);
  loom_buffer_free(&p->grads);
  loom_buffer_free(&p->compute);
  free(p->meta);
  free(p->layer_tensor);
  free(p->w.h);
  free(p->g.h);
  free(p->w.mtp);
  free(p->g.mtp);
  memset(p, 0, sizeof *p);
}

/* Draws local rows [i0, i1) of tensor k, which map to consecutive global
 * rows, into dst (the tensor's host copy). */
static void draw_rows(const loom_gpt_params *p, int k, float *dst, int64_t i0, int64_t i1, uint64_t seed) {
  const loom_tensor *t = &p->params.views[k];
  const loom_param_meta *m = &p->meta[k];
  const int64_t cols = t->ndim == 2 ? t->shape[1] : 1;
  int64_t row, col;
  loom_shard_locate(&m->layout, p->tp_rank, p->tp_size, i0, &row, &col);
  dst += i0 * cols;
  const int64_t drawn = row >= m->init_rows ? 0 : (row + (i1 - i0) <= m->init_rows ? i1 - i0 : m->init_rows - row);
  if (cols == m->layout.cols) { /* whole rows: one run of global indices */
    loom_rng_fill_normal(dst, (size_t)(drawn * cols), seed, loom_hash_str(t->name), (uint64_t)(row * cols), 0.0f, m->init_std);
  } else {
    for (int64_t r = 0; r < drawn; r++)
      loom_rng_fill_normal(dst + r * cols, (size_t)cols, seed, loom_hash_str(t->name),
                           (uint64_t)((row + r) * m->layout.cols + col), 0.0f, m->init_std);
  }
  memset(dst + drawn * cols, 0, (size_t)((i1 - i0 - drawn) * cols) * sizeof(float));
}

void loom_gpt_params_randomize(loom_gpt_params *p, uint64_t seed) {
  loom_gpt_params_randomize_slice(p, seed, p->params.base, 0, p->params.numel);
}

void loom_gpt_params_randomize_slice(const loom_gpt_params *p, uint64_t seed, float *dst, size_t begin, size_t end) {
  const loom_allocator *mem = p->params.alloc;
  size_t most = 1;
  for (int k = 0; k < p->params.count; k++) {
    const size_t n = loom_tensor_numel(&p->params.views[k]);
    most = n > most ? n : most;
  }
  float *host = loom_xmalloc(most * sizeof(float), "initial parameters");
  size_t lo = 0; /* the views lie back to back: tensor k is [lo, hi) */
  for (int k = 0; k < p->params.count; lo += loom_tensor_numel(&p->params.views[k]), k++) {
    const loom_tensor *t = &p->params.views[k];
    const loom_param_meta *m = &p->meta[k];
    const size_t hi = lo + loom_tensor_numel(t);
    const size_t from = lo > begin ? lo : begin, to = hi < end ? hi : end;
    if (to <= from) continue;
    float *out = dst + (from - begin);
    if (m->init != LOOM_INIT_NORMAL) {
      const float value = m->init == LOOM_INIT_ONES ? 1.0f : 0.0f;
      uint32_t bits;
      memcpy(&bits, &value, sizeof bits);
      mem->fill32(mem, out, bits, to - from);
      continue;
    }
    /* Walk local rows in runs whose global rows are consecutive. */
    const int64_t rows = t->shape[0];
    int64_t start = 0;
    for (int64_t i = 1; i <= rows; i++) {
      int64_t prev, next, col;
      loom_shard_locate(&m->layout, p->tp_rank, p->tp_size, i - 1, &prev, &col);
      if (i < rows) loom_shard_locate(&m->layout, p->tp_rank, p->tp_size, i, &next, &col);
      if (i == rows || next != prev + 1) {
        draw_rows(p, k, host, start, i, seed);
        start = i;
      }
    }
    mem->from_host(mem, out, host + (from - lo), (to - from) * sizeof(float));
  }
  free(host);
}

int loom_gpt_params_find(const loom_gpt_params *p, const char *name) {
  for (int i = 0; i < p->params.count; i++)
    if (strcmp(p->params.views[i].name, name) == 0) return i;
  return -1;
}

/* Elements of the table of one range, walked tensor by tensor. */
/* Values of one TP rank's tensors of a stage; only the TP-replicated ones if asked. */
/* Which tensors a count takes. */
typedef bool (*count_filter)(const loom_param_meta *m);
static bool every_tensor(const loom_param_meta *m) { return true; }
static bool summed_under_sp(const loom_param_meta *m) { return loom_param_tp_summed(m, true); }
static bool summed_without_sp(const loom_param_meta *m) { return loom_param_tp_summed(m, false); }

static size_t table_count(const loom_gpt_config *c, const loom_stage_range *range, int tp_size, count_filter keep) {
  const int n = loom_gpt_param_table(c, range, 0, tp_size, NULL, NULL);
  loom_tensor *specs = loom_xmalloc((size_t)n * sizeof *specs, "parameter table");
  loom_param_meta *meta = loom_xmalloc((size_t)n * sizeof *meta, "parameter table");
  loom_gpt_param_table(c, range, 0, tp_size, specs, meta);
  size_t total = 0;
  for (int k = 0; k < n; k++)
    if (keep(&meta[k])) total += loom_tensor_numel(&specs[k]);
  free(specs);
  free(meta);
  return total;
}

/* Counts recently asked for: plan search asks for the same few thousands of
 * times, and a table walk formats every tensor's name. Entries match on the
 * config's bytes, so a hit is always the same question. */
typedef struct {
  loom_gpt_config cfg;
  loom_stage_range range;
  int tp;
  size_t count;
  bool used;
} count_memo;
static count_memo g_memo[4096]; /* a hash table: one entry per slot, the newest wins */

static size_t uncached_count(const loom_gpt_config *cfg, const loom_stage_range *range, int tp_size, count_filter keep);

static uint64_t fnv(uint64_t h, const void *data, size_t n) {
  const unsigned char *b = data;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

size_t loom_gpt_param_count(const loom_gpt_config *cfg, const loom_stage_range *range, int tp_size) {
  loom_stage_range r;
  memset(&r, 0, sizeof r); /* padding bytes too: the key is hashed and compared as bytes */
  const loom_stage_range given = range ? *range : loom_stage_whole(cfg);
  /* Keyed by how many layers and which edges, not where the range starts
   * where every block has the same tensors (a stage's count is then its
   * position's); with dense layers among MoE ones, by the range itself. */
  const int begin = loom_gpt_has_dense_layers(cfg) ? given.layer_begin : 0;
  r.layer_begin = begin, r.layer_end = begin + given.layer_end - given.layer_begin, r.first = given.first, r.last = given.last;
  uint64_t h = fnv(fnv(fnv(1469598103934665603ull, cfg, sizeof *cfg), &r, sizeof r), &tp_size, sizeof tp_size);
  count_memo *m = &g_memo[h % (sizeof g_memo / sizeof g_memo[0])];
  if (m->used && m->tp == tp_size && memcmp(&m->range, &r, sizeof r) == 0 && memcmp(&m->cfg, cfg, sizeof *cfg) == 0)
    return m->count;
  memcpy(&m->cfg, cfg, sizeof *cfg);
  m->range = r, m->tp = tp_size, m->count = uncached_count(cfg, &r, tp_size, every_tensor), m->used = true;
  return m->count;
}

size_t loom_gpt_expert_param_count(const loom_gpt_config *cfg, const loom_stage_range *range) {
  if (!loom_gpt_is_moe(cfg)) return 0;
  const loom_stage_range r = range ? *range : loom_stage_whole(cfg);
  const size_t f = (size_t)loom_gpt_local_expert_ffn(cfg), h = (size_t)cfg->hidden;
  const size_t biases = loom_gpt_experts_biased(cfg) ? (size_t)loom_mlp_fc_factor(cfg->mlp) * f + h : 0;
  const size_t expert = (size_t)loom_mlp_matrices(cfg->mlp) * h * f + biases;
  return (size_t)loom_gpt_moe_layers(cfg, r.layer_begin, r.layer_end) * (size_t)loom_gpt_local_experts(cfg) * expert;
}

size_t loom_gpt_active_param_count(const loom_gpt_config *cfg) {
  const loom_gpt_config whole = loom_gpt_config_for_ep(cfg, 1, 1, 0);
  const size_t total = loom_gpt_param_count(&whole, NULL, 1);
  if (!loom_gpt_is_moe(cfg)) return total;
  return total - loom_gpt_expert_param_count(&whole, NULL) / (size_t)cfg->moe.experts * (size_t)(cfg->moe.experts - cfg->moe.topk);
}

size_t loom_gpt_tp_summed_param_count(const loom_gpt_config *cfg, const loom_stage_range *range, int tp_size,
                                      bool sequence_parallel) {
  const loom_stage_range whole = loom_stage_whole(cfg);
  return uncached_count(cfg, range ? range : &whole, tp_size, sequence_parallel ? summed_under_sp : summed_without_sp);
}

size_t loom_gpt_vocab_param_count(const loom_gpt_config *cfg, const loom_stage_range *range, int tp_size) {
  const loom_stage_range whole = loom_stage_whole(cfg);
  return uncached_count(cfg, range ? range : &whole, tp_size, loom_param_is_vocab_table);
}

static size_t uncached_count(const loom_gpt_config *cfg, const loom_stage_range *range, int tp_size, count_filter keep) {
  /* A config already padded for this split (or more) is counted as it is. */
  const loom_gpt_config c = cfg->padded_vocab % (LOOM_VOCAB_ALIGN * tp_size) ? loom_gpt_config_for_tp(cfg, tp_size) : *cfg;
  loom_stage_range edges, one[LOOM_LAYER_KINDS];
  int counts[LOOM_LAYER_KINDS];
  loom_stage_range_kinds(&c, range, &edges, one, counts);
  if (counts[0] + counts[1] <= 1) return table_count(&c, range, tp_size, keep);
  size_t n = table_count(&c, &edges, tp_size, keep);
  for (int k = 0; k < LOOM_LAYER_KINDS; k++)
    if (counts[k]) n += (size_t)counts[k] * table_count(&c, &one[k], tp_size, keep);
  return n;
}

/* Copies tensor k between rank `rank`'s shard (local) and the whole model's
 * tensor, both in mem; rows past the whole tensor's are vocab padding and
 * are skipped. */
static void copy_shard(const loom_allocator *mem, const loom_param_meta *meta, int rank, int size,
                       const loom_tensor *whole, float *local, int to_local) {
  int64_t rows, cols;
  loom_shard_local_shape(&meta->layout, rank, size, &rows, &cols);
  const int64_t whole_rows = whole->shape[0], whole_cols = whole->ndim == 2 ? whole->shape[1] : 1;
  for (int64_t i = 0; i < rows; i++) {
    int64_t row, col;
    loom_shard_locate(&meta->layout, rank, size, i, &row, &col);
    if (row >= whole_rows) continue;
    float *g = (float *)whole->data + row * whole_cols + col, *s = local + i * cols;
    mem->copy(mem, to_local ? s : g, to_local ? g : s, (size_t)cols * sizeof(float));
  }
}

/* The whole model's tensor of the same canonical name as p's tensor k. */
static const loom_tensor *whole_of(const loom_gpt_params *p, int k, const loom_gpt_params *full) {
  LOOM_CHECK(full->tp_size == 1, "copy shards to or from a model that is not split");
  const int i = loom_gpt_params_find(full, p->params.views[k].name);
  LOOM_CHECK(i >= 0, "the whole model holds every tensor");
  return &full->params.views[i];
}

void loom_gpt_params_copy_shards(loom_gpt_params *p, loom_gpt_params *full, int to_local) {
  LOOM_CHECK(p->params.alloc->owns(p->params.alloc, full->params.base),
             "copy shards between models in memory one allocator copies");
  for (int k = 0; k < p->params.count; k++)
    copy_shard(p->params.alloc, &p->meta[k], p->tp_rank, p->tp_size, whole_of(p, k, full), p->params.views[k].data,
               to_local);
}

double loom_attention_keys(int T, int window) {
  return window > 0 && window < T ? 2.0 * window - (double)window * window / T : (double)T;
}

double loom_gpt_stage_train_flops(const loom_gpt_config *cfg, const loom_stage_range *range, int T, double tokens,
                                  loom_flops_formula formula) {
  const double h = cfg->hidden, f = cfg->ffn, layers = range->layer_end - range->layer_begin;
  const double moe_layers = loom_gpt_moe_layers(cfg, range->layer_begin, range->layer_end);
  const double q = (double)cfg->heads * loom_gpt_head_dim(cfg), kv = 2.0 * loom_gpt_kv_heads(cfg) * loom_gpt_head_dim(cfg);
  /* a layer's attention projections, and the width its scores and values take per key (q's; MLA's q and v halved,
   * as Megatron's formula counts them, its latents' norms counted with their projections) */
  double projections = h * (q + kv) + q * h, core = q;
  if (loom_gpt_is_mla(cfg)) {
    const loom_mla_config *a = &cfg->mla;
    const double H = cfg->heads, D = loom_gpt_qk_head_dim(cfg), v = a->v_head_dim, rq = a->q_lora_rank, rkv = a->kv_lora_rank;
    projections = (rq > 0 ? rq * (h + H * D + 1.0) : h * H * D) + rkv * (h + H * (a->qk_head_dim + v) + 1.0) +
                  h * a->qk_pos_emb_head_dim + H * v * h;
    core = H * (D + v) / 2.0;
  }
  /* gate, up and down; or up and down. A MoE layer's: its top-k experts' and its shared expert's (the router's
   * E x h, as Megatron, left out). */
  const double moe_width = loom_gpt_is_moe(cfg) ? (double)cfg->moe.topk * loom_gpt_expert_ffn(cfg) + cfg->moe.shared_ffn : 0.0;
  const double widths = moe_layers * moe_width + (layers - moe_layers) * f; /* the layers' MLPs' widths summed */
  const double mlp = loom_mlp_matrices(cfg->mlp) * h * widths;
  /* an MTP module: its block counted with the layers, eh_proj's 2h x h and its three norms (Megatron's 3h + 2h^2),
   * and its own pass through the head */
  const double mtp = range->layer_end > cfg->layers ? range->layer_end - (range->layer_begin > cfg->layers ? range->layer_begin : cfg->layers) : 0.0;
  const double layer_matmul = layers * projections + mlp + mtp * (3.0 * h + 2.0 * h * h);
  const double head = range->last ? (1.0 + cfg->mtp_layers) * (double)cfg->vocab * h : 0.0;
  /* scores and values: 4 T q FLOPs per token and layer, one pass (q = heads x head dim: hidden unless --kv-channels
   * sets another width, as Megatron's query_projection_to_hidden_size_ratio scales it), T the keys a window leaves */
  double attention = 0.0;
  for (int l = range->layer_begin; l < range->layer_end; l++) attention += core * loom_attention_keys(T, loom_gpt_layer_window(cfg, l));
  if (formula == LOOM_FLOPS_SC21) return (8.0 * layer_matmul + 16.0 * attention + 6.0 * head) * tokens;
  return (6.0 * (layer_matmul + head) + (formula == LOOM_FLOPS_NEMO ? 12.0 : 6.0) * attention) * tokens;
}

double loom_gpt_train_flops(const loom_gpt_config *cfg, int T, double tokens, loom_flops_formula formula) {
  const loom_stage_range whole = loom_stage_whole(cfg);
  return loom_gpt_stage_train_flops(cfg, &whole, T, tokens, formula);
}

static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }


/* The buckets of one stage's table, each padded to pieces over its group. */
typedef struct {
  size_t shard, padded, max_shard;
} bucket_sizes;

static bucket_sizes sum_buckets(const loom_gpt_config *cfg, const loom_stage_range *r, int tp, int stage, size_t dp,
                                size_t edp) {
  loom_tensor *specs;
  loom_param_meta *meta;
  const int count = table_of(cfg, r, tp, &specs, &meta);
  int *first = loom_xmalloc(((size_t)count + 2) * sizeof *first, "ZeRO buckets");
  const int n = cut_table(cfg, r, stage, meta, count, first); /* the table at hand: experts' wherever tp splits them */
  bucket_sizes s = {0};
  for (int b = 0; b < n; b++) {
    size_t numel = 0;
    for (int k = first[b]; k < first[b + 1]; k++) numel += loom_tensor_numel(&specs[k]);
    const size_t size = meta[first[b]].expert && loom_gpt_zero_experts_apart(cfg) ? edp : dp, shard = ceil_div(numel, size);
    s.shard += shard, s.padded += shard * size;
    s.max_shard = shard > s.max_shard ? shard : s.max_shard;
  }
  free(specs);
  free(meta);
  free(first);
  return s;
}

loom_zero_cut loom_gpt_zero_cut(const loom_gpt_config *cfg, const loom_stage_range *range, int tp, int dp_size, int stage) {
  const size_t dp = (size_t)(dp_size > 0 ? dp_size : 1);
  const bool apart = loom_gpt_zero_experts_apart(cfg);
  /* The experts' replicas: the stage's tp x dp ranks over the expert-parallel and expert-tensor-parallel sizes. */
  const size_t edp = apart ? (size_t)loom_expert_data_size(tp, dp, loom_gpt_expert_tp(cfg), cfg->moe.ep) : dp;
  loom_zero_cut z = {0};
  if (loom_gpt_zero_in_place(cfg, stage)) { /* one bucket: the whole chunk */
    z.shard = z.max_shard = ceil_div((size_t)loom_gpt_param_count(cfg, range, tp), dp);
  } else {
    /* The optimizer's buckets (loom_gpt_zero_buckets). Every layer of a kind is cut alike, so the edges' are cut
     * from the table of the stage without its layers (a few tensors, where the whole table of a deep stage costs a
     * plan search dearly) and one layer's of each kind counted for all. */
    loom_stage_range edges, one[LOOM_LAYER_KINDS];
    int layers[LOOM_LAYER_KINDS];
    loom_stage_range_kinds(cfg, range, &edges, one, layers);
    const bucket_sizes e = sum_buckets(cfg, &edges, tp, stage, dp, edp);
    z.shard = e.shard, z.edges = e.padded, z.edge_shard = z.max_shard = e.max_shard;
    for (int k = 0; k < LOOM_LAYER_KINDS; k++) {
      if (!layers[k]) continue;
      const bucket_sizes l = sum_buckets(cfg, &one[k], tp, stage, dp, edp);
      z.shard += (size_t)layers[k] * l.shard;
      z.layer_max = l.padded > z.layer_max ? l.padded : z.layer_max;
      z.layer_shard = l.shard > z.layer_shard ? l.shard : z.layer_shard;
      z.max_shard = l.max_shard > z.max_shard ? l.max_shard : z.max_shard;
    }
  }
  z.round = z.max_shard < LOOM_ZERO_GATHER_ROUND ? z.max_shard : LOOM_ZERO_GATHER_ROUND;
  z.slice = loom_gpt_zero_in_place(cfg, stage) ? z.shard : z.round;
  if (stage == 2 || (stage == 1 && !loom_gpt_zero_in_place(cfg, stage))) z.staging = z.round * (edp > dp ? edp : dp);
  return z;
}
