/* Plan building, balancing, estimates and rules. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "plan/plan.h"

#define VOCAB_ALIGN 128

static int64_t padded_vocab(const Loom__Model *m, int tp) {
  const int64_t align = (int64_t)VOCAB_ALIGN * tp;
  return (m->vocab + align - 1) / align * align;
}

static int64_t layer_parameters(const Loom__Model *m) {
  const int64_t h = m->hidden, f = m->ffn;
  return 4 * h * h + 2 * h * f + 9 * h + f; /* qkv, proj, fc, proj weights; biases; two norms */
}

int64_t loom_plan_total_parameters(const Loom__Model *m) {
  return (int64_t)m->layers * layer_parameters(m) + ((int64_t)m->vocab + m->seq) * m->hidden + 2 * (int64_t)m->hidden;
}

static int micro_batches(const loom_plan *p) {
  const int per = p->batch->micro_batch * p->parallel->dp;
  return per > 0 ? p->batch->global_batch / per : 0;
}

int loom_plan_in_flight(Loom__ScheduleKind kind, int pp, int vpp, int m, int rank) {
  if (kind == LOOM__SCHEDULE_KIND__SCHEDULE_GPIPE) return m;
  if (kind == LOOM__SCHEDULE_KIND__SCHEDULE_1F1B) return pp - rank < m ? pp - rank : m;
  const int warm = (pp - rank - 1) * 2 + (vpp - 1) * pp + 1, total = m * vpp;
  return warm < total ? warm : total; /* chunk-micro-batches */
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
  Loom__Model *m = p->model;
  m->has_layers = m->has_hidden = m->has_heads = m->has_ffn = m->has_vocab = m->has_seq = 1;
  m->layers = sp->layers;
  m->hidden = sp->hidden;
  m->heads = sp->heads;
  m->ffn = sp->ffn ? sp->ffn : 4 * sp->hidden;
  m->vocab = sp->vocab;
  m->seq = sp->seq;
  m->has_dropout = sp->dropout > 0.0f;
  m->dropout = sp->dropout;
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
  p->has_schedule = 1;
  p->schedule = sp->schedule;
  p->has_balance = 1;
  p->balance = sp->balance;
  /* Stages: an explicit split, or balanced by the chosen measure. */
  const int S = sp->pp * sp->vpp;
  if (S < 1 || S > 4096) {
    loom_plan_free(p);
    return loom_fail(err, LOOM_ERR_USAGE, "pp x vpp = %d stages is out of range (1 to 4096)", S);
  }
  int *counts = loom_xmalloc((size_t)S * sizeof(int), "layer counts");
  if (sp->layer_counts) {
    if (sp->nlayer_counts != S) {
      free(counts);
      loom_plan_free(p);
      return loom_fail(err, LOOM_ERR_USAGE, "--layer-split has %d entries but there are %d stages (pp x vpp)",
                       sp->nlayer_counts, S);
    }
    memcpy(counts, sp->layer_counts, (size_t)S * sizeof(int));
  } else if (sp->balance == LOOM__BALANCE__BALANCE_UNIFORM) {
    for (int v = 0; v < S; v++) counts[v] = m->layers / S + (v < m->layers % S); /* as loom train's even split */
  } else {
    const double h = m->hidden, V = m->vocab, s = m->seq;
    double layer = 1.0, first = 0.0, last = 0.0;
    if (sp->balance == LOOM__BALANCE__BALANCE_PARAMS) {
      layer = (double)layer_parameters(m);
      first = (V + s) * h;
      last = V * h + 2 * h; /* the tied head's copy of wte, and ln_f */
    } else if (sp->balance == LOOM__BALANCE__BALANCE_COMPUTE) {
      layer = 24.0 * h * h + 4.0 * s * h; /* forward FLOPs per token of a layer, ffn = 4h */
      last = 2.0 * h * V;                 /* the LM head's matmul */
    }
    balance(m->layers, S, layer, first, last, counts);
  }
  p->n_stages = (size_t)S;
  p->stages = loom_xcalloc((size_t)S, sizeof *p->stages, "plan stages");
  int begin = 0;
  for (int v = 0; v < S; v++) {
    p->stages[v] = new_stage(v % sp->pp, v / sp->pp, begin, begin + counts[v], v == 0, v == S - 1, sp->recompute);
    begin += counts[v];
  }
  free(counts);
  loom_plan_estimate(p);
  *out = p;
  return LOOM_OK;
}

/* ---- estimates ---- */

void loom_plan_estimate(loom_plan *p) {
  if (p->estimates) loom__estimates__free_unpacked(p->estimates, NULL);
  p->estimates = loom_xmalloc(sizeof *p->estimates, "plan estimates");
  loom__estimates__init(p->estimates);
  Loom__Estimates *e = p->estimates;
  const Loom__Model *m = p->model;
  const Loom__Parallel *l = p->parallel;
  const int tp = l->tp, dp = l->dp, pp = l->pp, vpp = l->virtual_chunks, mb = micro_batches(p);
  const double s = m->seq, b = p->batch->micro_batch, h = m->hidden, a = m->heads;
  e->has_total_parameters = 1;
  e->total_parameters = loom_plan_total_parameters(m);
  e->has_bubble = 1;
  const int v = p->schedule == LOOM__SCHEDULE_KIND__SCHEDULE_INTERLEAVED ? vpp : 1;
  e->bubble = mb > 0 ? (double)(pp - 1) / (v * mb + pp - 1) : 0.0;
  e->n_stages = p->n_stages;
  e->stages = loom_xcalloc(p->n_stages, sizeof *e->stages, "stage estimates");
  /* Megatron (Korthikanti et al.): bytes per layer in 16-bit, s*b*h*(34 + 5as/h) unsplit;
   * with tensor parallelism s*b*h*(10 + 24/t + 5as/(h t)), and all of it /t under SP. */
  const double per_layer = l->sequence_parallel ? s * b * h * (34.0 + 5.0 * a * s / h) / tp
                                                : s * b * h * (10.0 + 24.0 / tp + 5.0 * a * s / (h * tp));
  const double per_layer_recompute = 2.0 * s * b * h / (l->sequence_parallel ? tp : 1);
  for (size_t k = 0; k < p->n_stages; k++) {
    const Loom__Stage *st = p->stages[k];
    Loom__StageEstimate *x = loom_xmalloc(sizeof *x, "stage estimate");
    loom__stage_estimate__init(x);
    const int L = st->layer_end - st->layer_begin;
    const int64_t params = (int64_t)L * layer_parameters(m) + (st->embedding ? ((int64_t)m->vocab + m->seq) * m->hidden : 0) +
                           (st->head ? (st->embedding ? 0 : (int64_t)m->vocab * m->hidden) + 2 * (int64_t)m->hidden : 0);
    const double local = (double)params / tp; /* replicated norms and biases are small; counted /tp */
    /* Interleaved counts chunk-micro-batches over the rank's chunks: share them out. */
    const int flight_rank = loom_plan_in_flight(p->schedule, pp, vpp, mb, st->pp_rank);
    const int flight = p->schedule == LOOM__SCHEDULE_KIND__SCHEDULE_INTERLEAVED ? (flight_rank + vpp - 1) / vpp : flight_rank;
    x->has_pp_rank = x->has_chunk = x->has_parameters = x->has_weights = x->has_grads = 1;
    x->has_optimizer = x->has_optimizer_zero1 = x->has_activations = x->has_activations_recompute = x->has_p2p_buffers = 1;
    x->pp_rank = st->pp_rank;
    x->chunk = st->chunk;
    x->parameters = params;
    x->weights = (int64_t)(2.0 * local);
    x->grads = (int64_t)(4.0 * local);
    x->optimizer = (int64_t)(12.0 * local);
    x->optimizer_zero1 = (int64_t)(12.0 * local / dp);
    x->activations = (int64_t)(per_layer * L * flight);
    x->activations_recompute = (int64_t)(per_layer_recompute * L * flight);
    x->p2p_buffers = (int64_t)(2.0 * 2.0 * s * b * h / (l->sequence_parallel ? tp : 1));
    e->stages[k] = x;
  }
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

static void check_model(report *r, const loom_plan *p) {
  const Loom__Model *m = p->model;
  const int tp = p->parallel->tp;
  if (m->layers < 1) violation(r, "model.layers = %d: a model needs at least one layer; set layers >= 1", m->layers);
  if (m->heads < 1 || m->hidden < 1) {
    violation(r, "model.heads = %d, model.hidden = %d: both must be positive", m->heads, m->hidden);
    return;
  }
  if (m->hidden % m->heads)
    violation(r, "model.hidden = %d: must be divisible by model.heads (%d); pick heads that divide hidden", m->hidden, m->heads);
  if (m->heads % tp)
    violation(r, "model.heads = %d: must be divisible by parallel.tp (%d) so each rank holds whole heads; pick a tp that divides heads",
              m->heads, tp);
  if (m->ffn % tp)
    violation(r, "model.ffn = %d: must be divisible by parallel.tp (%d); pick a tp that divides ffn", m->ffn, tp);
  if (m->vocab < 2) violation(r, "model.vocab = %d: must be at least 2", m->vocab);
  else if (padded_vocab(m, tp) % tp)
    violation(r, "model.vocab = %d: padded to %lld, not divisible by parallel.tp (%d)", m->vocab,
              (long long)padded_vocab(m, tp), tp);
  if (m->seq < 1) violation(r, "model.seq = %d: must be at least 1", m->seq);
  if (p->parallel->sequence_parallel && m->seq % tp)
    violation(r, "model.seq = %d: must be divisible by parallel.tp (%d) under sequence parallelism; pick seq or tp to divide",
              m->seq, tp);
}

static void check_stages(report *r, const loom_plan *p) {
  const int pp = p->parallel->pp, vpp = p->parallel->virtual_chunks, S = pp * vpp;
  if ((int)p->n_stages != S) {
    violation(r, "stages: %zu entries, but parallel.pp x parallel.virtual_chunks = %d; give one stage per pipeline rank and chunk",
              p->n_stages, S);
    return;
  }
  int *seen = loom_xcalloc((size_t)S, sizeof(int), "stage check");
  for (size_t k = 0; k < p->n_stages; k++) {
    const Loom__Stage *s = p->stages[k];
    if (s->pp_rank < 0 || s->pp_rank >= pp || s->chunk < 0 || s->chunk >= vpp) {
      violation(r, "stages[%zu]: pp_rank %d chunk %d is outside pp %d x chunks %d", k, s->pp_rank, s->chunk, pp, vpp);
      continue;
    }
    seen[s->chunk * pp + s->pp_rank]++;
  }
  for (int v = 0; v < S; v++)
    if (seen[v] != 1)
      violation(r, "stages: pp_rank %d chunk %d appears %d times; every rank and chunk needs exactly one stage", v % pp,
                v / pp, seen[v]);
  free(seen);
  /* In virtual stage order the ranges must tile [0, layers). */
  int next = 0;
  for (int v = 0; v < S && r->count == 0; v++) {
    const Loom__Stage *s = NULL;
    for (size_t k = 0; k < p->n_stages; k++)
      if (p->stages[k]->chunk * pp + p->stages[k]->pp_rank == v) s = p->stages[k];
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
}

static void check_batch(report *r, const loom_plan *p) {
  const Loom__Batch *b = p->batch;
  const int dp = p->parallel->dp, pp = p->parallel->pp;
  if (b->micro_batch < 1) {
    violation(r, "batch.micro_batch = %d: must be at least 1", b->micro_batch);
    return;
  }
  if (b->global_batch < 1 || b->global_batch % (b->micro_batch * dp))
    violation(r, "batch.global_batch = %d: must be a positive multiple of micro_batch x dp = %d; round it to a multiple",
              b->global_batch, b->micro_batch * dp);
  else if (p->schedule == LOOM__SCHEDULE_KIND__SCHEDULE_INTERLEAVED && micro_batches(p) % pp)
    violation(r, "batch.global_batch = %d gives %d micro-batches, not a multiple of parallel.pp (%d) as the interleaved schedule needs; use %d",
              b->global_batch, micro_batches(p), pp, (micro_batches(p) + pp - 1) / pp * pp * b->micro_batch * dp);
  if (p->schedule != LOOM__SCHEDULE_KIND__SCHEDULE_INTERLEAVED && p->parallel->virtual_chunks != 1)
    violation(r, "parallel.virtual_chunks = %d: needs schedule SCHEDULE_INTERLEAVED; set virtual_chunks 1 or change the schedule",
              p->parallel->virtual_chunks);
}

int loom_plan_check_rules(const loom_plan *p, int world, int64_t device_memory, char *lines, size_t cap) {
  report r = {.out = lines, .cap = cap};
  if (lines && cap) lines[0] = '\0';
  if (!p->model || !p->parallel || !p->batch) {
    violation(&r, "plan: model, parallel and batch are all required");
    return r.count;
  }
  const Loom__Parallel *l = p->parallel;
  if (l->tp < 1 || l->pp < 1 || l->dp < 1 || l->virtual_chunks < 1) {
    violation(&r, "parallel: tp %d, pp %d, dp %d, virtual_chunks %d must all be at least 1", l->tp, l->pp, l->dp, l->virtual_chunks);
    return r.count;
  }
  check_model(&r, p);
  check_batch(&r, p);
  check_stages(&r, p);
  const long long ranks = (long long)l->tp * l->pp * l->dp;
  if (world > 0 && ranks != world)
    violation(&r, "parallel: tp %d x pp %d x dp %d = %lld ranks, but the world has %d; launch %lld ranks or change the layout",
              l->tp, l->pp, l->dp, ranks, world, ranks);
  if (device_memory > 0 && r.count == 0) {
    loom_plan copy = *p;
    copy.estimates = NULL; /* fresh numbers for the check, leaving the plan's own alone */
    loom_plan_estimate(&copy);
    for (size_t k = 0; k < copy.estimates->n_stages; k++) {
      const Loom__StageEstimate *x = copy.estimates->stages[k];
      const int64_t need = x->weights + x->grads + (l->zero_stage >= 1 ? x->optimizer_zero1 : x->optimizer) +
                           (p->stages[k]->recompute ? x->activations_recompute : x->activations) + x->p2p_buffers;
      if (need > device_memory)
        violation(&r, "stages (pp_rank %d chunk %d): needs %.1f GiB per rank, over the device's %.1f GiB; raise tp or pp, turn on recompute or zero_stage 1, or lower batch.micro_batch",
                  x->pp_rank, x->chunk, need / 1073741824.0, device_memory / 1073741824.0);
    }
    loom__estimates__free_unpacked(copy.estimates, NULL);
  }
  return r.count;
}

int loom_plan_layer_counts(const loom_plan *plan, int *counts) {
  for (size_t k = 0; k < plan->n_stages; k++) {
    const Loom__Stage *s = plan->stages[k];
    counts[s->chunk * plan->parallel->pp + s->pp_rank] = s->layer_end - s->layer_begin;
  }
  return (int)plan->n_stages;
}
