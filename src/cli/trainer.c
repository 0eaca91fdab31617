/* Training step and held-out evaluation on one rank. */
#include <stdlib.h>
#include "cli/trainer.h"
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

void loom_trainer_free(loom_trainer *tr) {
  free(tr->tokens);
  free(tr->targets);
}

loom_step_stats loom_trainer_step(loom_trainer *tr, int step) {
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
  out.grad_norm = loom_grad_norm(&m->p, m->ops, &m->tp);
  loom_adamw_step(tr->opt, &m->p, out.lr, out.grad_norm, m->ops);
  return out;
}

loom_eval_stats loom_trainer_eval(loom_trainer *tr, int batches, int addition_digits) {
  loom_gpt *m = tr->model;
  const int B = tr->micro_batch, T = tr->T, N = T * B;
  int *pred = loom_xmalloc((size_t)N * sizeof(int), "predictions");
  int *window = loom_xmalloc((size_t)(T + 1) * sizeof(int), "eval window");
  int *row_pred = loom_xmalloc((size_t)T * sizeof(int), "eval row");
  loom_eval_stats out = {0};
  double loss_sum = 0.0;
  int64_t scored = 0;
  for (int k = 0; k < batches; k++) {
    const int64_t counted = loom_dataset_batch(tr->data, LOOM_SPLIT_HELDOUT, (int64_t)k * B, T, B, tr->tokens, tr->targets);
    const loom_gpt_batch batch = {.tokens = tr->tokens, .targets = tr->targets, .sample_offset = (int64_t)k * B};
    loss_sum += (double)loom_gpt_forward(m, &batch) * (double)counted;
    scored += counted;
    if (addition_digits <= 0) continue;
    loom_gpt_predict(m, pred);
    for (int b = 0; b < B; b++) {
      for (int t = 0; t < T; t++) {
        window[t] = tr->tokens[t * B + b];
        row_pred[t] = pred[t * B + b];
      }
      window[T] = tr->targets[(T - 1) * B + b]; /* may be -1 (masked); scoring only needs answers */
      int problems, correct;
      loom_addition_score(window, row_pred, T, addition_digits, &problems, &correct);
      out.problems += problems;
      out.correct += correct;
    }
  }
  out.loss = scored ? (float)(loss_sum / (double)scored) : 0.0f;
  free(pred);
  free(window);
  free(row_pred);
  return out;
}
