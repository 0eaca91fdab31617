/* Plan building, balancing, estimates and rules. */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "layers/gpt.h"
#include "plan/grad_compression.h"
#include "plan/memory.h"
#include "plan/plan.h"
#include "schedule/verify.h"

/* The model's enums and the plan's are one list each, bridged by the casts below. */
_Static_assert(LOOM_NORM_LAYERNORM == (int)LOOM__NORM__NORM_LAYERNORM && LOOM_NORM_RMSNORM == (int)LOOM__NORM__NORM_RMSNORM,
               "loom_norm_kind follows loom.proto's Norm");
_Static_assert(LOOM_MLP_GELU == (int)LOOM__MLP__MLP_GELU && LOOM_MLP_SWIGLU == (int)LOOM__MLP__MLP_SWIGLU,
               "loom_mlp_kind follows loom.proto's Mlp");
_Static_assert(LOOM_POSITION_LEARNED == (int)LOOM__POSITION__POSITION_LEARNED &&
                   LOOM_POSITION_ROPE == (int)LOOM__POSITION__POSITION_ROPE,
               "loom_position_kind follows loom.proto's Position");

void loom_model_proto_config(const Loom__Model *m, loom_gpt_config *cfg) {
  *cfg = (loom_gpt_config){.layers = m->layers, .hidden = m->hidden, .heads = m->heads, .ffn = m->ffn,
                           .kv_heads = m->has_kv_heads ? m->kv_heads : 0, .vocab = m->vocab, .seq = m->seq,
                           .dropout = m->dropout, .norm_eps = m->norm_eps, .norm = (loom_norm_kind)m->norm,
                           .mlp = (loom_mlp_kind)m->mlp, .position = (loom_position_kind)m->position,
                           .rope_theta = m->rope_theta, .no_bias = !m->bias, .untied = !m->tied_embeddings};
  loom_gpt_config_finish(cfg);
}

void loom_model_proto_fill(Loom__Model *m, const loom_gpt_config *c) {
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
  if (m->has_rope_theta) m->rope_theta = c->rope_theta > 0.0f ? c->rope_theta : LOOM_ROPE_THETA_DEFAULT;
  m->has_bias = c->no_bias;
  m->bias = !c->no_bias;
  m->has_tied_embeddings = c->untied;
  m->tied_embeddings = !c->untied;
}

void loom_plan_model_config(const loom_plan *p, loom_gpt_config *cfg) {
  loom_model_proto_config(p->model, cfg);
  cfg->bf16 = p->precision == LOOM__PRECISION__PRECISION_BF16;
}

/* A size as a person reads it: GiB, MiB or KiB, never "0.0 GiB". */
static const char *human_bytes(double bytes, char *buf, size_t n) {
  if (bytes >= 0.95 * 1073741824.0) snprintf(buf, n, "%.1f GiB", bytes / 1073741824.0);
  else if (bytes >= 0.95 * 1048576.0) snprintf(buf, n, "%.1f MiB", bytes / 1048576.0);
  else snprintf(buf, n, "%.0f KiB", bytes / 1024.0);
  return buf;
}

loom_status loom_plan_schedule(const loom_plan *p, loom_schedule *s, loom_error *err) {
  const loom_status st = loom_schedule_build(s, p->schedule, p->parallel->pp, p->parallel->virtual_chunks,
                                             loom_plan_micro_batches(p), err);
  if (st == LOOM_OK && p->model->has_tied_embeddings && !p->model->tied_embeddings) loom_schedule_untie(s);
  return st;
}

int loom_plan_train_seq(const loom_plan *p) { return p->batch->has_seq ? p->batch->seq : p->model->seq; }

int64_t loom_plan_total_parameters(const loom_plan *p) {
  loom_gpt_config cfg;
  loom_plan_model_config(p, &cfg);
  return (int64_t)loom_gpt_param_count(&cfg, NULL, 1);
}

bool loom_plan_recompute(const loom_plan *p) { return p->n_stages > 0 && p->stages[0]->recompute; }

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

/* ---- building ---- */

static Loom__Stage *new_stage(int pp_rank, int chunk, int begin, int end, bool first, bool last, bool recompute) {
  Loom__Stage *s = loom_xmalloc(sizeof *s, "plan stage");
  loom__stage__init(s);
  s->has_pp_rank = s->has_chunk = s->has_layer_begin = s->has_layer_end = 1;
  s->pp_rank = pp_rank;
  s->chunk = chunk;
  s->layer_begin = begin;
  s->layer_end = end;
  s->has_embedding = s->has_head = s->has_recompute = 1;
  s->embedding = first;
  s->head = last;
  s->recompute = recompute;
  return s;
}

/* Layers per virtual stage so that each stage's load is as even as can be:
 * every layer costs `layer`, stage 0 also carries `first`, the last `last`. */
static void balance(int layers, int stages, double layer, double first, double last, int *counts) {
  if (stages == 1) {
    counts[0] = layers;
    return;
  }
  const double target = (first + last + layers * layer) / stages;
  int n0 = (int)lround((target - first) / layer), nl = (int)lround((target - last) / layer);
  n0 = n0 < 0 ? 0 : n0 > layers ? layers : n0;
  nl = nl < 0 ? 0 : nl > layers - n0 ? layers - n0 : nl;
  const int middle = stages - 2, rest = layers - n0 - nl;
  if (middle == 0) nl += rest; /* two stages: the last takes what is left */
  counts[0] = n0;
  counts[stages - 1] = nl;
  for (int s = 1; s <= middle; s++) counts[s] = rest / middle + (s - 1 < rest % middle);
}

loom_status loom_plan_build(const loom_plan_spec *sp, loom_plan **out, loom_error *err) {
  *out = NULL;
  loom_plan *p = loom_xmalloc(sizeof *p, "plan");
  loom__partition_plan__init(p);
  p->has_format_version = 1;
  p->format_version = LOOM_PLAN_FORMAT_VERSION;
  if (sp->name) p->name = strdup(sp->name);
  p->model = loom_xmalloc(sizeof *p->model, "plan model");
  loom__model__init(p->model);
  loom_model_proto_fill(p->model, &sp->model);
  p->parallel = loom_xmalloc(sizeof *p->parallel, "plan layout");
  loom__parallel__init(p->parallel);
  Loom__Parallel *l = p->parallel;
  l->has_tp = l->has_pp = l->has_dp = l->has_virtual_chunks = 1;
  l->tp = sp->tp;
  l->pp = sp->pp;
  l->dp = sp->dp;
  l->virtual_chunks = sp->vpp;
  l->has_sequence_parallel = sp->sequence_parallel;
  l->sequence_parallel = sp->sequence_parallel;
  l->has_zero_stage = sp->zero_stage != 0;
  l->zero_stage = sp->zero_stage;
  p->batch = loom_xmalloc(sizeof *p->batch, "plan batch");
  loom__batch__init(p->batch);
  p->batch->has_micro_batch = p->batch->has_global_batch = 1;
  p->batch->micro_batch = sp->micro_batch;
  p->batch->global_batch = sp->global_batch;
  p->batch->has_seq = sp->train_seq > 0 && sp->train_seq != sp->model.seq;
  p->batch->seq = p->batch->has_seq ? sp->train_seq : 0;
  p->has_schedule = 1;
  p->schedule = sp->schedule;
  p->has_balance = 1;
  p->balance = sp->balance;
  p->has_precision = sp->precision != LOOM__PRECISION__PRECISION_FP32;
  p->precision = sp->precision;
  p->has_grad_reduce = sp->grad_reduce != LOOM__PRECISION__PRECISION_FP32;
  p->grad_reduce = sp->grad_reduce;
  if (sp->compression != LOOM__COMPRESSION_KIND__COMPRESSION_NONE || sp->compression_rank != 0) {
    p->grad_compression = loom_xmalloc(sizeof *p->grad_compression, "plan grad compression");
    loom__grad_compression__init(p->grad_compression);
    p->grad_compression->has_kind = p->grad_compression->has_rank = 1;
    p->grad_compression->kind = sp->compression;
    p->grad_compression->rank = sp->compression_rank;
  }
  /* Stages: an explicit split, or balanced by the chosen measure. */
  const int S = sp->pp * sp->vpp;
  if (S < 1 || S > LOOM_PLAN_MAX_STAGES) {
    loom_plan_free(p);
    return loom_fail(err, LOOM_ERR_USAGE, "parallel.pp x parallel.virtual_chunks = %d stages is out of range (1 to %d)", S,
                     LOOM_PLAN_MAX_STAGES);
  }
  int *counts = loom_xmalloc((size_t)S * sizeof(int), "layer counts");
  if (sp->layer_counts) {
    if (sp->nlayer_counts != S) {
      free(counts);
      loom_plan_free(p);
      return loom_fail(err, LOOM_ERR_USAGE, "stages: the layer split has %d entries but there are %d stages "
                       "(parallel.pp x parallel.virtual_chunks); give one count per stage", sp->nlayer_counts, S);
    }
    memcpy(counts, sp->layer_counts, (size_t)S * sizeof(int));
  } else if (sp->balance == LOOM__BALANCE__BALANCE_UNIFORM) {
    /* The one even split: earlier stages take the remainder. */
    for (int v = 0; v < S; v++) counts[v] = p->model->layers / S + (v < p->model->layers % S);
  } else {
    /* Sizes and FLOPs of a layer and of the edges, from the layers' table and FLOPs count. */
    loom_gpt_config cfg;
    loom_plan_model_config(p, &cfg);
    const loom_stage_range one = {.layer_begin = 0, .layer_end = 1}, head = {.last = true}, embed = {.first = true};
    double layer = 1.0, first = 0.0, last = 0.0;
    if (sp->balance == LOOM__BALANCE__BALANCE_PARAMS) {
      layer = (double)loom_gpt_param_count(&cfg, &one, 1);
      first = (double)loom_gpt_param_count(&cfg, &embed, 1);
      last = (double)loom_gpt_param_count(&cfg, &head, 1); /* the final norm and the head (the tied copy of wte) */
    } else if (sp->balance == LOOM__BALANCE__BALANCE_COMPUTE) {
      layer = loom_gpt_stage_train_flops(&cfg, &one, cfg.seq, 1.0, LOOM_FLOPS_MEGATRON);
      last = loom_gpt_stage_train_flops(&cfg, &head, cfg.seq, 1.0, LOOM_FLOPS_MEGATRON); /* the LM head's matmul */
    }
    balance(p->model->layers, S, layer, first, last, counts);
  }
  p->n_stages = (size_t)S;
  p->stages = loom_xcalloc((size_t)S, sizeof *p->stages, "plan stages");
  int begin = 0;
  for (int v = 0; v < S; v++) {
    int rank, chunk;
    loom_stage_place(loom_schedule_kind_v_shape(sp->schedule), sp->pp, v, &rank, &chunk);
    p->stages[v] = new_stage(rank, chunk, begin, begin + counts[v], v == 0, v == S - 1, sp->recompute);
    begin += counts[v];
  }
  free(counts);
  loom_plan_estimate(p);
  *out = p;
  return LOOM_OK;
}

/* ---- estimates ---- */

/* Bytes one rank sends over dp per step for a stage that costs c, as ring
 * collectives move them (of a buffer of B bytes, an all-reduce sends
 * 2 (d-1)/d B, a reduce-scatter or all-gather (d-1)/d B; an all-gather of a
 * B-byte message from each rank, (d-1) B): the grads' all-reduce (in the
 * grad_reduce type), or ZeRO-1's fp32 reduce-scatter, or compression's
 * collectives; plus ZeRO-1's all-gather of the weights (bf16 in bf16 runs).
 * 0 at dp 1. In units of the fp32 shard (4 bytes per local parameter),
 * plain data parallelism is 2 (d-1)/d: DeepSpeed's "2 Psi" for large d. */
static double dp_bytes_sent(const loom_plan *p, const loom_compression_cost *c, const loom_stage_range *range) {
  const double d = p->parallel->dp;
  if (d < 2) return 0.0;
  const double share = (d - 1.0) / d; /* of a buffer each rank sends in a ring reduce-scatter or all-gather */
  const double weight = p->precision == LOOM__PRECISION__PRECISION_BF16 ? 2.0 : 4.0; /* bytes a gathered weight takes */
  const double m = loom_plan_micro_batches(p);
  const int zero = p->parallel->zero_stage;
  const loom_compression gc = loom_plan_compression(p);
  double bytes;
  if (gc.kind == LOOM__COMPRESSION_KIND__COMPRESSION_POWERSGD) /* all-reduces of the factors and of what crosses whole */
    bytes = 2.0 * share * 4.0 * c->sent_words;
  else if (gc.kind == LOOM__COMPRESSION_KIND__COMPRESSION_SIGN) /* the messages all-gathered, the rest all-reduced */
    bytes = (d - 1.0) * 4.0 * c->message_words + 2.0 * share * 4.0 * (c->sent_words - c->message_words);
  else if (zero >= 2) /* ZeRO-2/3 reduce-scatter fp32 grads after every micro-batch's backward */
    bytes = m * share * 4.0 * c->whole_words;
  else if (zero == 1) /* ZeRO-1 reduce-scatters fp32 grads once */
    bytes = share * 4.0 * c->whole_words;
  else
    bytes = 2.0 * share * (p->grad_reduce == LOOM__PRECISION__PRECISION_BF16 ? 2.0 : 4.0) * c->whole_words;
  if (zero == 1 || zero == 2) /* and all-gather the updated weights, in bf16 as the distributed optimizer */
    bytes += share * weight * c->whole_words;
  if (zero == 3) { /* every micro-batch gathers the weights for its forward, and again for its backward but the
                    * edges, which only the head's stage needs then */
    const double edges = range->last ? 0.0 : (double)loom_plan_zero_buckets(p, range).edges;
    bytes += m * share * weight * (2.0 * c->whole_words - edges);
  }
  return bytes;
}

void loom_plan_estimate(loom_plan *p) {
  if (p->estimates) loom__estimates__free_unpacked(p->estimates, NULL);
  p->estimates = loom_xmalloc(sizeof *p->estimates, "plan estimates");
  loom__estimates__init(p->estimates);
  Loom__Estimates *e = p->estimates;
  const Loom__Parallel *l = p->parallel;
  const int tp = l->tp, dp = l->dp, pp = l->pp, vpp = l->virtual_chunks, mb = loom_plan_micro_batches(p);
  loom_gpt_config cfg;
  loom_plan_model_config(p, &cfg);
  e->has_total_parameters = 1;
  e->total_parameters = (int64_t)loom_gpt_param_count(&cfg, NULL, 1);
  e->has_bubble = 1;
  const loom_schedule shape = {.kind = p->schedule, .p = pp, .v = vpp, .m = mb}; /* all the theory reads */
  e->bubble = mb > 0 && pp > 0 ? loom_schedule_theory_bubble(&shape) : 0.0;
  e->n_stages = p->n_stages;
  e->stages = loom_xcalloc(p->n_stages, sizeof *e->stages, "stage estimates");
  /* Sizes of a plan that breaks a rule mean nothing (the rules say why): zeros. */
  const bool sound = loom_plan_check_rules(p, 0, 0, NULL, 0) == 0;
  for (size_t k = 0; k < p->n_stages; k++) {
    const Loom__Stage *st = p->stages[k];
    Loom__StageEstimate *x = loom_xmalloc(sizeof *x, "stage estimate");
    loom__stage_estimate__init(x);
    const loom_stage_range range = {st->layer_begin, st->layer_end, st->embedding, st->head};
    x->has_pp_rank = x->has_chunk = x->has_parameters = x->has_weights = x->has_grads = 1;
    x->has_optimizer = x->has_optimizer_zero1 = x->has_activations = x->has_activations_recompute = x->has_p2p_buffers = 1;
    x->has_in_flight = x->has_master_weights = x->has_grad_compression = x->has_dp_bytes_sent = 1;
    x->has_zero_transient = x->has_weight_grad_states = x->has_grad_reduce_buffers = 1;
    x->pp_rank = st->pp_rank;
    x->chunk = st->chunk;
    e->stages[k] = x;
    if (!sound) continue;
    /* The memory model's (plan/memory.h): as the runtime allocates, with and without recompute. */
    const loom_memory mem = loom_plan_chunk_memory(p, st->pp_rank, st->chunk, false);
    const loom_memory redo = loom_plan_chunk_memory(p, st->pp_rank, st->chunk, true);
    int *slots = loom_xmalloc((size_t)vpp * sizeof *slots, "schedule peaks"), *deferred = loom_xmalloc((size_t)vpp * sizeof *deferred, "schedule peaks");
    int sends;
    x->in_flight = loom_plan_rank_buffers(p, st->pp_rank, slots, deferred, &sends);
    free(slots);
    free(deferred);
    x->parameters = (int64_t)loom_gpt_param_count(&cfg, &range, 1);
    x->weights = (int64_t)mem.bytes[LOOM_MEM_WEIGHTS];
    x->master_weights = (int64_t)mem.bytes[LOOM_MEM_MASTER];
    x->grads = (int64_t)mem.bytes[LOOM_MEM_GRADS];
    x->optimizer = (int64_t)mem.bytes[LOOM_MEM_OPTIMIZER];
    x->optimizer_zero1 = (int64_t)(8.0 * (double)loom_gpt_param_count(&cfg, &range, tp) / dp); /* what ZeRO-1 would leave */
    x->zero_transient = (int64_t)mem.bytes[LOOM_MEM_ZERO_TRANSIENT];
    x->activations = (int64_t)mem.bytes[LOOM_MEM_ACTIVATIONS];
    x->activations_recompute = (int64_t)redo.bytes[LOOM_MEM_ACTIVATIONS];
    x->weight_grad_states = (int64_t)(st->recompute ? redo : mem).bytes[LOOM_MEM_WEIGHT_GRAD_STATES];
    x->p2p_buffers = (int64_t)mem.bytes[LOOM_MEM_P2P];
    x->grad_reduce_buffers = (int64_t)mem.bytes[LOOM_MEM_GRAD_REDUCE];
    x->grad_compression = (int64_t)mem.bytes[LOOM_MEM_COMPRESSION];
    const loom_compression_cost c = loom_plan_compression_cost(p, &range); /* what crosses dp, from the layers' table */
    x->dp_bytes_sent = (int64_t)dp_bytes_sent(p, &c, &range);
  }
}

loom_status loom_plan_fit_world(loom_plan *p, int world, loom_error *err) {
  Loom__Parallel *l = p->parallel;
  const int64_t group = (int64_t)l->tp * l->pp, ranks = group * l->dp;
  if (world >= ranks) return LOOM_OK;
  const int64_t dp = world / group, per_step = (int64_t)p->batch->micro_batch * dp;
  if (dp < 1)
    return loom_fail(err, LOOM_ERR_USAGE, "%d ranks cannot hold one tp %d x pp %d group of the plan", world, l->tp, l->pp);
  if (dp * group != world)
    return loom_fail(err, LOOM_ERR_USAGE, "%d ranks are not whole tp %d x pp %d groups; launch %lld", world, l->tp, l->pp,
                     (long long)(dp * group));
  if (p->batch->global_batch % per_step)
    return loom_fail(err, LOOM_ERR_USAGE, "dp %lld on %d ranks cannot keep batch.global_batch %d: not a multiple of batch.micro_batch x dp (%lld)",
                     (long long)dp, world, p->batch->global_batch, (long long)per_step);
  l->dp = (int)dp;
  loom_plan_estimate(p);
  return LOOM_OK;
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

/* The model's own rules, split tp ways (its sizes already in bounds). */
static void check_model_shape(report *r, const Loom__Model *m, int tp) {
  if (m->hidden % m->heads)
    violation(r, "model.hidden = %d: must be divisible by model.heads (%d); pick heads that divide hidden", m->hidden, m->heads);
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
  if (m->position == LOOM__POSITION__POSITION_ROPE && (m->hidden / m->heads) % 2)
    violation(r, "model.position = POSITION_ROPE: needs an even head size, but hidden %d / heads %d = %d", m->hidden,
              m->heads, m->hidden / m->heads);
  if (m->position == LOOM__POSITION__POSITION_ROPE && !(isfinite(m->rope_theta) && m->rope_theta > 1.0f))
    violation(r, "model.rope_theta = %g: must be a finite number above 1 (10000 is RoPE's, 500000 Llama 3's)",
              (double)m->rope_theta);
}

static void check_model(report *r, const loom_plan *p) {
  const int tp = p->parallel->tp;
  check_model_shape(r, p->model, tp);
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
  if (r->count == 0 && next != p->model->layers)
    violation(r, "stages: cover layers [0, %d) but model.layers = %d; every layer must be covered exactly once", next,
              p->model->layers);
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
  if (p->parallel->dp < 2)
    violation(r, "grad_compression = %s: parallel.dp is %d, so no grads cross data parallelism to compress; raise "
              "parallel.dp or drop grad_compression", name, p->parallel->dp);
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
  if ((long long)loom_plan_micro_batches(p) * p->parallel->virtual_chunks * 2 > 32767)
    violation(r, "batch.global_batch = %d: %d micro-batches x %d chunks per rank is too many for MPI tags (at most 16383); raise batch.micro_batch",
              b->global_batch, loom_plan_micro_batches(p), p->parallel->virtual_chunks);
  if (p->parallel->zero_stage < 0 || p->parallel->zero_stage > 3)
    violation(r, "parallel.zero_stage = %d: ZeRO stages are 0 (none) to 3", p->parallel->zero_stage);
  if (p->grad_reduce == LOOM__PRECISION__PRECISION_BF16 && p->parallel->zero_stage != 0)
    violation(r, "grad_reduce = PRECISION_BF16: ZeRO reduce-scatters its grads in fp32 in this loom; set grad_reduce "
                 "PRECISION_FP32 or parallel.zero_stage 0");
  check_compression(r, p);
  for (size_t k = 1; k < p->n_stages; k++)
    if (p->stages[k]->recompute != p->stages[0]->recompute) {
      violation(r, "stages: stages disagree on recompute; this loom recomputes all stages or none");
      break;
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
  }
  if (l) {
    check_size(r, "parallel.tp", l->tp, 1, LOOM_PLAN_MAX_TP);
    check_size(r, "parallel.pp", l->pp, 1, LOOM_PLAN_MAX_PP);
    check_size(r, "parallel.dp", l->dp, 1, LOOM_PLAN_MAX_DP);
    check_size(r, "parallel.virtual_chunks", l->virtual_chunks, 1, LOOM_PLAN_MAX_CHUNKS);
  }
  if (b) {
    check_size(r, "batch.micro_batch", b->micro_batch, 1, LOOM_PLAN_MAX_MICRO_BATCH);
    check_size(r, "batch.global_batch", b->global_batch, 1, LOOM_PLAN_MAX_GLOBAL_BATCH);
  }
  if (r->count > before) return r->count - before;
  if (l) {
    check_product(r, "parallel.tp x parallel.pp x parallel.dp", (int64_t)l->tp * l->pp * l->dp, INT_MAX);
    check_product(r, "parallel.pp x parallel.virtual_chunks", (int64_t)l->pp * l->virtual_chunks, LOOM_PLAN_MAX_STAGES);
  }
  if (l && b) check_product(r, "batch.micro_batch x parallel.dp", (int64_t)b->micro_batch * l->dp, LOOM_PLAN_MAX_GLOBAL_BATCH);
  if (m && b) check_product(r, "batch.micro_batch x model.seq", (int64_t)b->micro_batch * m->seq, INT_MAX);
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

int64_t loom_plan_rank_bytes(const loom_plan *p, int pp_rank, int64_t *activations) {
  const loom_memory mem = loom_plan_rank_memory(p, pp_rank);
  if (activations) *activations = (int64_t)(mem.bytes[LOOM_MEM_ACTIVATIONS] + mem.bytes[LOOM_MEM_WEIGHT_GRAD_STATES]);
  return (int64_t)loom_memory_total(&mem);
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
  const long long ranks = (long long)l->tp * l->pp * l->dp;
  if (world > 0 && ranks != world)
    violation(&r, "parallel: tp %d x pp %d x dp %d = %lld ranks, but the world has %d; launch %lld ranks or change the layout",
              l->tp, l->pp, l->dp, ranks, world, ranks);
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

/* ---- validation: the rules, the verified schedule, memory ---- */

loom_zero_sizes loom_plan_zero_buckets(const loom_plan *p, const loom_stage_range *range) {
  loom_gpt_config cfg;
  loom_plan_model_config(p, &cfg);
  const int tp = p->parallel->tp, L = range->layer_end - range->layer_begin;
  const double h = cfg.hidden;
  const loom_stage_range one = {range->layer_begin, range->layer_begin + 1, false, false};
  const loom_stage_range head = {0, 0, false, true};
  const double wte = range->first || range->last ? (double)loom_gpt_param_count(&cfg, &head, tp) - 2.0 * h : 0.0;
  const double wpe = range->first ? (double)cfg.seq * h : 0.0, ln_f = range->last ? 2.0 * h : 0.0;
  loom_zero_sizes z = {.layer = L > 0 ? (double)loom_gpt_param_count(&cfg, &one, tp) : 0.0, .edges = wte + wpe + ln_f};
  z.largest_edge = fmax(wte, fmax(wpe, ln_f));
  z.largest = fmax(z.layer, z.largest_edge);
  return z;
}

loom_compression loom_plan_compression(const loom_plan *p) {
  const Loom__GradCompression *gc = p->grad_compression;
  return (loom_compression){.kind = gc ? gc->kind : LOOM__COMPRESSION_KIND__COMPRESSION_NONE,
                            .rank = gc ? gc->rank : 0, .dp = p->parallel->dp};
}

/* The compression cost of one range's tensors, walked one by one. */
static loom_compression_cost table_compression_cost(const loom_gpt_config *cfg, const loom_compression *gc,
                                                    const loom_stage_range *range, int tp) {
  loom_compression_cost c = {0.0, 0.0, 0.0, 0.0};
  const int n = loom_gpt_param_table(cfg, range, 0, tp, NULL, NULL);
  loom_tensor *specs = loom_xmalloc((size_t)n * sizeof *specs, "parameter table");
  loom_param_meta *meta = loom_xmalloc((size_t)n * sizeof *meta, "parameter table");
  loom_gpt_param_table(cfg, range, 0, tp, specs, meta);
  for (int k = 0; k < n; k++) {
    c.state_bytes += 4.0 * (double)loom_compression_state_words(gc, &specs[k]);
    c.sent_words += (double)loom_compression_sent_words(gc, &specs[k]);
    if (loom_compression_compresses(gc, &specs[k], NULL, NULL))
      c.message_words += (double)loom_compression_sent_words(gc, &specs[k]);
    c.whole_words += (double)loom_tensor_numel(&specs[k]);
  }
  free(specs);
  free(meta);
  return c;
}

loom_compression_cost loom_plan_compression_cost(const loom_plan *p, const loom_stage_range *range) {
  const loom_compression gc = loom_plan_compression(p);
  loom_gpt_config cfg;
  loom_plan_model_config(p, &cfg);
  const int tp = p->parallel->tp;
  cfg = loom_gpt_config_for_tp(&cfg, tp);
  if (gc.kind == LOOM__COMPRESSION_KIND__COMPRESSION_NONE) { /* everything crosses whole, with no state */
    const double whole = (double)loom_gpt_param_count(&cfg, range, tp);
    return (loom_compression_cost){0.0, whole, whole, 0.0};
  }
  loom_stage_range edges, one;
  const int layers = loom_stage_range_parts(range, &edges, &one);
  if (layers <= 1) return table_compression_cost(&cfg, &gc, range, tp);
  loom_compression_cost c = table_compression_cost(&cfg, &gc, &edges, tp);
  const loom_compression_cost l = table_compression_cost(&cfg, &gc, &one, tp);
  c.state_bytes += layers * l.state_bytes, c.sent_words += layers * l.sent_words;
  c.message_words += layers * l.message_words, c.whole_words += layers * l.whole_words;
  return c;
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

int loom_plan_layer_counts(const loom_plan *plan, int *counts) {
  for (size_t k = 0; k < plan->n_stages; k++) {
    const Loom__Stage *s = plan->stages[k];
    counts[loom_plan_stage_index(plan, s->pp_rank, s->chunk)] = s->layer_end - s->layer_begin;
  }
  return (int)plan->n_stages;
}
