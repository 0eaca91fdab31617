/* Building a plan from a spec: stages, balancing, the world's dp. */
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

/* ---- building ---- */

static Loom__Stage *new_stage(int pp_rank, int chunk, int begin, int end, bool first, bool last, bool recompute,
                              int recompute_layers, int recompute_group) {
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
  /* The block method's count, capped at the stage's layers (all of them then: plain full recompute). */
  s->has_recompute_layers = recompute && recompute_layers > 0 && recompute_layers < end - begin;
  s->recompute_layers = s->has_recompute_layers ? recompute_layers : 0;
  s->has_recompute_group = recompute && recompute_group > 1;
  s->recompute_group = s->has_recompute_group ? recompute_group : 0;
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

static void *plan_copy(const void *from, size_t bytes, const char *what) {
  void *to = loom_xmalloc(bytes, what);
  memcpy(to, from, bytes);
  return to;
}

/* The model message from the spec's config; the plan owns its submessages, each its own allocation (freed as a
 * decoded message's are). */
static Loom__Model *model_of(const loom_plan_spec *sp) {
  Loom__Model *m = loom_xmalloc(sizeof *m, "plan model");
  loom__model__init(m);
  loom_model_rooms *rooms = loom_xmalloc(sizeof *rooms, "plan model");
  loom_model_proto_fill(m, &sp->model, rooms);
  if (m->rope_scaling) m->rope_scaling = plan_copy(&rooms->scaling, sizeof rooms->scaling, "plan model");
  if (m->mla) m->mla = plan_copy(&rooms->mla, sizeof rooms->mla, "plan model");
  if (m->n_window_pattern)
    m->window_pattern = plan_copy(rooms->window_pattern, m->n_window_pattern * sizeof *rooms->window_pattern, "plan model");
  if (m->moe) {
    Loom__Moe *moe = plan_copy(&rooms->moe, sizeof rooms->moe, "plan model");
    if (moe->n_layer_pattern)
      moe->layer_pattern = plan_copy(rooms->pattern, moe->n_layer_pattern * sizeof *rooms->pattern, "plan model");
    m->moe = moe;
  }
  free(rooms);
  return m;
}

static Loom__Parallel *parallel_of(const loom_plan_spec *sp) {
  Loom__Parallel *l = loom_xmalloc(sizeof *l, "plan layout");
  loom__parallel__init(l);
  l->has_tp = l->has_pp = l->has_dp = l->has_virtual_chunks = 1;
  l->tp = sp->tp, l->pp = sp->pp, l->dp = sp->dp, l->virtual_chunks = sp->vpp;
  l->has_sequence_parallel = sp->sequence_parallel, l->sequence_parallel = sp->sequence_parallel;
  l->has_zero_stage = sp->zero_stage != 0, l->zero_stage = sp->zero_stage;
  l->has_ep = sp->ep > 1, l->ep = sp->ep > 1 ? sp->ep : 1;
  l->has_etp = sp->etp > 1, l->etp = sp->etp > 1 ? sp->etp : 1;
  l->has_cp = sp->cp > 1, l->cp = sp->cp > 1 ? sp->cp : 1;
  l->has_cp_comm_type = sp->cp_comm != LOOM__CP_COMM_TYPE__CP_COMM_P2P, l->cp_comm_type = sp->cp_comm;
  return l;
}

/* The batch, schedule, precision, compression, fp8 and overlap fields, each present only where it leaves the
 * default. */
static void settings_of(const loom_plan_spec *sp, loom_plan *p) {
  p->batch = loom_xmalloc(sizeof *p->batch, "plan batch");
  loom__batch__init(p->batch);
  p->batch->has_micro_batch = p->batch->has_global_batch = 1;
  p->batch->micro_batch = sp->micro_batch, p->batch->global_batch = sp->global_batch;
  p->batch->has_seq = sp->train_seq > 0 && sp->train_seq != sp->model.seq;
  p->batch->seq = p->batch->has_seq ? sp->train_seq : 0;
  p->has_schedule = 1, p->schedule = sp->schedule;
  p->has_balance = 1, p->balance = sp->balance;
  p->has_precision = sp->precision != LOOM__PRECISION__PRECISION_FP32, p->precision = sp->precision;
  p->has_grad_reduce = sp->grad_reduce != LOOM__PRECISION__PRECISION_FP32, p->grad_reduce = sp->grad_reduce;
  if (sp->compression != LOOM__COMPRESSION_KIND__COMPRESSION_NONE || sp->compression_rank != 0) {
    p->grad_compression = loom_xmalloc(sizeof *p->grad_compression, "plan grad compression");
    loom__grad_compression__init(p->grad_compression);
    p->grad_compression->has_kind = p->grad_compression->has_rank = 1;
    p->grad_compression->kind = sp->compression, p->grad_compression->rank = sp->compression_rank;
  }
  p->has_fp8 = sp->fp8 != LOOM__FP8_FORMAT__FP8_NONE, p->fp8 = sp->fp8;
  if (p->has_fp8) {
    const loom_fp8_config *c = &sp->fp8_scaling;
    Loom__Fp8Scaling *f = p->fp8_scaling = loom_xmalloc(sizeof *p->fp8_scaling, "plan fp8 scaling");
    loom__fp8_scaling__init(f);
    f->has_recipe = 1, f->recipe = (Loom__Fp8Recipe)c->recipe;
    f->has_amax_history_len = 1, f->amax_history_len = (uint32_t)c->history;
    f->has_amax_compute_algo = 1, f->amax_compute_algo = c->most_recent ? LOOM__FP8_AMAX_ALGO__FP8_AMAX_MOST_RECENT
                                                                      : LOOM__FP8_AMAX_ALGO__FP8_AMAX_MAX;
    f->has_margin = c->margin != 0, f->margin = c->margin;
    f->has_bf16_first_layers = c->bf16_first != 0, f->bf16_first_layers = (uint32_t)c->bf16_first;
    f->has_bf16_last_layers = c->bf16_last != 0, f->bf16_last_layers = (uint32_t)c->bf16_last;
  }
  if (sp->tp_comm_overlap || sp->no_grad_reduce_overlap || sp->param_gather_overlap || sp->no_p2p_overlap) { /* else absent: the runtime's own */
    p->overlap = loom_xmalloc(sizeof *p->overlap, "plan overlap");
    loom__overlap__init(p->overlap);
    p->overlap->has_tp_comm = sp->tp_comm_overlap, p->overlap->tp_comm = sp->tp_comm_overlap;
    p->overlap->has_grad_reduce = sp->no_grad_reduce_overlap, p->overlap->grad_reduce = !sp->no_grad_reduce_overlap;
    p->overlap->has_param_gather = sp->param_gather_overlap, p->overlap->param_gather = sp->param_gather_overlap;
    p->overlap->has_p2p = sp->no_p2p_overlap, p->overlap->p2p = !sp->no_p2p_overlap;
  }
}

/* Layers per stage into counts[S]: an explicit split, or balanced by the chosen measure. */
static loom_status layer_counts(const loom_plan_spec *sp, const loom_plan *p, int S, int *counts, loom_error *err) {
  if (sp->layer_counts) {
    if (sp->nlayer_counts != S)
      return loom_fail(err, LOOM_ERR_USAGE, "stages: the layer split has %d entries but there are %d stages "
                       "(parallel.pp x parallel.virtual_chunks); give one count per stage", sp->nlayer_counts, S);
    memcpy(counts, sp->layer_counts, (size_t)S * sizeof(int));
    return LOOM_OK;
  }
  if (sp->balance == LOOM__BALANCE__BALANCE_UNIFORM) { /* the one even split: earlier stages take the remainder */
    for (int v = 0; v < S; v++) counts[v] = p->model->layers / S + (v < p->model->layers % S);
    return LOOM_OK;
  }
  /* Sizes and FLOPs of a layer and of the edges, from the layers' table and FLOPs count. */
  loom_gpt_config cfg;
  loom_plan_model_config(p, &cfg);
  /* The last stage's own part: the final norm and the head (the tied copy of wte), and the MTP modules after the layers */
  const loom_stage_range one = {.layer_begin = 0, .layer_end = 1}, embed = {.first = true},
                         head = {.layer_begin = cfg.layers, .layer_end = loom_gpt_blocks(&cfg), .last = true};
  double layer = 1.0, first = 0.0, last = (double)cfg.mtp_layers;
  if (sp->balance == LOOM__BALANCE__BALANCE_PARAMS) {
    layer = (double)loom_gpt_param_count(&cfg, &one, 1);
    first = (double)loom_gpt_param_count(&cfg, &embed, 1);
    last = (double)loom_gpt_param_count(&cfg, &head, 1);
  } else if (sp->balance == LOOM__BALANCE__BALANCE_COMPUTE) {
    layer = loom_gpt_stage_train_flops(&cfg, &one, cfg.seq, 1.0, LOOM_FLOPS_MEGATRON);
    last = loom_gpt_stage_train_flops(&cfg, &head, cfg.seq, 1.0, LOOM_FLOPS_MEGATRON); /* the LM heads' matmuls */
  }
  balance(p->model->layers, S, layer, first, last, counts);
  return LOOM_OK;
}

loom_status loom_plan_build(const loom_plan_spec *sp, loom_plan **out, loom_error *err) {
  *out = NULL;
  const int S = sp->pp * sp->vpp;
  if (S < 1 || S > LOOM_PLAN_MAX_STAGES)
    return loom_fail(err, LOOM_ERR_USAGE, "parallel.pp x parallel.virtual_chunks = %d stages is out of range (1 to %d)", S,
                     LOOM_PLAN_MAX_STAGES);
  loom_plan *p = loom_xmalloc(sizeof *p, "plan");
  loom__partition_plan__init(p);
  p->has_format_version = 1;
  p->format_version = LOOM_PLAN_FORMAT_VERSION;
  if (sp->name) p->name = strdup(sp->name);
  p->model = model_of(sp);
  p->parallel = parallel_of(sp);
  settings_of(sp, p);
  int *counts = loom_xmalloc((size_t)S * sizeof(int), "layer counts");
  const loom_status st = layer_counts(sp, p, S, counts, err);
  if (st != LOOM_OK) {
    free(counts);
    loom_plan_free(p);
    return st;
  }
  p->n_stages = (size_t)S;
  p->stages = loom_xcalloc((size_t)S, sizeof *p->stages, "plan stages");
  counts[S - 1] += p->model->mtp_num_layers; /* the MTP modules' blocks: on the last stage, with the head */
  for (int v = 0, begin = 0; v < S; begin += counts[v++]) {
    int rank, chunk;
    loom_stage_place(loom_schedule_kind_v_shape(sp->schedule), sp->pp, v, &rank, &chunk);
    p->stages[v] = new_stage(rank, chunk, begin, begin + counts[v], v == 0, v == S - 1, sp->recompute,
                             sp->recompute_layers, sp->recompute_group);
  }
  free(counts);
  loom_plan_estimate(p);
  *out = p;
  return LOOM_OK;
}

loom_status loom_plan_fit_world(loom_plan *p, int world, loom_error *err) {
  Loom__Parallel *l = p->parallel;
  const int64_t group = (int64_t)l->tp * l->cp * l->pp, ranks = group * l->dp;
  if (world >= ranks) return LOOM_OK;
  const int64_t dp = world / group, per_step = (int64_t)p->batch->micro_batch * dp;
  if (dp < 1)
    return loom_fail(err, LOOM_ERR_USAGE, "%d ranks cannot hold one tp %d x cp %d x pp %d group of the plan", world, l->tp,
                     l->cp, l->pp);
  if (dp * group != world)
    return loom_fail(err, LOOM_ERR_USAGE, "%d ranks are not whole tp %d x cp %d x pp %d groups; launch %lld", world, l->tp,
                     l->cp, l->pp, (long long)(dp * group));
  if (p->batch->global_batch % per_step)
    return loom_fail(err, LOOM_ERR_USAGE, "dp %lld on %d ranks cannot keep batch.global_batch %d: not a multiple of batch.micro_batch x dp (%lld)",
                     (long long)dp, world, p->batch->global_batch, (long long)per_step);
  l->dp = (int)dp;
  loom_plan_estimate(p);
  return LOOM_OK;
}
