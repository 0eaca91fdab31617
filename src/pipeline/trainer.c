/* A run built from a plan: optimizers, the step and evaluation through the pipeline hooks. */
#include <math.h>
#include <string.h>
#include <stdlib.h>
#include "pipeline/trainer.h"
#include "core/check.h"
#include "core/fault.h"
#include "core/sysinfo.h"
#include "data/addition.h"
#include "layers/moe_router.h"

static void free_optimizers(loom_trainer *tr) {
  for (int c = 0; tr->opts && c < loom_pipeline_chunk_count(tr->pipe); c++) {
    loom_adamw_free(&tr->opts[c]);
    if (tr->zero) loom_zero_free(&tr->zero[c]);
  }
  free(tr->opts);
  free(tr->zero);
  tr->opts = NULL;
  tr->zero = NULL;
}

/* A model with model.moe.expert_bias: the whole model's bias, from 0, each
 * chunk routing with its layers' rows. */
static void expert_bias_init(loom_trainer *tr) {
  const loom_gpt_config *c = &loom_pipeline_chunk(tr->pipe, 0)->p.cfg;
  if (!loom_gpt_is_moe(c) || !c->moe.expert_bias) return;
  tr->expert_bias_count = (size_t)loom_gpt_blocks(c) * (size_t)c->moe.experts;
  tr->expert_bias = loom_xcalloc(tr->expert_bias_count, sizeof *tr->expert_bias, "expert bias");
  for (int k = 0; k < loom_pipeline_chunk_count(tr->pipe); k++) {
    loom_gpt *m = loom_pipeline_chunk(tr->pipe, k);
    m->expert_bias = tr->expert_bias + (size_t)m->p.range.layer_begin * (size_t)c->moe.experts;
  }
}

/* FP8 delayed scaling's state: every operand's scale 1 (Transformer Engine's first), its history 0. */
static void fp8_init(loom_trainer *tr) {
  const loom_gpt_config *c = &loom_pipeline_chunk(tr->pipe, 0)->p.cfg;
  if (!c->fp8.on || c->fp8.recipe != LOOM_FP8_RECIPE_DELAYED) return;
  tr->fp8_count = (size_t)loom_gpt_blocks(c) * LOOM_FP8_LINEARS * LOOM_FP8_OPERANDS;
  tr->fp8_scale = loom_xmalloc(tr->fp8_count * sizeof *tr->fp8_scale, "FP8 scales");
  tr->fp8_step_amax = loom_xcalloc(tr->fp8_count, sizeof *tr->fp8_step_amax, "FP8 amaxes");
  tr->fp8_history = loom_xcalloc(tr->fp8_count * (size_t)c->fp8.history, sizeof *tr->fp8_history, "FP8 amax history");
  for (size_t i = 0; i < tr->fp8_count; i++) tr->fp8_scale[i] = 1.0f;
  for (int k = 0; k < loom_pipeline_chunk_count(tr->pipe); k++)
    loom_gpt_fp8_bind(loom_pipeline_chunk(tr->pipe, k), tr->fp8_scale, tr->fp8_step_amax);
}

/* After a step: every operand's amax the max over every rank (collective over the world: a stage's layers' are
 * 0 elsewhere), pushed onto its history, its scale stepped (every rank alike). */
static void fp8_step(loom_trainer *tr) {
  if (!tr->fp8_count) return;
  const loom_gpt_config *c = &loom_pipeline_chunk(tr->pipe, 0)->p.cfg;
  loom_comm_allreduce_typed(tr->ps.world_group, tr->fp8_step_amax, tr->fp8_count, LOOM_DTYPE_F32, LOOM_REDUCE_MAX);
  loom_fp8_history_step(&c->fp8, tr->fp8_history, tr->fp8_scale, tr->fp8_step_amax, tr->fp8_count);
}

loom_status loom_trainer_init(loom_trainer *tr, loom_comm *world, const loom_plan *plan, const loom_ops *ops,
                              loom_dataset *data, const loom_trainer_options *o, loom_error *err) {
  *tr = (loom_trainer){.data = data, .lr = o->lr, .mem = ops->mem};
  /* Everything resolved about this rank's part, once: what follows reads the sheet, not the plan (kept for the
   * checkpoints' manifests alone). */
  loom_status st = loom_rank_sheet_fill(&tr->sheet, plan, loom_comm_rank(world), err);
  tr->plan = plan;
  if (st != LOOM_OK) return st;
  const loom_rank_sheet *sh = &tr->sheet;
  tr->T = sh->seq, tr->micro_batch = sh->micro_batch, tr->global_batch = sh->global_batch;
  /* The run's tensor memory is counted from here: the allocator's peak over what it held before. */
  ops->mem->reset_peak(ops->mem);
  tr->baseline_tensor = ops->mem->counts(ops->mem).in_use;
  loom_comm_use_memory(world, ops->mem); /* the groups' buffers are the backend's */
  loom_parallel_init(&tr->ps, world, sh->size.tp, sh->size.pp, sh->size.dp, sh->size.cp, sh->sequence_parallel);
  loom_parallel_init_experts(&tr->ps, sh->etp, sh->ep);
  /* ZeRO shards over the ranks holding the same parameters: dp x cp (Megatron-Core's data-parallel group with cp). */
  const int zero_stage = sh->zero_stage;
  const int zero_dp = !o->forward_only && zero_stage ? sh->grad_replicas : 0;
  /* The plan's --overlap-grad-reduce: grads reduced in buckets during backward, else all after it. */
  const size_t buckets = sh->overlap.grad_reduce ? o->bucket_bytes : 0;
  st = loom_pipeline_new(&tr->pipe, &tr->ps, sh, ops, o->seed, buckets, zero_dp, err);
  if (st == LOOM_OK) expert_bias_init(tr), fp8_init(tr);
  if (st != LOOM_OK || o->forward_only) return st;
  loom_adamw_config oc = loom_adamw_defaults();
  oc.weight_decay = o->weight_decay;
  oc.grad_clip = o->grad_clip;
  const int v = loom_pipeline_chunk_count(tr->pipe);
  tr->opts = loom_xcalloc((size_t)v, sizeof *tr->opts, "optimizers");
  if (zero_stage) tr->zero = loom_xcalloc((size_t)v, sizeof *tr->zero, "ZeRO optimizers");
  /* The experts' pieces go over the ranks holding the same experts under expert parallelism, else over dp too. */
  const loom_zero_group dense = {tr->ps.dp_cp_rank, tr->ps.dp * tr->ps.cp, tr->ps.dp_cp_group};
  const loom_zero_group groups[LOOM_ZERO_GROUPS] = {
      dense, tr->ps.ep > 1 ? (loom_zero_group){tr->ps.edp_rank, tr->ps.edp, tr->ps.edp_group} : dense};
  for (int c = 0; c < v && st == LOOM_OK; c++) {
    loom_gpt_params *p = &loom_pipeline_chunk(tr->pipe, c)->p;
    st = tr->zero ? loom_zero_init(&tr->zero[c], p, groups, zero_stage, &oc)
                  : loom_adamw_init(&tr->opts[c], p, &oc);
    if (st == LOOM_OK && tr->zero) loom_zero_randomize(&tr->zero[c], p, o->seed); /* each replica draws its own pieces */
  }
  if (st == LOOM_OK && tr->zero) st = loom_pipeline_use_zero(tr->pipe, tr->zero);
  if (st == LOOM_ERR_NOMEM) return loom_fail_nomem(err, "building the optimizer of pipeline stage %d", tr->ps.pp_rank);
  if (st == LOOM_OK) loom_trainer_publish_weights(tr);
  return st;
}

void loom_trainer_publish_weights(loom_trainer *tr) {
  for (int c = 0; tr->zero && c < loom_pipeline_chunk_count(tr->pipe); c++) {
    loom_gpt *m = loom_pipeline_chunk(tr->pipe, c);
    loom_zero_publish(&tr->zero[c], &m->p, m->ops);
  }
}

/* ---- pipeline hooks ---- */

static int64_t hook_feed(void *ctx, int mb, int *tokens, int *targets) {
  loom_trainer *tr = ctx;
  return loom_dataset_batch(tr->data, tr->split, tr->first_sample + (int64_t)mb * tr->micro_batch, tr->T,
                            tr->micro_batch, tokens, targets);
}


/* One clipped AdamW step per chunk, with the norm over every stage: each
 * element once (the last stage's copy of the tied wte is not counted). The
 * norm is the same on every rank, so an inf or NaN anywhere makes every rank
 * skip the step together. */
static double hook_optimizer_step(void *ctx, loom_pipeline *pipe) {
  loom_trainer *tr = ctx;
  const int v = loom_pipeline_chunk_count(pipe);
  if (loom_fault_fires(LOOM_FAULT_NAN_GRAD, tr->step + 1, NULL)) { /* a test fault: one poisoned grad */
    const float nan = NAN;
    const loom_gpt *first = loom_pipeline_chunk(pipe, 0);
    float *g = tr->zero && tr->zero[0].grad ? tr->zero[0].grad : first->p.grads.base;
    first->ops->mem->from_host(first->ops->mem, g, &nan, sizeof nan);
  }
  double sumsq = 0.0, uncounted = 0.0;
  for (int c = 0; c < v; c++) {
    loom_gpt *m = loom_pipeline_chunk(pipe, c);
    const bool tied_copy = loom_stage_holds_tied_copy(&m->p.range);
    if (tr->zero) {
      double skipped;
      sumsq += loom_zero_reduce(&tr->zero[c], &m->p, m->ops, &m->tp, tied_copy, loom_pipeline_compression(pipe) != NULL,
                                loom_pipeline_grad16(pipe, c), &skipped);
      uncounted += skipped;
      continue;
    }
    double skipped; /* the tied copy: not in the norm, but it steps too */
    sumsq += loom_grad_sumsq(&m->p, m->ops, &m->tp, tied_copy, &skipped);
    uncounted += skipped;
  }
  double total = sumsq;
  loom_comm_allreduce_typed(tr->ps.pp_group, &total, 1, LOOM_DTYPE_F64, LOOM_REDUCE_SUM);
  /* Every rank must agree to skip, wherever the inf or NaN came from. */
  int32_t bad = !(isfinite(total) && isfinite(uncounted));
  loom_comm_allreduce_typed(tr->ps.world_group, &bad, 1, LOOM_DTYPE_I32, LOOM_REDUCE_MAX);
  const double norm = bad ? NAN : sqrt(total);
  if (!isfinite(norm)) return norm;
  for (int c = 0; c < v; c++) {
    loom_gpt *m = loom_pipeline_chunk(pipe, c);
    if (tr->zero) loom_zero_step(&tr->zero[c], &m->p, tr->step_lr, norm, m->ops);
    else loom_adamw_step(&tr->opts[c], &m->p, tr->step_lr, norm, m->ops);
  }
  return norm;
}

/* Exact-match scoring of one micro-batch of the addition task. */
static void score_addition(int digits, int T, int B, const int *tokens, const int *targets, const int *pred,
                           int64_t *tally) {
  int *window = loom_xmalloc((size_t)(T + 1) * sizeof(int), "eval window");
  int *row = loom_xmalloc((size_t)T * sizeof(int), "eval row");
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      window[t] = tokens[t * B + b];
      row[t] = pred[t * B + b];
    }
    window[T] = targets[(T - 1) * B + b]; /* may be -1 (masked); scoring only reads answers */
    int problems, correct;
    loom_addition_score(window, row, T, digits, &problems, &correct);
    tally[0] += problems;
    tally[1] += correct;
  }
  free(window);
  free(row);
}

static void hook_score(void *ctx, const int *tokens, const int *targets, const int *pred, int64_t *tally) {
  const loom_trainer *tr = ctx;
  score_addition(tr->digits, tr->T, tr->micro_batch, tokens, targets, pred, tally);
}

static loom_pipeline_hooks hooks_of(loom_trainer *tr, bool score) {
  return (loom_pipeline_hooks){.ctx = tr, .feed = hook_feed, .optimizer_step = hook_optimizer_step,
                               .score = score ? hook_score : NULL};
}

void loom_trainer_free(loom_trainer *tr) {
  free(tr->moe_load);
  free(tr->expert_bias);
  free(tr->fp8_scale), free(tr->fp8_step_amax), free(tr->fp8_history);
  tr->fp8_scale = tr->fp8_step_amax = tr->fp8_history = NULL, tr->fp8_count = 0;
  tr->moe_load = NULL;
  tr->expert_bias = NULL;
  free_optimizers(tr);
  loom_pipeline_free(tr->pipe);
  loom_parallel_free(&tr->ps);
  loom_rank_sheet_free(&tr->sheet);
}

/* The busiest expert's tokens over the mean in layer l of the last step. */
static double moe_imbalance(const loom_trainer *tr, int l) {
  const loom_gpt_config *c = &loom_pipeline_chunk(tr->pipe, 0)->p.cfg;
  const int E = c->moe.experts;
  const int64_t *load = tr->moe_load + (size_t)l * E;
  int64_t most = 0, sum = 0;
  for (int e = 0; e < E; e++) most = load[e] > most ? load[e] : most, sum += load[e];
  return sum ? (double)most * E / (double)sum : 0.0;
}

/* A MoE model's routing over the step: every rank's statistics summed
 * (collective over the world), and the expert bias stepped by them. Under SP each rank of a tp group routed its
 * share of the tokens; without it each routed them all, and one counts. */
static void moe_step(loom_trainer *tr, loom_step_stats *s) {
  const loom_gpt_config *c = &loom_pipeline_chunk(tr->pipe, 0)->p.cfg;
  if (!loom_gpt_is_moe(c)) return;
  const int L = loom_gpt_blocks(c), E = c->moe.experts;
  const bool counts = tr->ps.sequence_parallel || tr->ps.tp_rank == 0;
  double sums[3] = {0.0, 0.0, 0.0};
  if (!tr->moe_load) tr->moe_load = loom_xmalloc((size_t)L * E * sizeof *tr->moe_load, "expert load");
  memset(tr->moe_load, 0, (size_t)L * E * sizeof *tr->moe_load);
  for (int k = 0; counts && k < loom_pipeline_chunk_count(tr->pipe); k++) {
    const loom_gpt *m = loom_pipeline_chunk(tr->pipe, k);
    sums[0] += m->moe_stats.aux_loss, sums[1] += m->moe_stats.z_loss, sums[2] += (double)m->moe_stats.dropped;
    for (size_t i = 0; i < (size_t)m->p.layers * E; i++)
      tr->moe_load[(size_t)m->p.range.layer_begin * E + i] += m->moe_stats.load[i];
  }
  loom_comm_allreduce_typed(tr->ps.world_group, sums, 3, LOOM_DTYPE_F64, LOOM_REDUCE_SUM);
  for (int k = 0; k < loom_pipeline_chunk_count(tr->pipe); k++) {
    const int64_t most = loom_pipeline_chunk(tr->pipe, k)->moe_stats.most_rows;
    s->moe_rows = most > s->moe_rows ? most : s->moe_rows;
  }
  loom_comm_allreduce_typed(tr->ps.world_group, &s->moe_rows, 1, LOOM_DTYPE_I64, LOOM_REDUCE_MAX);
  tr->moe_rows_peak = s->moe_rows > tr->moe_rows_peak ? s->moe_rows : tr->moe_rows_peak;
  loom_comm_allreduce_typed(tr->ps.world_group, tr->moe_load, (size_t)L * E, LOOM_DTYPE_I64, LOOM_REDUCE_SUM);
  const double per = (double)(tr->global_batch / tr->micro_batch) * loom_gpt_moe_layers(c, 0, L); /* micro-batches x MoE layers */
  s->moe_aux_loss = sums[0] / per, s->moe_z_loss = sums[1] / per, s->moe_dropped = (int64_t)sums[2];
  for (int l = 0; tr->expert_bias && l < L; l++) /* every rank alike, from the same counts */
    loom_moe_expert_bias_update(tr->expert_bias + (size_t)l * E, tr->moe_load + (size_t)l * E, E, c->moe.bias_update_rate);
  for (int l = 0; l < L; l++) {
    const double r = moe_imbalance(tr, l);
    s->moe_load_imbalance = r > s->moe_load_imbalance ? r : s->moe_load_imbalance;
  }
}

/* Clears every chunk's routing and multi-token prediction statistics. */
static void stats_reset(loom_trainer *tr) {
  for (int k = 0; k < loom_pipeline_chunk_count(tr->pipe); k++) {
    loom_gpt_moe_stats_reset(loom_pipeline_chunk(tr->pipe, k));
    loom_gpt_mtp_stats_reset(loom_pipeline_chunk(tr->pipe, k));
  }
}

/* Multi-token prediction's loss over the forwards since stats_reset: every last stage's sums (collective over the
 * world), each tp group's once (its ranks compute the same losses); 0 without MTP. */
static double mtp_loss(loom_trainer *tr) {
  const loom_gpt_config *c = &loom_pipeline_chunk(tr->pipe, 0)->p.cfg;
  if (c->mtp_layers == 0) return 0.0;
  loom_gpt_mtp_stats sum = {0};
  for (int k = 0; tr->ps.tp_rank == 0 && k < loom_pipeline_chunk_count(tr->pipe); k++) {
    const loom_gpt_mtp_stats *m = &loom_pipeline_chunk(tr->pipe, k)->mtp_stats;
    sum.loss_sum += m->loss_sum, sum.scored += m->scored;
  }
  double sums[2] = {sum.loss_sum, (double)sum.scored};
  loom_comm_allreduce_typed(tr->ps.world_group, sums, 2, LOOM_DTYPE_F64, LOOM_REDUCE_SUM);
  sum = (loom_gpt_mtp_stats){.loss_sum = sums[0], .scored = (int64_t)sums[1]};
  return loom_gpt_mtp_loss(&sum, c->mtp_layers);
}

loom_step_stats loom_trainer_step(loom_trainer *tr, int step) {
  tr->split = LOOM_SPLIT_TRAIN;
  stats_reset(tr);
  /* Replica d takes its own m micro-batches of the global batch. */
  tr->first_sample = (int64_t)step * tr->global_batch + (int64_t)tr->ps.dp_rank * loom_pipeline_micro_batches(tr->pipe) * tr->micro_batch;
  tr->step_lr = loom_lr_at(&tr->lr, step);
  tr->step = step;
  const loom_pipeline_hooks hooks = hooks_of(tr, false);
  if (tr->fp8_count) memset(tr->fp8_step_amax, 0, tr->fp8_count * sizeof *tr->fp8_step_amax); /* this step's casts alone */
  const loom_pipeline_stats ps = loom_pipeline_step(tr->pipe, &hooks, step, tr->first_sample);
  fp8_step(tr);
  loom_step_stats s = {.loss = ps.loss, .lr = tr->step_lr, .grad_norm = ps.grad_norm, .skipped = !isfinite(ps.grad_norm),
                       .compute_s = ps.compute_s, .wait_s = ps.wait_s, .dp_overlap = ps.dp_overlap, .dp_wait_s = ps.dp_wait_s};
  moe_step(tr, &s);
  s.mtp_loss = mtp_loss(tr);
  return s;
}

loom_status loom_trainer_eval(loom_trainer *tr, int batches, int addition_digits, loom_eval_stats *out,
                              loom_error *err) {
  tr->split = LOOM_SPLIT_HELDOUT;
  tr->first_sample = 0;
  tr->digits = addition_digits;
  const loom_pipeline_hooks hooks = hooks_of(tr, addition_digits > 0);
  int64_t tally[2] = {0, 0};
  stats_reset(tr);
  const loom_status st = loom_pipeline_eval(tr->pipe, &hooks, batches, &out->loss, tally, err);
  out->mtp_loss = st == LOOM_OK ? mtp_loss(tr) : 0.0;
  out->problems = (int)tally[0];
  out->correct = (int)tally[1];
  return st;
}

loom_memory loom_trainer_memory(const loom_trainer *tr) { return loom_rank_sheet_memory(&tr->sheet); }

int loom_trainer_buffers(const loom_trainer *tr, const loom_buffer_row **rows) {
  *rows = tr->sheet.buffers;
  return tr->sheet.nbuffers;
}

double loom_trainer_tensor_peak(const loom_trainer *tr) {
  return (double)tr->mem->counts(tr->mem).peak - (double)tr->baseline_tensor;
}

size_t loom_trainer_local_params(const loom_trainer *tr) {
  size_t n = 0;
  for (int c = 0; c < loom_pipeline_chunk_count(tr->pipe); c++) n += loom_pipeline_chunk(tr->pipe, c)->p.params.numel;
  return n;
}

/* Bytes a buffer's storage takes (none for a layout). */
static double stored(const loom_buffer *b) { return b->base ? (double)b->capacity * loom_dtype_size(b->dtype) : 0.0; }

loom_held_bytes loom_trainer_held_bytes(const loom_trainer *tr) {
  loom_held_bytes h = {0};
  for (int c = 0; c < loom_pipeline_chunk_count(tr->pipe); c++) {
    const loom_gpt_params *p = &loom_pipeline_chunk(tr->pipe, c)->p;
    h.weights += stored(&p->params) + stored(&p->compute);
    h.grads += stored(&p->grads);
    if (!tr->zero) {
      h.optimizer += 2.0 * sizeof(float) * (double)p->params.numel;
      continue;
    }
    const loom_zero *z = &tr->zero[c];
    h.weights += z->master ? sizeof(float) * (double)z->shard : 0.0; /* the master pieces */
    h.optimizer += 2.0 * sizeof(float) * (double)z->shard;
    h.grads += (double)loom_zero_grad_bytes(z);
    h.transient += (double)loom_zero_transit_bytes(z);
  }
  h.transient += (double)loom_pipeline_transient_bytes(tr->pipe);
  return h;
}
