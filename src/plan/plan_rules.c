/* The plan's rules, the one validation: sizes, model, stages, batch,
 * compression, the verified schedule and memory. */
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
#include "schedule/verify.h"

/* A size as a person reads it: GiB, MiB or KiB, never "0.0 GiB". */
static const char *human_bytes(double bytes, char *buf, size_t n) {
  if (bytes >= 0.95 * 1073741824.0) snprintf(buf, n, "%.1f GiB", bytes / 1073741824.0);
  else if (bytes >= 0.95 * 1048576.0) snprintf(buf, n, "%.1f MiB", bytes / 1048576.0);
  else snprintf(buf, n, "%.0f KiB", bytes / 1024.0);
  return buf;
}

/* ---- rules ---- */

typedef struct {
  char *out;
  size_t cap, used;
  int count;
} report;

static void violation(report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void violation(report *r, const char *fmt, ...) {
  r->count++;
  if (!r->out || r->used + 2 >= r->cap) return;
  va_list ap;
  va_start(ap, fmt);
  const int n = vsnprintf(r->out + r->used, r->cap - r->used - 1, fmt, ap);
  va_end(ap);
  r->used += n > 0 ? (size_t)n : 0;
  if (r->used >= r->cap - 1) r->used = r->cap - 2;
  r->out[r->used++] = '\n';
  r->out[r->used] = '\0';
}

/* A per-layer pattern (MoE layers, windowed layers): one entry per layer, each 1 or 0 (named `one` and `zero`).
 * Returns how many entries are 1, or -1 when the pattern is absent or broke a rule (said). */
static long check_layer_bits(report *r, const char *field, const int32_t *bits, size_t n, int layers, const char *one,
                             const char *zero) {
  if (n == 0) return -1;
  if (n != (size_t)layers) {
    violation(r, "%s: %zu entries, but model.layers = %d; give one per layer (1: %s, 0: %s)", field, n, layers, one, zero);
    return -1;
  }
  long ones = 0;
  for (size_t l = 0; l < n; l++) {
    if (bits[l] != 0 && bits[l] != 1) {
      violation(r, "%s[%zu] = %d: must be 1 (%s) or 0 (%s)", field, l, bits[l], one, zero);
      return -1;
    }
    ones += bits[l];
  }
  return ones;
}

/* Group-limited routing: both counts or neither; groups that divide the
 * experts, no more chosen than there are, each scored by at least one of
 * its experts (topk / group_topk), and room in the chosen groups for the
 * top-k. */
static void check_router_groups(report *r, const Loom__Moe *e) {
  if (!e->has_router_groups && !e->has_router_group_topk) return;
  if (!e->has_router_group_topk) {
    violation(r, "model.moe.router_groups = %d: needs model.moe.router_group_topk, how many of the groups a token's "
              "experts come from (DeepSeek-V3's 8 groups, 4 of them)", e->router_groups);
    return;
  }
  if (!e->has_router_groups) {
    violation(r, "model.moe.router_group_topk = %d: needs model.moe.router_groups, the groups the experts are in "
              "(DeepSeek-V3's 8 groups, 4 of them)", e->router_group_topk);
    return;
  }
  const int G = e->router_groups, g = e->router_group_topk;
  if (G < 1 || e->experts < 1 || e->experts % G != 0) {
    violation(r, "model.moe.router_groups = %d: must divide the experts (%d) into equal groups", G, e->experts);
    return;
  }
  if (g < 1 || g > G)
    violation(r, "model.moe.router_group_topk = %d: a token's experts come from that many of the %d groups; give 1 to %d",
              g, G, G);
  else if (g > e->topk)
    violation(r, "model.moe.router_group_topk = %d: each chosen group is scored by its best topk / group_topk scores, "
              "but topk is %d; give at most %d", g, e->topk, e->topk);
  else if (e->topk > g * (e->experts / G))
    violation(r, "model.moe.topk = %d: more experts than the %d chosen groups of %d hold", e->topk, g, e->experts / G);
}

/* A Mixture-of-Experts model's rules (its sizes already in bounds). */
static void check_moe(report *r, const Loom__Model *m, int tp) {
  const Loom__Moe *e = m->moe;
  if (e->topk > e->experts)
    violation(r, "model.moe.topk = %d: a token's experts must be at most model.moe.experts (%d)", e->topk, e->experts);
  if (e->shared_ffn % tp)
    violation(r, "model.moe.shared_ffn = %d: must be divisible by parallel.tp (%d), the shared expert split as the dense "
              "MLP is; pick a tp that divides it", e->shared_ffn, tp);
  if (check_layer_bits(r, "model.moe.layer_pattern", e->layer_pattern, e->n_layer_pattern, m->layers,
                       "a Mixture of Experts", "the dense MLP") == 0)
    violation(r, "model.moe.layer_pattern: no layer is a Mixture of Experts; make one a MoE layer, or give the model no "
              "experts");
  if (e->shared_gate && e->shared_ffn == 0)
    violation(r, "model.moe.shared_gate = true: gates the shared expert, but model.moe.shared_ffn is 0 (no shared expert)");
  if (e->has_capacity_factor && !(isfinite(e->capacity_factor) && e->capacity_factor > 0.0 &&
                                  e->capacity_factor <= LOOM_PLAN_MAX_CAPACITY_FACTOR))
    violation(r, "model.moe.capacity_factor = %g: must be a positive finite number up to %g (absent: dropless)",
              e->capacity_factor, LOOM_PLAN_MAX_CAPACITY_FACTOR);
  if (!(isfinite(e->aux_loss_coeff) && e->aux_loss_coeff >= 0.0f) || !(isfinite(e->z_loss_coeff) && e->z_loss_coeff >= 0.0f))
    violation(r, "model.moe: aux_loss_coeff %g and z_loss_coeff %g must be finite and at least 0 (Megatron's usual: 1e-2 "
              "and 1e-3)", (double)e->aux_loss_coeff, (double)e->z_loss_coeff);
  if (e->expert_bias && e->score != LOOM__MOE_SCORE__MOE_SCORE_SIGMOID)
    violation(r, "model.moe.expert_bias = true: DeepSeek-V3's aux-loss-free balancing biases sigmoid scores, but "
              "model.moe.score is softmax; set it to sigmoid, as Megatron-Core requires");
  if (e->has_bias_update_rate && !(isfinite(e->bias_update_rate) && e->bias_update_rate >= 0.0f && e->bias_update_rate <= 1.0f))
    violation(r, "model.moe.bias_update_rate = %g: must be finite, from 0 to 1 (Megatron-Core's default: 1e-3)",
              (double)e->bias_update_rate);
  if (e->pre_softmax && e->score != LOOM__MOE_SCORE__MOE_SCORE_SOFTMAX)
    violation(r, "model.moe.pre_softmax = true: orders a softmax before the top-k, but model.moe.score is sigmoid");
  check_router_groups(r, e);
  if (e->has_topk_scaling && !(isfinite(e->topk_scaling) && e->topk_scaling > 0.0f))
    violation(r, "model.moe.topk_scaling = %g: the chosen weights' factor must be finite and above 0 (DeepSeek-V3's 2.5)",
              (double)e->topk_scaling);
}

/* Sliding windows: shorter than the sequence (a longer one changes nothing), and a pattern of one entry per layer. */
static void check_window(report *r, const Loom__Model *m) {
  if (m->has_window_size && m->window_size >= m->seq)
    violation(r, "model.window_size = %d: a query's window must be shorter than the sequence (model.seq %d), past which it "
              "changes nothing; drop it or make it shorter", m->window_size, m->seq);
  if (m->n_window_pattern && !m->has_window_size)
    violation(r, "model.window_pattern: says which layers are windowed, but model.window_size sets no window");
  check_layer_bits(r, "model.window_pattern", m->window_pattern, m->n_window_pattern, m->layers, "a windowed layer",
                   "full attention");
}

/* SwiGLU's gated unit: a finite alpha of at least 0, a finite clamp of at least 0, a finite offset, on a SwiGLU MLP. */
static void check_glu(report *r, const Loom__Model *m) {
  if (!m->has_glu_alpha && !m->has_glu_clamp && !m->has_glu_offset) return;
  if (m->mlp != LOOM__MLP__MLP_SWIGLU)
    violation(r, "model.glu_alpha, model.glu_clamp, model.glu_offset: shape SwiGLU's gated unit, but model.mlp is not "
              "MLP_SWIGLU");
  else if (!(isfinite(m->glu_alpha) && m->glu_alpha >= 0.0f))
    violation(r, "model.glu_alpha = %g: must be a finite number of at least 0 (0 or 1: SwiGLU's; 1.702: --quick-geglu's)", (double)m->glu_alpha);
  else if (!(isfinite(m->glu_clamp) && m->glu_clamp >= 0.0f))
    violation(r, "model.glu_clamp = %g: must be a finite number of at least 0 (0: none; GPT-OSS's 7)", (double)m->glu_clamp);
  else if (!isfinite(m->glu_offset))
    violation(r, "model.glu_offset = %g: must be a finite number (GPT-OSS's 1)", (double)m->glu_offset);
}

/* Multi-head latent attention: low ranks below the hidden size, an even RoPE part on a RoPE model, and none of the
 * other attention's settings (its keys and values come per head from the latent). */
static void check_mla(report *r, const Loom__Model *m) {
  const Loom__Mla *a = m->mla;
  if (!a) return;
  if (a->kv_lora_rank > m->hidden)
    violation(r, "model.mla.kv_lora_rank = %d: the compressed keys and values must be narrower than the hidden state "
              "(model.hidden %d); DeepSeek-V3's is 512 of 7168", a->kv_lora_rank, m->hidden);
  if (a->q_lora_rank > m->hidden)
    violation(r, "model.mla.q_lora_rank = %d: q's latent must be narrower than the hidden state (model.hidden %d); "
              "DeepSeek-V3's is 1536 of 7168", a->q_lora_rank, m->hidden);
  if (a->qk_pos_emb_head_dim % 2)
    violation(r, "model.mla.qk_pos_emb_head_dim = %d: RoPE turns pairs of dims, so it must be even (DeepSeek-V3's 64)",
              a->qk_pos_emb_head_dim);
  if (m->position != LOOM__POSITION__POSITION_ROPE)
    violation(r, "model.mla: turns its decoupled q and k parts with RoPE; set model.position = POSITION_ROPE");
  if (m->norm != LOOM__NORM__NORM_RMSNORM)
    violation(r, "model.mla: its latents are normalised with RMSNorm, as the model's other norms; set model.norm = "
              "NORM_RMSNORM");
  if (m->bias || m->qkv_bias)
    violation(r, "model.mla: its projections have no biases (DeepSeek's attention_bias false); set model.bias = false "
              "and drop qkv_bias");
  if ((m->has_kv_heads && m->kv_heads != m->heads) || m->has_kv_channels || m->qk_layernorm)
    violation(r, "model.mla: every head has its own key and value, of the widths model.mla.qk_head_dim and "
              "model.mla.v_head_dim, its latents normalised; drop model.kv_heads, model.kv_channels and "
              "model.qk_layernorm");
  if (a->has_mscale_all_dim && !(isfinite(a->mscale_all_dim) && a->mscale_all_dim > 0.0f))
    violation(r, "model.mla.mscale_all_dim = %g: must be finite and above 0 (DeepSeek-V3's 1)", (double)a->mscale_all_dim);
}

/* Multi-token prediction: a sequence long enough for the deepest module to have a token to predict, rotary
 * positions (the tokens ahead are embedded without a position table), a finite loss scale of at least 0. */
static void check_mtp(report *r, const Loom__Model *m) {
  const int D = m->mtp_num_layers;
  if (D == 0) return;
  if (m->seq <= D)
    violation(r, "model.mtp_num_layers = %d: module %d predicts the token %d ahead, which a sequence of model.seq = %d "
              "never has; the model is too short for it (seq must exceed mtp_num_layers)", D, D, D + 1, m->seq);
  if (m->position != LOOM__POSITION__POSITION_ROPE)
    violation(r, "model.mtp_num_layers = %d: the modules embed the tokens ahead without a learned position table; set "
              "model.position = POSITION_ROPE (DeepSeek-V3's)", D);
  if (m->has_mtp_loss_scaling_factor && !(isfinite(m->mtp_loss_scaling_factor) && m->mtp_loss_scaling_factor >= 0.0f))
    violation(r, "model.mtp_loss_scaling_factor = %g: must be a finite number of at least 0 (Megatron's default 0.1, "
              "DeepSeek-V3's 0.3 then 0.1)", (double)m->mtp_loss_scaling_factor);
}

/* The model's own rules, split tp ways (its sizes already in bounds). */
static void check_model_shape(report *r, const Loom__Model *m, int tp) {
  if (!m->has_kv_channels && m->hidden % m->heads)
    violation(r, "model.hidden = %d: must be divisible by model.heads (%d); pick heads that divide hidden, or set "
              "model.kv_channels (each head's width)", m->hidden, m->heads);
  const int head_dim = m->has_kv_channels ? m->kv_channels : m->hidden / m->heads;
  if (m->heads % tp)
    violation(r, "model.heads = %d: must be divisible by parallel.tp (%d) so each rank holds whole heads; pick a tp that divides heads",
              m->heads, tp);
  if (m->ffn % tp)
    violation(r, "model.ffn = %d: must be divisible by parallel.tp (%d); pick a tp that divides ffn", m->ffn, tp);
  if (!(m->dropout >= 0.0f && m->dropout < 1.0f)) /* also catches nan */
    violation(r, "model.dropout = %g: must be in [0, 1)", (double)m->dropout);
  if (!(isfinite(m->norm_eps) && m->norm_eps > 0.0f))
    violation(r, "model.norm_eps = %g: must be a positive finite number (1e-5 is GPT-2's)", (double)m->norm_eps);
  const int kv = m->has_kv_heads ? m->kv_heads : m->heads;
  if (m->heads % kv)
    violation(r, "model.kv_heads = %d: must divide model.heads (%d), each key/value head serving a group of query heads",
              kv, m->heads);
  else if (kv != m->heads && kv % tp && tp % kv) /* multi-head attention: the heads' rule says it */
    violation(r, "model.kv_heads = %d with parallel.tp = %d: tp must divide kv_heads (each rank holds kv_heads / tp) or be a "
              "multiple of it (each head replicated over tp / kv_heads ranks); pick such a tp", kv, tp);
  if (m->position == LOOM__POSITION__POSITION_ROPE && head_dim % 2 && !m->mla)
    violation(r, "model.position = POSITION_ROPE: needs an even head size, but the heads are %d wide", head_dim);
  if (m->qk_layernorm && m->norm != LOOM__NORM__NORM_RMSNORM)
    violation(r, "model.qk_layernorm = true: normalises q and k with RMSNorm, as the model's other norms; set "
              "model.norm = NORM_RMSNORM (Qwen3's and Megatron-Core's pairing)");
  if (m->position == LOOM__POSITION__POSITION_ROPE && !(isfinite(m->rope_theta) && m->rope_theta > 1.0f))
    violation(r, "model.rope_theta = %g: must be a finite number above 1 (10000 is RoPE's, 500000 Llama 3's)",
              (double)m->rope_theta);
  if (m->out_bias && m->bias)
    violation(r, "model.out_bias = true: keeps the attention output's bias where the other linears have none, but "
              "model.bias is true; set bias = false or drop out_bias");
  if (m->qkv_bias && m->bias)
    violation(r, "model.qkv_bias = true: keeps q, k and v's biases where the other linears have none, but model.bias is "
              "true; set bias = false (Qwen2's layout) or drop qkv_bias");
  if (m->moe) check_moe(r, m, tp);
  check_mla(r, m);
  check_mtp(r, m);
  check_window(r, m);
  check_glu(r, m);
  const Loom__RopeScaling *sc = m->rope_scaling;
  const float beta_fast = sc && sc->has_beta_fast ? sc->beta_fast : LOOM_YARN_BETA_FAST;
  const float beta_slow = sc && sc->has_beta_slow ? sc->beta_slow : LOOM_YARN_BETA_SLOW;
  if (sc && m->position != LOOM__POSITION__POSITION_ROPE)
    violation(r, "model.rope_scaling: scales RoPE's frequencies, but model.position is not POSITION_ROPE");
  else if (sc && !(isfinite(sc->factor) && sc->factor >= 1.0f))
    violation(r, "model.rope_scaling.factor = %g: must be a finite number of at least 1 (Llama 3.1's is 8)", (double)sc->factor);
  else if (sc && sc->yarn && !(isfinite(beta_fast) && isfinite(beta_slow) && beta_fast > beta_slow && beta_slow > 0.0f))
    violation(r, "model.rope_scaling: YaRN's beta_fast %g and beta_slow %g must be finite with beta_fast > beta_slow > 0 "
              "(GPT-OSS's and DeepSeek's: 32 and 1)", (double)beta_fast, (double)beta_slow);
  else if (sc && sc->yarn && sc->has_attention_factor && !(isfinite(sc->attention_factor) && sc->attention_factor > 0.0f))
    violation(r, "model.rope_scaling.attention_factor = %g: must be a finite number above 0 (YaRN's default: 0.1 ln(factor) "
              "+ 1)", (double)sc->attention_factor);
  else if (sc && !sc->yarn && !(isfinite(sc->low_freq_factor) && isfinite(sc->high_freq_factor) && sc->low_freq_factor > 0.0f &&
                   sc->high_freq_factor > sc->low_freq_factor))
    violation(r, "model.rope_scaling: low_freq_factor %g and high_freq_factor %g must be finite with 0 < low < high "
              "(Llama 3.1's: 1 and 4)", (double)sc->low_freq_factor, (double)sc->high_freq_factor);
  else if (sc && sc->original_max_position_embeddings < 1)
    violation(r, "model.rope_scaling.original_max_position_embeddings = %d: must be at least 1 (Llama 3.1's is 8192)",
              sc->original_max_position_embeddings);
}

/* The experts a size of parallel.`field` splits (`what`), or NULL, said, where the model is dense. */
static const Loom__Moe *experts_to_split(report *r, const loom_plan *p, const char *field, int size, const char *what) {
  if (!p->model->moe)
    violation(r, "parallel.%s = %d: %s splits a Mixture of Experts' experts, but the model is dense; give it "
              "model.moe.experts or drop %s", field, size, what, field);
  return p->model->moe;
}

/* Expert tensor parallelism's rules: 1, or the tp group splitting each expert as it splits the dense MLP. */
static void check_expert_tp(report *r, const loom_plan *p) {
  const Loom__Parallel *l = p->parallel;
  const int etp = l->etp;
  if (etp <= 1) return;
  const Loom__Moe *e = experts_to_split(r, p, "etp", etp, "expert tensor parallelism");
  if (!e) return;
  if (etp != l->tp) {
    violation(r, "parallel.etp = %d: must be 1 or parallel.tp (%d): the experts split over the tp group or not at all "
              "(another size is not supported yet)", etp, l->tp);
    return;
  }
  const int ffn = e->has_ffn && e->ffn > 0 ? e->ffn : p->model->ffn;
  if (ffn % etp)
    violation(r, "parallel.etp = %d: must divide the experts' ffn (%d), each rank holding an equal slice of each; pick such "
              "an etp", etp, ffn);
  if (!l->sequence_parallel)
    violation(r, "parallel.etp = %d: the experts' rows are gathered over the tp group from its ranks' shares of the "
              "sequence; set parallel.sequence_parallel (as Megatron-Core requires)", etp);
}

/* Expert parallelism's rules (its size in bounds). */
static void check_experts(report *r, const loom_plan *p) {
  const Loom__Parallel *l = p->parallel;
  const int ep = l->ep, etp = l->etp > 1 ? l->etp : 1;
  check_expert_tp(r, p);
  if (ep <= 1) return;
  const Loom__Moe *e = experts_to_split(r, p, "ep", ep, "expert parallelism");
  if (!e) return;
  if (e->experts % ep)
    violation(r, "parallel.ep = %d: must divide model.moe.experts (%d), each rank holding as many; pick such an ep", ep,
              e->experts);
  if (etp == 1 && ((int64_t)l->tp * l->dp) % ep)
    violation(r, "parallel.ep = %d: must divide parallel.tp x parallel.dp (%d), the ranks of a stage a MoE layer regroups; "
              "pick such an ep", ep, l->tp * l->dp);
  if (etp > 1 && ((int64_t)l->tp * l->dp) % ((int64_t)ep * etp))
    violation(r, "parallel.ep = %d with parallel.etp = %d: etp x ep (%d) must divide parallel.tp x parallel.dp (%d), the "
              "ranks of a stage a MoE layer regroups, so ep divides dp; pick such an ep", ep, etp, etp * ep, l->tp * l->dp);
  if (l->tp > 1 && !l->sequence_parallel)
    violation(r, "parallel.ep = %d with parallel.tp = %d: each rank of an expert-parallel group sends its own tokens, so the "
              "tp ranks must split the sequence; set parallel.sequence_parallel (as Megatron-Core requires)", ep, l->tp);
  if (p->grad_compression && p->grad_compression->kind != LOOM__COMPRESSION_KIND__COMPRESSION_NONE)
    violation(r, "parallel.ep = %d: gradient compression does not yet cross the expert-data-parallel group; drop "
              "grad_compression or ep", ep);
}

/* Context parallelism's rules (its size in bounds). */
static void check_context(report *r, const loom_plan *p) {
  const int cp = p->parallel->cp, T = loom_plan_train_seq(p), tp = p->parallel->tp;
  const Loom__CpCommType comm = p->parallel->cp_comm_type;
  if (comm != LOOM__CP_COMM_TYPE__CP_COMM_P2P && comm != LOOM__CP_COMM_TYPE__CP_COMM_ALL_GATHER)
    violation(r, "parallel.cp_comm_type = %d: loom knows CP_COMM_P2P (0) and CP_COMM_ALL_GATHER (1)", (int)comm);
  else if (cp <= 1 && comm != LOOM__CP_COMM_TYPE__CP_COMM_P2P)
    violation(r, "parallel.cp_comm_type = all_gather: says how context parallelism exchanges keys and values, but "
              "parallel.cp is 1; set parallel.cp 2 or more, or drop cp_comm_type");
  if (cp <= 1) return;
  if (T % (2 * cp))
    violation(r, "parallel.cp = %d: the sequence (%d) must be divisible by 2 x cp (%d), each rank holding two equal chunks "
              "of it (the load-balanced causal split); pick such a seq or cp", cp, T, 2 * cp);
  else if (p->parallel->sequence_parallel && (T / cp) % tp)
    violation(r, "parallel.cp = %d with sequence parallelism: each rank's %d rows (seq / cp) must be divisible by "
              "parallel.tp (%d); pick such a seq, cp or tp", cp, T / cp, tp);
  const Loom__Moe *e = p->model->moe;
  if (e && (p->parallel->ep > 1 || p->parallel->etp > 1))
    violation(r, "parallel.cp = %d: context parallelism with the experts split (parallel.ep %d, parallel.etp %d) is not "
              "supported yet; keep every expert whole on every rank (ep 1, etp 1) or drop cp", cp,
              p->parallel->ep > 1 ? p->parallel->ep : 1, p->parallel->etp > 1 ? p->parallel->etp : 1);
  if (e && e->capacity_factor > 0.0)
    violation(r, "parallel.cp = %d: context parallelism with a capacity factor (model.moe.capacity_factor %g) is not "
              "supported yet: its ranks hold the sequence's chunks out of order, which decides the drops; run dropless "
              "(capacity_factor 0) or drop cp", cp, e->capacity_factor);
}

/* What a run computes in: fp32 or bf16, with fp8 GEMMs only beside bf16. */
static void check_precision(report *r, const loom_plan *p) {
  if (p->precision != LOOM__PRECISION__PRECISION_FP32 && p->precision != LOOM__PRECISION__PRECISION_BF16)
    violation(r, "precision = %d: a run computes in PRECISION_FP32 or PRECISION_BF16 (fp8 GEMMs are fp8 = FP8_HYBRID "
              "beside bf16)", (int)p->precision);
  if (p->grad_reduce != LOOM__PRECISION__PRECISION_FP32 && p->grad_reduce != LOOM__PRECISION__PRECISION_BF16)
    violation(r, "grad_reduce = %d: grads cross data parallelism in PRECISION_FP32 or PRECISION_BF16", (int)p->grad_reduce);
  if (p->fp8 != LOOM__FP8_FORMAT__FP8_NONE && p->fp8 != LOOM__FP8_FORMAT__FP8_HYBRID && p->fp8 != LOOM__FP8_FORMAT__FP8_E4M3)
    violation(r, "fp8 = %d: not an fp8 format (FP8_NONE, FP8_HYBRID, FP8_E4M3)", (int)p->fp8);
  else if (p->fp8 != LOOM__FP8_FORMAT__FP8_NONE && p->precision != LOOM__PRECISION__PRECISION_BF16)
    violation(r, "fp8 = %s: fp8 GEMMs run beside bf16 mixed precision (as Transformer Engine's); set precision "
              "PRECISION_BF16", p->fp8 == LOOM__FP8_FORMAT__FP8_HYBRID ? "FP8_HYBRID" : "FP8_E4M3");
  const Loom__Fp8Scaling *f = p->fp8_scaling;
  if (!f) return;
  if (p->fp8 == LOOM__FP8_FORMAT__FP8_NONE)
    violation(r, "fp8_scaling is set but fp8 = FP8_NONE: an FP8 recipe scales FP8 GEMMs; set fp8 or drop fp8_scaling");
  if (f->recipe < LOOM__FP8_RECIPE__FP8_DELAYED || f->recipe > LOOM__FP8_RECIPE__FP8_MXFP8)
    violation(r, "fp8_scaling.recipe = %d: not an FP8 recipe (FP8_DELAYED, FP8_TENSORWISE, FP8_BLOCKWISE, FP8_MXFP8)",
              (int)f->recipe);
  if (f->amax_history_len < 1 || f->amax_history_len > LOOM_FP8_MAX_HISTORY)
    violation(r, "fp8_scaling.amax_history_len = %u: delayed scaling keeps 1 to %d steps of amax", f->amax_history_len,
              LOOM_FP8_MAX_HISTORY);
  if (f->amax_compute_algo != LOOM__FP8_AMAX_ALGO__FP8_AMAX_MOST_RECENT && f->amax_compute_algo != LOOM__FP8_AMAX_ALGO__FP8_AMAX_MAX)
    violation(r, "fp8_scaling.amax_compute_algo = %d: FP8_AMAX_MOST_RECENT or FP8_AMAX_MAX", (int)f->amax_compute_algo);
  if (f->margin < 0 || f->margin > LOOM_FP8_MAX_MARGIN)
    violation(r, "fp8_scaling.margin = %d: a scale's margin is 0 to %d binades", f->margin, LOOM_FP8_MAX_MARGIN);
  if (p->model && (int64_t)f->bf16_first_layers + f->bf16_last_layers > (int64_t)p->model->layers)
    violation(r, "fp8_scaling.bf16_first_layers + bf16_last_layers = %lld: more than the model's %u layers",
              (long long)f->bf16_first_layers + f->bf16_last_layers, p->model->layers);
}

/* The overlap switches' rules. */
static void check_overlap(report *r, const loom_plan *p) {
  const Loom__Parallel *l = p->parallel;
  const loom_plan_overlap o = loom_plan_overlaps(p);
  if (o.param_gather && l->zero_stage != 1 && l->zero_stage != 2)
    violation(r, "overlap.param_gather = true: overlaps ZeRO-1/2's all-gather of the stepped weights, but "
              "parallel.zero_stage is %d%s; use zero_stage 1 or 2, or drop param_gather", l->zero_stage,
              l->zero_stage == 3 ? " (ZeRO-3 gathers each layer's weights as its forward needs them)" : "");
  else if (o.param_gather && !o.grad_reduce)
    violation(r, "overlap.param_gather = true: needs the grads reduced during backward too (as Megatron-Core requires); "
              "drop --no-overlap-grad-reduce or param_gather");
  if (!o.p2p && l->pp < 2)
    violation(r, "overlap.p2p: waiting for each pipeline send needs transfers between stages, but parallel.pp is %d; "
                 "raise parallel.pp or drop it", l->pp);
  if (!o.tp_comm) return;
  if (l->tp < 2)
    violation(r, "overlap.tp_comm = true: overlaps the tensor-parallel group's collectives, but parallel.tp is %d; raise "
              "parallel.tp or drop tp_comm", l->tp);
  else if (!l->sequence_parallel)
    violation(r, "overlap.tp_comm = true: overlaps sequence parallelism's all-gathers and reduce-scatters with their GEMMs; "
              "set parallel.sequence_parallel (as Megatron-Core requires)");
}

static void check_model(report *r, const loom_plan *p) {
  const int tp = p->parallel->tp;
  check_model_shape(r, p->model, tp);
  check_experts(r, p);
  check_context(r, p);
  check_overlap(r, p);
  check_precision(r, p);
  /* Any vocab splits over tp: the layers pad it to a multiple of 128 x tp. */
  if (p->parallel->sequence_parallel && loom_plan_train_seq(p) % tp)
    violation(r, "model.seq = %d: must be divisible by parallel.tp (%d) under sequence parallelism; pick seq or tp to divide",
              loom_plan_train_seq(p), tp);
}

static void check_stages(report *r, const loom_plan *p) {
  const int pp = p->parallel->pp, vpp = p->parallel->virtual_chunks, S = pp * vpp;
  if ((int)p->n_stages != S) {
    violation(r, "stages: %zu entries, but parallel.pp x parallel.virtual_chunks = %d; give one stage per pipeline rank and chunk",
              p->n_stages, S);
    return;
  }
  int *seen = loom_xcalloc((size_t)S, sizeof(int), "stage check");
  const Loom__Stage **at = loom_xcalloc((size_t)S, sizeof *at, "stage check"); /* by virtual stage */
  for (size_t k = 0; k < p->n_stages; k++) {
    const Loom__Stage *s = p->stages[k];
    if (s->pp_rank < 0 || s->pp_rank >= pp || s->chunk < 0 || s->chunk >= vpp) {
      violation(r, "stages[%zu]: pp_rank %d chunk %d is outside pp %d x chunks %d", k, s->pp_rank, s->chunk, pp, vpp);
      continue;
    }
    const int v = loom_plan_stage_index(p, s->pp_rank, s->chunk);
    seen[v]++;
    at[v] = s;
  }
  for (int v = 0; v < S; v++) {
    int rank, chunk;
    loom_stage_place(loom_schedule_kind_v_shape(p->schedule), pp, v, &rank, &chunk);
    if (seen[v] != 1)
      violation(r, "stages: pp_rank %d chunk %d appears %d times; every rank and chunk needs exactly one stage", rank,
                chunk, seen[v]);
  }
  free(seen);
  /* In virtual stage order the ranges must tile [0, layers). */
  int next = 0;
  for (int v = 0; v < S && r->count == 0; v++) {
    const Loom__Stage *s = at[v];
    if (s->layer_begin != next || s->layer_end < s->layer_begin)
      violation(r, "stages (pp_rank %d chunk %d): layers [%d, %d) should start at %d; every layer must be covered exactly once, in order",
                s->pp_rank, s->chunk, s->layer_begin, s->layer_end, next);
    next = s->layer_end;
    if (s->embedding != (v == 0))
      violation(r, "stages (pp_rank %d chunk %d): embedding = %s; only the first stage holds the embedding", s->pp_rank,
                s->chunk, s->embedding ? "true" : "false");
    if (s->head != (v == S - 1))
      violation(r, "stages (pp_rank %d chunk %d): head = %s; only the last stage holds the head", s->pp_rank, s->chunk,
                s->head ? "true" : "false");
  }
  const int blocks = p->model->layers + p->model->mtp_num_layers;
  if (r->count == 0 && next != blocks)
    violation(r, "stages: cover layers [0, %d) but model.layers = %d%s; every layer must be covered exactly once", next,
              p->model->layers, p->model->mtp_num_layers ? " and its MTP modules after them" : "");
  for (int v = 0; v + 1 < S && r->count == 0; v++)
    if (at[v]->layer_end > p->model->layers)
      violation(r, "stages (pp_rank %d chunk %d): layers [%d, %d) hold MTP modules (layers %d on), which live on the "
                "last stage with the head; end this stage by layer %d", at[v]->pp_rank, at[v]->chunk, at[v]->layer_begin,
                at[v]->layer_end, p->model->layers, p->model->layers);
  free(at);
}

static void check_compression(report *r, const loom_plan *p) {
  const Loom__GradCompression *c = p->grad_compression;
  if (!c) return;
  if (c->kind == LOOM__COMPRESSION_KIND__COMPRESSION_NONE) {
    if (c->rank != 0)
      violation(r, "grad_compression.rank = %d: only COMPRESSION_POWERSGD has a rank; remove it or set the kind", c->rank);
    return;
  }
  const bool powersgd = c->kind == LOOM__COMPRESSION_KIND__COMPRESSION_POWERSGD;
  if (!powersgd && c->kind != LOOM__COMPRESSION_KIND__COMPRESSION_SIGN) {
    violation(r, "grad_compression.kind = %d: loom knows COMPRESSION_NONE (0), COMPRESSION_POWERSGD (1) and "
              "COMPRESSION_SIGN (2)", (int)c->kind);
    return;
  }
  if (powersgd && (c->rank < 1 || c->rank > LOOM_PLAN_MAX_COMPRESSION_RANK))
    violation(r, "grad_compression = powersgd:%d: PowerSGD's rank must be 1 to %d (4 is a common choice)", c->rank,
              LOOM_PLAN_MAX_COMPRESSION_RANK);
  if (!powersgd && c->rank != 0)
    violation(r, "grad_compression.rank = %d: only COMPRESSION_POWERSGD has a rank; remove it for COMPRESSION_SIGN",
              c->rank);
  const char *name = powersgd ? "powersgd" : "sign";
  if (loom_plan_grad_replicas(p) < 2)
    violation(r, "grad_compression = %s: parallel.dp x parallel.cp is %d, so no grads cross data parallelism to compress; "
              "raise parallel.dp or drop grad_compression", name, loom_plan_grad_replicas(p));
  if (p->grad_reduce != LOOM__PRECISION__PRECISION_FP32)
    violation(r, "grad_compression = %s: compression decides what crosses; set grad_reduce PRECISION_FP32 or drop "
              "grad_compression", name);
  if (p->parallel->zero_stage >= 2)
    violation(r, "grad_compression = %s: compression sums whole grads, which ZeRO-%d never holds; use "
              "parallel.zero_stage 0 or 1, or drop grad_compression", name, p->parallel->zero_stage);
}

static void check_batch(report *r, const loom_plan *p) {
  char why[256];
  const Loom__Batch *b = p->batch;
  const int dp = p->parallel->dp, pp = p->parallel->pp;
  if (b->global_batch % (b->micro_batch * dp))
    violation(r, "batch.global_batch = %d: must be a positive multiple of batch.micro_batch x parallel.dp (%d); round it to a multiple",
              b->global_batch, b->micro_batch * dp);

  if (!loom_schedule_kind_trains(p->schedule))
    violation(r, "schedule = %s: evaluation's schedule cannot train; use 1f1b, gpipe, interleaved, zb_h1 or zb_v",
              loom_schedule_kind_name(p->schedule));
  if (loom_schedule_kind_splits_backward(p->schedule) && p->parallel->zero_stage >= 2)
    violation(r, "schedule = %s with parallel.zero_stage = %d: ZeRO-2/3 reduce-scatter each layer's grads as its "
                 "backward ends, but zero-bubble schedules run a layer's weight grads long after; use parallel.zero_stage = 0 "
                 "or 1, or schedule = 1f1b", loom_schedule_kind_name(p->schedule), p->parallel->zero_stage);
  if (b->has_seq && (b->seq < 1 || b->seq > p->model->seq))
    violation(r, "batch.seq = %d: the training sequence must be 1 to model.seq (%d)", b->seq, p->model->seq);
  if (p->parallel->virtual_chunks > 1 && pp == 1)
    violation(r, "parallel.virtual_chunks = %d: needs parallel.pp 2 or more; with one pipeline rank its chunks would only pass activations to themselves",
              p->parallel->virtual_chunks);
  /* Transfers are tagged (micro-batch, destination chunk, kind): MPI guarantees tags up to 32767. */
  if ((long long)loom_plan_micro_batches(p) * p->parallel->virtual_chunks > LOOM_PLAN_MAX_MICRO_BATCHES)
    violation(r, "batch.global_batch = %d: %d micro-batches x %d chunks per rank is too many for MPI tags (at most %d); raise batch.micro_batch",
              b->global_batch, loom_plan_micro_batches(p), p->parallel->virtual_chunks, LOOM_PLAN_MAX_MICRO_BATCHES);
  if (p->parallel->zero_stage < 0 || p->parallel->zero_stage > 3)
    violation(r, "parallel.zero_stage = %d: ZeRO stages are 0 (none) to 3", p->parallel->zero_stage);
  if (p->grad_reduce == LOOM__PRECISION__PRECISION_BF16 && p->parallel->zero_stage == 1 && p->parallel->ep > 1)
    violation(r, "grad_reduce = PRECISION_BF16: ZeRO-1 with the experts apart (parallel.ep = %d) reduce-scatters bucket "
                 "by bucket in fp32 in this loom; set grad_reduce PRECISION_FP32, parallel.zero_stage 0, or ep 1",
              p->parallel->ep);
  check_compression(r, p);
  for (size_t k = 1; k < p->n_stages; k++)
    if (p->stages[k]->recompute != p->stages[0]->recompute) {
      violation(r, "stages: stages disagree on recompute; this loom recomputes all stages or none");
      break;
    }
  for (size_t k = 0; k < p->n_stages; k++) {
    const Loom__Stage *s = p->stages[k];
    if (s->has_recompute_group && (!s->recompute || s->recompute_group < 1))
      violation(r, "stages[%zu].recompute_group = %d: layers per recomputed group, 1 or more, with recompute on", k,
                s->recompute_group);
    else if (s->has_recompute_group && s->recompute_group > 1 && s->has_recompute_layers)
      violation(r, "stages[%zu]: recompute_layers and recompute_group are Megatron-LM's block and uniform methods; give "
                "one of them", k);
    else if (s->has_recompute_group && s->recompute_group > 1 && p->parallel->zero_stage == 3)
      violation(r, "stages[%zu].recompute_group = %d with parallel.zero_stage = 3: ZeRO-3 gathers one layer's weights at a "
                "time, and recomputing a group of layers needs all of theirs; use groups of 1", k, s->recompute_group);
    if (!s->has_recompute_layers) continue;
    if (!s->recompute)
      violation(r, "stages[%zu].recompute_layers = %d: says how many layers recompute, but the stage has recompute off", k,
                s->recompute_layers);
    else if (s->recompute_layers < 1 || s->recompute_layers > s->layer_end - s->layer_begin)
      violation(r, "stages[%zu].recompute_layers = %d: must be 1 to the stage's %d layers (its first ones recompute)", k,
                s->recompute_layers, s->layer_end - s->layer_begin);
  }
  /* The schedule's own rules, in its words; the micro-batches are the batch's. */
  const int m = loom_plan_micro_batches(p), per = b->micro_batch * dp;
  if (b->global_batch % per == 0 && protobuf_c_enum_descriptor_get_value(&loom__schedule_kind__descriptor, p->schedule) &&
      loom_schedule_shape_problem(p->schedule, pp, p->parallel->virtual_chunks, m, why, sizeof why)) {
    if (strncmp(why, "micro-batches", 13) == 0)
      violation(r, "%s (batch.global_batch = %d over batch.micro_batch x parallel.dp = %d); use batch.global_batch = %d", why,
                b->global_batch, per, (m + pp - 1) / pp * pp * per);
    else violation(r, "%s", why);
  }
}

static void check_size(report *r, const char *field, int64_t value, int64_t min, int64_t max) {
  if (value < min || value > max)
    violation(r, "%s = %lld: must be %lld to %lld", field, (long long)value, (long long)min, (long long)max);
}

static void check_product(report *r, const char *product, int64_t value, int64_t max) {
  if (value > max) violation(r, "%s = %lld: must be at most %lld", product, (long long)value, (long long)max);
}

/* Each size within its bounds, then each product the runtime forms within
 * its type, all in 64 bits. */
static int check_sizes(report *r, const Loom__Model *m, const Loom__Parallel *l, const Loom__Batch *b) {
  const int before = r->count;
  if (m) {
    check_size(r, "model.layers", m->layers, 1, LOOM_PLAN_MAX_LAYERS);
    check_size(r, "model.hidden", m->hidden, 1, LOOM_PLAN_MAX_HIDDEN);
    check_size(r, "model.heads", m->heads, 1, LOOM_PLAN_MAX_HEADS);
    check_size(r, "model.ffn", m->ffn, 0, LOOM_PLAN_MAX_FFN);
    check_size(r, "model.vocab", m->vocab, 2, LOOM_PLAN_MAX_VOCAB);
    check_size(r, "model.seq", m->seq, 1, LOOM_PLAN_MAX_SEQ);
    if (m->has_kv_heads) check_size(r, "model.kv_heads", m->kv_heads, 1, LOOM_PLAN_MAX_HEADS);
    check_size(r, "model.norm", (int)m->norm, 0, LOOM__NORM__NORM_RMSNORM);
    check_size(r, "model.mlp", (int)m->mlp, 0, LOOM__MLP__MLP_SWIGLU);
    check_size(r, "model.position", (int)m->position, 0, LOOM__POSITION__POSITION_ROPE);
    /* A head's width: the widths every backend's attention takes (LOOM_ATTN_MAX_HEAD_DIM: flash attention's). */
    if (m->has_kv_channels) check_size(r, "model.kv_channels", m->kv_channels, 1, LOOM_ATTN_MAX_HEAD_DIM);
    check_size(r, "model.softmax_type", (int)m->softmax_type, 0, LOOM__SOFTMAX_TYPE__SOFTMAX_LEARNABLE);
    if (m->has_window_size) check_size(r, "model.window_size", m->window_size, 1, LOOM_PLAN_MAX_SEQ);
    if (m->has_mtp_num_layers) /* the blocks after the layers within the table's bound */
      check_size(r, "model.mtp_num_layers", m->mtp_num_layers, 0, m->layers < LOOM_PLAN_MAX_LAYERS ? LOOM_PLAN_MAX_LAYERS - m->layers : 0);
    if (m->mla) { /* a q or k head: its two parts together within what the attention takes */
      check_size(r, "model.mla.q_lora_rank", m->mla->q_lora_rank, 0, LOOM_PLAN_MAX_HIDDEN);
      check_size(r, "model.mla.kv_lora_rank", m->mla->kv_lora_rank, 1, LOOM_PLAN_MAX_HIDDEN);
      check_size(r, "model.mla.qk_head_dim", m->mla->qk_head_dim, 1, LOOM_ATTN_MAX_HEAD_DIM);
      check_size(r, "model.mla.qk_pos_emb_head_dim", m->mla->qk_pos_emb_head_dim, 2,
                 LOOM_ATTN_MAX_HEAD_DIM - (m->mla->qk_head_dim > 0 ? m->mla->qk_head_dim : 0));
      check_size(r, "model.mla.v_head_dim", m->mla->v_head_dim, 1, LOOM_ATTN_MAX_HEAD_DIM);
    }
    if (m->moe) {
      check_size(r, "model.moe.experts", m->moe->experts, 1, LOOM_PLAN_MAX_EXPERTS);
      check_size(r, "model.moe.topk", m->moe->topk, 1, LOOM_PLAN_MAX_EXPERTS);
      check_size(r, "model.moe.ffn", m->moe->ffn, 0, LOOM_PLAN_MAX_FFN);
      check_size(r, "model.moe.shared_ffn", m->moe->shared_ffn, 0, LOOM_PLAN_MAX_FFN);
      check_size(r, "model.moe.score", (int)m->moe->score, 0, LOOM__MOE_SCORE__MOE_SCORE_SIGMOID);
    }
  }
  if (l) {
    check_size(r, "parallel.tp", l->tp, 1, LOOM_PLAN_MAX_TP);
    check_size(r, "parallel.pp", l->pp, 1, LOOM_PLAN_MAX_PP);
    check_size(r, "parallel.dp", l->dp, 1, LOOM_PLAN_MAX_DP);
    check_size(r, "parallel.virtual_chunks", l->virtual_chunks, 1, LOOM_PLAN_MAX_CHUNKS);
    check_size(r, "parallel.ep", l->ep, 1, LOOM_PLAN_MAX_EXPERTS);
    check_size(r, "parallel.etp", l->etp, 1, LOOM_PLAN_MAX_TP);
    check_size(r, "parallel.cp", l->cp, 1, LOOM_PLAN_MAX_CP);
  }
  if (b) {
    check_size(r, "batch.micro_batch", b->micro_batch, 1, LOOM_PLAN_MAX_MICRO_BATCH);
    check_size(r, "batch.global_batch", b->global_batch, 1, LOOM_PLAN_MAX_GLOBAL_BATCH);
  }
  if (r->count > before) return r->count - before;
  if (l) {
    check_product(r, "parallel.tp x parallel.cp x parallel.dp x parallel.pp", (int64_t)l->tp * l->cp * l->dp * l->pp, INT_MAX);
    check_product(r, "parallel.pp x parallel.virtual_chunks", (int64_t)l->pp * l->virtual_chunks, LOOM_PLAN_MAX_STAGES);
  }
  if (l && b) check_product(r, "batch.micro_batch x parallel.dp", (int64_t)b->micro_batch * l->dp, LOOM_PLAN_MAX_GLOBAL_BATCH);
  if (m && b) check_product(r, "batch.micro_batch x model.seq", (int64_t)b->micro_batch * m->seq, INT_MAX);
  if (m && b && m->moe) /* the rows the experts take: every token's choices */
    check_product(r, "batch.micro_batch x model.seq x model.moe.topk", (int64_t)b->micro_batch * m->seq * m->moe->topk, INT_MAX);
  return r->count - before;
}

int loom_plan_check_sizes(const Loom__Model *model, const Loom__Parallel *parallel, const Loom__Batch *batch, char *lines,
                          size_t cap) {
  report r = {.out = lines, .cap = cap};
  if (lines && cap) lines[0] = '\0';
  return check_sizes(&r, model, parallel, batch);
}

int loom_plan_check_model(const Loom__Model *model, char *lines, size_t cap) {
  report r = {.out = lines, .cap = cap};
  if (lines && cap) lines[0] = '\0';
  if (check_sizes(&r, model, NULL, NULL) == 0) check_model_shape(&r, model, 1);
  return r.count;
}

/* The plan's cluster block, when it has one: every figure given is a count or a finite positive number. */
static void check_cluster(report *r, const Loom__Cluster *c) {
  if (!c) return;
  if (c->has_nodes) check_size(r, "cluster.nodes", c->nodes, 1, INT_MAX);
  if (c->has_devices_per_node) check_size(r, "cluster.devices_per_node", c->devices_per_node, 1, LOOM_PLAN_MAX_DEVICES_PER_NODE);
  if (c->has_device_memory_bytes) check_size(r, "cluster.device_memory_bytes", c->device_memory_bytes, 1, INT64_MAX);
  const struct {
    bool has;
    double value;
    const char *name;
  } figures[] = {{c->has_intra_node_gbps, c->intra_node_gbps, "cluster.intra_node_gbps"},
                 {c->has_inter_node_gbps, c->inter_node_gbps, "cluster.inter_node_gbps"},
                 {c->has_intra_node_latency_us, c->intra_node_latency_us, "cluster.intra_node_latency_us"},
                 {c->has_inter_node_latency_us, c->inter_node_latency_us, "cluster.inter_node_latency_us"}};
  for (size_t i = 0; i < sizeof figures / sizeof figures[0]; i++)
    if (figures[i].has && !(isfinite(figures[i].value) && figures[i].value > 0))
      violation(r, "%s = %g: must be a finite number above 0", figures[i].name, figures[i].value);
}

int loom_plan_check_rules(const loom_plan *p, int world, int64_t device_memory, char *lines, size_t cap) {
  report r = {.out = lines, .cap = cap};
  if (lines && cap) lines[0] = '\0';
  if (!p->model || !p->parallel || !p->batch) {
    violation(&r, "plan: model, parallel and batch are all required");
    return r.count;
  }
  const Loom__Parallel *l = p->parallel;
  if (check_sizes(&r, p->model, p->parallel, p->batch)) return r.count; /* the other rules take sizes that fit */
  check_model(&r, p);
  check_batch(&r, p);
  check_stages(&r, p);
  check_cluster(&r, p->cluster);
  const long long ranks = (long long)loom_plan_ranks(p);
  char cp[32] = "";
  if (l->cp > 1) snprintf(cp, sizeof cp, " x cp %d", l->cp);
  if (world > 0 && ranks != world)
    violation(&r, "parallel: tp %d x pp %d x dp %d%s = %lld ranks, but the world has %d; launch %lld ranks or change the layout",
              l->tp, l->pp, l->dp, cp, ranks, world, ranks);
  if (device_memory > 0 && r.count == 0) {
    int64_t *need = loom_xcalloc((size_t)l->pp, sizeof *need, "memory check"), *acts = loom_xcalloc((size_t)l->pp, sizeof *acts, "memory check");
    for (int q = 0; q < l->pp; q++) need[q] = loom_plan_rank_bytes(p, q, &acts[q]);
    for (int q = 0; q < l->pp; q++) {
      char a[32], b[32], chunks[32] = " chunk 0";
      if (l->virtual_chunks > 1) snprintf(chunks, sizeof chunks, ", its %d chunks", l->virtual_chunks);
      if (need[q] > device_memory)
        violation(&r, "stages (pp_rank %d%s): needs %s per rank, over the device's %s; %s", q, chunks,
                  human_bytes((double)need[q], a, sizeof a), human_bytes((double)device_memory, b, sizeof b),
                  2 * acts[q] > need[q] ? "activations take most of it: turn on recompute, or lower batch.micro_batch or model.seq"
                                        : "weights, grads and Adam state take most of it: raise tp or pp, or a ZeRO stage over dp");
    }
    free(need);
    free(acts);
  }
  return r.count;
}

static void check_host_memory(report *r, const loom_plan *p, const loom_plan_limits *lim) {
  double most = 0.0, state = 0.0, acts = 0.0;
  for (int rank = 0; rank < p->parallel->pp; rank++) { /* the memory model's, each rank's */
    int64_t ac;
    const double all = (double)loom_plan_rank_bytes(p, rank, &ac);
    if (all > most) most = all, state = all - (double)ac, acts = (double)ac;
  }
  const int ranks = lim->host_ranks > 0 ? lim->host_ranks : 1;
  const double need = most * ranks;
  if (need <= (double)lim->host_memory) return;
  char total[32], one[32], st[32], ac[32], have[32];
  human_bytes(need, total, sizeof total);
  human_bytes(most, one, sizeof one);
  human_bytes(state * ranks, st, sizeof st);
  human_bytes(acts * ranks, ac, sizeof ac);
  human_bytes((double)lim->host_memory, have, sizeof have);
  /* The advice follows the larger term: the batch and sequence set the activations, the layout the state. */
  if (acts >= state)
    violation(r, "batch.micro_batch = %d: this run needs %s on this host (%d ranks of %s: activations for seq %d %s, fp32 "
              "weights, grads and Adam state %s) but %s is available; lower batch.micro_batch or model.seq",
              p->batch->micro_batch, total, ranks, one, loom_plan_train_seq(p), ac, st, have);
  else
    violation(r, "parallel.tp = %d: this run needs %s on this host (%d ranks of %s: fp32 weights, grads and Adam state %s, "
              "activations %s) but %s is available; the model's state dominates: spread it over more ranks (tp or pp), "
              "shard Adam with zero_stage 1 over dp, or use a machine with more memory",
              p->parallel->tp, total, ranks, one, st, ac, have);
}

int loom_plan_validate(const loom_plan *p, const loom_plan_limits *lim, char *lines, size_t cap) {
  const int bad = loom_plan_check_rules(p, lim->world, lim->device_memory, lines, cap);
  if (bad) return bad;
  report r = {.out = lines, .cap = cap};
  loom_schedule s;
  loom_error err = {0};
  if (loom_plan_schedule(p, &s, &err) != LOOM_OK) {
    violation(&r, "schedule: %s", err.msg);
    return r.count;
  }
  loom_schedule_report rep;
  if (loom_schedule_verify(&s, &rep) != LOOM_OK) violation(&r, "schedule: %s", rep.why);
  loom_schedule_report_free(&rep);
  if (r.count == 0 && lim->host_memory > 0) check_host_memory(&r, p, lim);
  loom_schedule_free(&s);
  return r.count;
}

loom_status loom_plan_refuse(const loom_plan *p, const loom_plan_limits *lim, loom_error *err) {
  char lines[4096];
  if (loom_plan_validate(p, lim, lines, sizeof lines) == 0) return LOOM_OK;
  char *nl = strchr(lines, '\n');
  if (nl) *nl = '\0';
  return loom_fail(err, LOOM_ERR_USAGE, "%s", lines);
}
