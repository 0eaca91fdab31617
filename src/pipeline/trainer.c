/* Training step and held-out evaluation on one rank. */
#include <math.h>
#include <stdlib.h>
#include "pipeline/trainer.h"
#include "core/check.h"
#include "data/addition.h"

void loom_trainer_init(loom_trainer *tr, loom_gpt *model, loom_adamw *opt, loom_dataset *data,
                       int T, int micro_batch, int global_batch, loom_lr_schedule lr) {
  LOOM_CHECK(global_batch % micro_batch == 0, "global batch is a multiple of the micro-batch");
  *tr = (loom_trainer){.model = model, .opt = opt, .lr = lr, .data = data, .T = T,
                       .micro_batch = micro_batch, .global_batch = global_batch};
  tr->tokens = loom_xmalloc((size_t)T * micro_batch * sizeof(int), "batch tokens");
  tr->targets = loom_xmalloc((size_t)T * micro_batch * sizeof(int), "batch targets");
}

void loom_trainer_init_pipeline(loom_trainer *tr, loom_pipeline *pipe, loom_adamw *opts, loom_dataset *data,
                                int T, int micro_batch, loom_lr_schedule lr) {
  *tr = (loom_trainer){.opt = opts, .pipe = pipe, .lr = lr, .data = data, .T = T, .micro_batch = micro_batch,
                       .global_batch = pipe->m * micro_batch * pipe->ps->dp};
  tr->tokens = loom_xmalloc((size_t)T * micro_batch * sizeof(int), "batch tokens");
  tr->targets = loom_xmalloc((size_t)T * micro_batch * sizeof(int), "batch targets");
}

/* ---- pipeline hooks ---- */

static int64_t hook_feed(void *ctx, int mb, int *tokens, int *targets) {
  loom_trainer *tr = ctx;
  return loom_dataset_batch(tr->data, tr->split, tr->first_sample + (int64_t)mb * tr->micro_batch, tr->T,
                            tr->micro_batch, tokens, targets);
}

/* Fault injection for tests: LOOM_TEST_NAN_STEP=k (1-based) and
 * LOOM_TEST_NAN_RANK=r put a NaN into rank r's grads at step k. */
static void inject_nan(const loom_trainer *tr, loom_gpt_params *p, int rank) {
  const char *step = getenv("LOOM_TEST_NAN_STEP"), *who = getenv("LOOM_TEST_NAN_RANK");
  if (step && atoi(step) == tr->step + 1 && (!who || atoi(who) == rank)) ((float *)p->grads.base)[0] = NAN;
}

/* One clipped AdamW step per chunk, with the norm over every stage: each
 * element once (the last stage's copy of the tied wte is not counted). The
 * norm is the same on every rank, so an inf or NaN anywhere makes every rank
 * skip the step together. */
static double hook_optimizer_step(void *ctx, loom_pipeline *pipe) {
  loom_trainer *tr = ctx;
  loom_comm *dp = pipe->ps->dp_group;
  inject_nan(tr, &pipe->chunks[0].p, pipe->ps->rank);
  double sumsq = 0.0, uncounted = 0.0;
  for (int c = 0; c < pipe->v; c++) {
    loom_gpt *m = &pipe->chunks[c];
    const bool tied_copy = loom_stage_holds_tied_copy(&m->p.range);
    sumsq += tr->zero ? loom_zero1_reduce(&tr->zero[c], &m->p, dp, m->ops, &m->tp, tied_copy)
                      : loom_grad_sumsq(&m->p, m->ops, &m->tp, tied_copy);
    for (int k = 0; tied_copy && k < m->p.grads.count; k++) /* not in the norm, but it steps too */
      if (m->p.meta[k].shared) uncounted += m->ops->sumsq(m->p.grads.views[k].data, loom_tensor_numel(&m->p.grads.views[k]));
  }
  double total = sumsq;
  loom_comm_allreduce_typed(pipe->ps->pp_group, &total, 1, LOOM_DTYPE_F64, LOOM_REDUCE_SUM);
  /* Every rank must agree to skip, wherever the inf or NaN came from. */
  int32_t bad = !(isfinite(total) && isfinite(uncounted));
  loom_comm_allreduce_typed(pipe->ps->world_group, &bad, 1, LOOM_DTYPE_I32, LOOM_REDUCE_MAX);
  const double norm = bad ? NAN : sqrt(total);
  if (!isfinite(norm)) return norm;
  for (int c = 0; c < pipe->v; c++) {
    loom_gpt *m = &pipe->chunks[c];
    if (tr->zero) loom_zero1_step(&tr->zero[c], &m->p, tr->step_lr, norm, dp, m->ops);
    else loom_adamw_step(&tr->opt[c], &m->p, tr->step_lr, norm, m->ops);
  }
  return norm;
}

/* Exact-match scoring of one micro-batch of the addition task. */
static void score_addition(int digits, int T, int B, const int *tokens, const int *targets, const int *pred,
                           float *tally) {
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
    tally[0] += (float)problems;
    tally[1] += (float)correct;
  }
  free(window);
  free(row);
}

static void hook_score(void *ctx, const int *tokens, const int *targets, const int *pred, float *tally) {
  const loom_trainer *tr = ctx;
  score_addition(tr->digits, tr->T, tr->micro_batch, tokens, targets, pred, tally);
}

static loom_pipeline_hooks hooks_of(loom_trainer *tr, bool score) {
  return (loom_pipeline_hooks){.ctx = tr, .feed = hook_feed, .optimizer_step = hook_optimizer_step,
                               .score = score ? hook_score : NULL};
}

void loom_trainer_free(loom_trainer *tr) {
  free(tr->tokens);
  free(tr->targets);
}

loom_step_stats loom_trainer_step(loom_trainer *tr, int step) {
  if (tr->pipe) {
    tr->split = LOOM_SPLIT_TRAIN;
    /* Replica d takes its own m micro-batches of the global batch. */
    tr->first_sample = (int64_t)step * tr->global_batch + (int64_t)tr->pipe->ps->dp_rank * tr->pipe->m * tr->micro_batch;
    tr->step_lr = loom_lr_at(&tr->lr, step);
    tr->step = step;
    const loom_pipeline_hooks hooks = hooks_of(tr, false);
    const loom_pipeline_stats ps = loom_pipeline_step(tr->pipe, &hooks, step, tr->first_sample);
    return (loom_step_stats){.loss = ps.loss, .lr = tr->step_lr, .grad_norm = ps.grad_norm,
                             .skipped = !isfinite(ps.grad_norm), .compute_s = ps.compute_s, .wait_s = ps.wait_s,
                             .dp_overlap = ps.dp_overlap, .dp_wait_s = ps.dp_wait_s};
  }
  loom_gpt *m = tr->model;
  const int B = tr->micro_batch, micro_steps = tr->global_batch / B;
  const int64_t first_sample = (int64_t)step * tr->global_batch;
  loom_step_stats out = {.lr = loom_lr_at(&tr->lr, step)};
  /* The loss is the mean over every scored target of the global batch, so
   * count them first: each micro-batch's grads are then weighted alike. */
  int64_t scored = 0;
  for (int k = 0; k < micro_steps; k++)
    scored += loom_dataset_batch(tr->data, LOOM_SPLIT_TRAIN, first_sample + (int64_t)k * B, tr->T, B, tr->tokens, tr->targets);
  const float dloss = scored ? 1.0f / (float)scored : 0.0f;
  double loss_sum = 0.0;
  loom_gpt_zero_grad(m);
  for (int k = 0; k < micro_steps; k++) {
    const int64_t first = first_sample + (int64_t)k * B;
    const int64_t counted = loom_dataset_batch(tr->data, LOOM_SPLIT_TRAIN, first, tr->T, B, tr->tokens, tr->targets);
    const loom_gpt_batch batch = {.tokens = tr->tokens, .targets = tr->targets,
                                  .sample_offset = first, .step = step, .train = true};
    loss_sum += (double)loom_gpt_forward(m, &batch) * (double)counted;
    loom_gpt_backward(m, &batch, dloss);
  }
  out.loss = scored ? (float)(loss_sum / (double)scored) : 0.0f;
  loom_gpt_sync_replicated_grads(m);
  tr->step = step;
  inject_nan(tr, &m->p, 0);
  out.grad_norm = loom_grad_norm(&m->p, m->ops, &m->tp);
  out.skipped = !isfinite(out.grad_norm);
  if (!out.skipped) loom_adamw_step(tr->opt, &m->p, out.lr, out.grad_norm, m->ops);
  return out;
}

loom_eval_stats loom_trainer_eval(loom_trainer *tr, int batches, int addition_digits) {
  if (tr->pipe) {
    tr->split = LOOM_SPLIT_HELDOUT;
    tr->first_sample = 0;
    tr->digits = addition_digits;
    const loom_pipeline_hooks hooks = hooks_of(tr, addition_digits > 0);
    float tally[2] = {0.0f, 0.0f};
    const float loss = loom_pipeline_eval(tr->pipe, &hooks, batches, tally);
    return (loom_eval_stats){.loss = loss, .problems = (int)tally[0], .correct = (int)tally[1]};
  }
  loom_gpt *m = tr->model;
  const int B = tr->micro_batch, T = tr->T, N = T * B;
  int *pred = loom_xmalloc((size_t)N * sizeof(int), "predictions");
  loom_eval_stats out = {0};
  float tally[2] = {0.0f, 0.0f};
  double loss_sum = 0.0;
  int64_t scored = 0;
  for (int k = 0; k < batches; k++) {
    const int64_t counted = loom_dataset_batch(tr->data, LOOM_SPLIT_HELDOUT, (int64_t)k * B, T, B, tr->tokens, tr->targets);
    const loom_gpt_batch batch = {.tokens = tr->tokens, .targets = tr->targets, .sample_offset = (int64_t)k * B};
    loss_sum += (double)loom_gpt_forward(m, &batch) * (double)counted;
    scored += counted;
    if (addition_digits <= 0) continue;
    loom_gpt_predict(m, pred);
    score_addition(addition_digits, T, B, tr->tokens, tr->targets, pred, tally);
  }
  out.loss = scored ? (float)(loss_sum / (double)scored) : 0.0f;
  out.problems = (int)tally[0];
  out.correct = (int)tally[1];
  free(pred);
  return out;
}
