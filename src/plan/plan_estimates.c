/* The plan's estimates: each stage's parameters, memory (the memory
 * model's, plan/memory.h) and data-parallel traffic. */
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

/* ---- estimates ---- */

/* Bytes one rank sends per step summing `words` grads of a stage over a
 * group of d replicas without compression, as ring collectives move them
 * (of a buffer of B bytes, an all-reduce sends 2 (d-1)/d B, a
 * reduce-scatter or all-gather (d-1)/d B), in the grad_reduce type: the
 * grads' all-reduce, or ZeRO-1's reduce-scatter, or ZeRO-2/3's after
 * every micro-batch; plus ZeRO-1/2's all-gather of the weights (bf16 in
 * bf16 runs), or ZeRO-3's before each forward and backward but of
 * `forward_only` words (the edges, which only the head's stage needs in
 * backward). 0 at d 1. In units of the fp32 shard (4 bytes per local
 * parameter), plain data parallelism is 2 (d-1)/d: DeepSpeed's "2 Psi" for
 * large d. */
/* Bytes a gathered weight takes: bf16 in bf16 runs. */
static double weight_bytes(const loom_plan *p) { return (double)loom_dtype_size(loom_plan_compute_dtype(p)); }

/* Of those, ZeRO-1/2's all-gather of `words` stepped weights over d replicas; 0 otherwise. */
static double gather_bytes_sent(const loom_plan *p, double d, double words) {
  const int zero = p->parallel->zero_stage;
  return d < 2 || (zero != 1 && zero != 2) ? 0.0 : (d - 1.0) / d * weight_bytes(p) * words;
}

static double group_bytes_sent(const loom_plan *p, double d, double words, double forward_only) {
  if (d < 2) return 0.0;
  const double share = (d - 1.0) / d; /* of a buffer each rank sends in a ring reduce-scatter or all-gather */
  const double m = loom_plan_micro_batches(p);
  const int zero = p->parallel->zero_stage;
  const double grad = (double)loom_dtype_size(loom_plan_grad_reduce_dtype(p));
  const double passes = zero >= 2 ? m : zero == 1 ? 1.0 : 2.0; /* reduce-scatters per micro-batch, one, an all-reduce's two */
  double bytes = passes * share * grad * words + gather_bytes_sent(p, d, words);
  if (zero == 3) bytes += m * share * weight_bytes(p) * (2.0 * words - forward_only);
  return bytes;
}

/* Parameters of one tp rank of the range's embedding and head (no layer), from the layers' table. */
static double edge_parameters(const loom_plan *p, const loom_stage_range *range) {
  loom_gpt_config cfg;
  loom_plan_rank_config(p, &cfg);
  loom_stage_range edges, one[LOOM_LAYER_KINDS];
  int layers[LOOM_LAYER_KINDS];
  loom_stage_range_kinds(&cfg, range, &edges, one, layers);
  return (double)loom_gpt_param_count(&cfg, &edges, p->parallel->tp);
}

/* Bytes one rank sends over dp (dp x cp: the ranks summing its grads) per step for a stage that costs c: as
 * group_bytes_sent over what crosses whole, or compression's collectives
 * (an all-gather of a B-byte message from each rank sends (d-1) B). */
static double dp_bytes_sent(const loom_plan *p, const loom_compression_cost *c, const loom_stage_range *range) {
  const double d = loom_plan_grad_replicas(p);
  if (d < 2) return 0.0;
  const double share = (d - 1.0) / d;
  const loom_compression gc = loom_plan_compression(p);
  if (gc.kind == LOOM__COMPRESSION_KIND__COMPRESSION_POWERSGD) /* all-reduces of the factors and of what crosses whole */
    return 2.0 * share * 4.0 * c->sent_words;
  if (gc.kind == LOOM__COMPRESSION_KIND__COMPRESSION_SIGN) /* the messages all-gathered, the rest all-reduced */
    return (d - 1.0) * 4.0 * c->message_words + 2.0 * share * 4.0 * (c->sent_words - c->message_words);
  const double edges = p->parallel->zero_stage == 3 && !range->last ? edge_parameters(p, range) : 0.0;
  return group_bytes_sent(p, d, c->whole_words, edges);
}

/* Under expert parallelism, the bytes one rank sends over its experts'
 * data-parallel group (tp dp / (etp ep) replicas) per step: their grads,
 * and under ZeRO their weights, the same collectives as dp's (compression
 * is refused there). */
static double edp_bytes_sent(const loom_plan *p, const loom_stage_range *range, double *gathered) {
  const Loom__Parallel *l = p->parallel;
  *gathered = 0.0;
  if (l->ep <= 1) return 0.0;
  loom_gpt_config cfg;
  loom_plan_rank_config(p, &cfg);
  const double edp = loom_plan_expert_replicas(p);
  const double words = (double)loom_gpt_expert_param_count(&cfg, range);
  *gathered = gather_bytes_sent(p, edp, words);
  return group_bytes_sent(p, edp, words, 0.0);
}

/* The elements of one replica's optimizer piece of a range under ZeRO-1, padded as the optimizer pads it. */
static size_t zero1_piece(const loom_plan *p, const loom_stage_range *range) {
  loom_gpt_config cfg;
  loom_plan_rank_config(p, &cfg);
  return loom_gpt_zero_cut(&cfg, range, p->parallel->tp, loom_plan_grad_replicas(p), 1).shard;
}

void loom_plan_estimate(loom_plan *p) {
  if (p->estimates) loom__estimates__free_unpacked(p->estimates, NULL);
  p->estimates = loom_xmalloc(sizeof *p->estimates, "plan estimates");
  loom__estimates__init(p->estimates);
  Loom__Estimates *e = p->estimates;
  const Loom__Parallel *l = p->parallel;
  const int pp = l->pp, vpp = l->virtual_chunks, mb = loom_plan_micro_batches(p);
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
    x->has_edp_bytes_sent = p->parallel->ep > 1;
    x->has_dp_gather_bytes_sent = p->parallel->zero_stage == 1 || p->parallel->zero_stage == 2;
    x->has_edp_gather_bytes_sent = x->has_edp_bytes_sent && x->has_dp_gather_bytes_sent;
    x->has_zero_transient = x->has_weight_grad_states = x->has_grad_reduce_buffers = 1;
    x->pp_rank = st->pp_rank;
    x->chunk = st->chunk;
    e->stages[k] = x;
    if (!sound) continue;
    /* The memory model's (plan/memory.h): as the runtime allocates, without recompute and with the stage's
     * (every layer's where it has none). */
    const loom_memory mem = loom_plan_chunk_memory(p, st->pp_rank, st->chunk, 0);
    const loom_memory redo =
        loom_plan_chunk_memory(p, st->pp_rank, st->chunk, st->recompute ? LOOM_RECOMPUTE_PLAN : LOOM_RECOMPUTE_ALL);
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
    /* What ZeRO-1 would leave: Adam's two moments of the replica's padded piece (loom_gpt_zero_cut). */
    x->optimizer_zero1 = (int64_t)(2.0 * (double)loom_dtype_size(LOOM_DTYPE_F32) * (double)zero1_piece(p, &range));
    x->zero_transient = (int64_t)mem.bytes[LOOM_MEM_ZERO_TRANSIENT];
    x->activations = (int64_t)mem.bytes[LOOM_MEM_ACTIVATIONS];
    x->activations_recompute = (int64_t)redo.bytes[LOOM_MEM_ACTIVATIONS];
    x->weight_grad_states = (int64_t)(st->recompute ? redo : mem).bytes[LOOM_MEM_WEIGHT_GRAD_STATES];
    x->p2p_buffers = (int64_t)mem.bytes[LOOM_MEM_P2P];
    x->grad_reduce_buffers = (int64_t)mem.bytes[LOOM_MEM_GRAD_REDUCE];
    x->grad_compression = (int64_t)mem.bytes[LOOM_MEM_COMPRESSION];
    const loom_compression_cost c = loom_plan_compression_cost(p, &range); /* what crosses dp, from the layers' table */
    x->dp_bytes_sent = (int64_t)dp_bytes_sent(p, &c, &range);
    const bool whole = loom_plan_compression(p).kind == LOOM__COMPRESSION_KIND__COMPRESSION_NONE; /* dp_bytes_sent's own split */
    x->dp_gather_bytes_sent = whole ? (int64_t)gather_bytes_sent(p, loom_plan_grad_replicas(p), c.whole_words) : 0;
    double edp_gathered;
    x->edp_bytes_sent = (int64_t)edp_bytes_sent(p, &range, &edp_gathered);
    x->edp_gather_bytes_sent = (int64_t)edp_gathered;
  }
}

int64_t loom_plan_rank_bytes(const loom_plan *p, int pp_rank, int64_t *activations) {
  const loom_memory mem = loom_plan_rank_memory(p, pp_rank);
  if (activations) *activations = (int64_t)(mem.bytes[LOOM_MEM_ACTIVATIONS] + mem.bytes[LOOM_MEM_WEIGHT_GRAD_STATES]);
  return (int64_t)loom_memory_total(&mem);
}

loom_dp_traffic loom_plan_dp_traffic(const loom_plan *p) {
  const int pp = p->parallel->pp;
  loom_dp_traffic t = {0};
  double *bytes = loom_xcalloc(3 * (size_t)pp, sizeof *bytes, "dp traffic"), *words = bytes + pp, *experts = words + pp;
  for (size_t k = 0; k < p->n_stages; k++) {
    const Loom__Stage *st = p->stages[k];
    const loom_stage_range range = loom_plan_stage_range(p, loom_plan_stage_index(p, st->pp_rank, st->chunk));
    const loom_compression_cost c = loom_plan_compression_cost(p, &range);
    t.sent_words += c.sent_words, t.whole_words += c.whole_words;
    bytes[st->pp_rank] += (double)p->estimates->stages[k]->dp_bytes_sent;
    words[st->pp_rank] += c.whole_words;
    experts[st->pp_rank] += (double)p->estimates->stages[k]->edp_bytes_sent;
  }
  for (int r = 0; r < pp; r++) {
    if (bytes[r] > bytes[t.busiest]) t.busiest = r;
    t.expert_most = fmax(t.expert_most, experts[r]);
  }
  t.busiest_bytes = bytes[t.busiest], t.busiest_words = words[t.busiest];
  free(bytes);
  return t;
}
