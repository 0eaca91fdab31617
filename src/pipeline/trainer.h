/* One rank's training loop pieces: a step over the micro-batches of one
 * global batch (grad accumulation, clipping, AdamW), and held-out evaluation.
 * Sample g of step s is s * global_batch + g, so the data is the same for any
 * split of the global batch into micro-batches. */
#ifndef LOOM_TRAINER_H
#define LOOM_TRAINER_H

#include "data/dataset.h"
#include "layers/gpt.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "optim/zero1.h"
#include "pipeline/executor.h"

typedef struct {
  loom_gpt *model;        /* the whole model on this rank, or NULL under a pipeline */
  loom_adamw *opt;        /* [1], or [chunks] under a pipeline */
  loom_zero1 *zero;       /* [chunks] under ZeRO-1 (then opt is unused), else NULL */
  loom_pipeline *pipe;    /* NULL unless pipeline-parallel */
  loom_lr_schedule lr;
  loom_dataset *data;
  int T, micro_batch, global_batch;
  int *tokens, *targets; /* [T * micro_batch] */
  /* what the pipeline hooks read */
  loom_split split;
  int64_t first_sample;
  float step_lr;
  int step;
  int digits;
} loom_trainer;

typedef struct {
  float loss;       /* mean over the global batch */
  float lr;
  double grad_norm; /* before clipping */
  bool skipped;     /* the grads held an inf or NaN somewhere: no rank stepped */
  double compute_s, wait_s; /* this rank's compute and waiting time (pipelines; else the step and 0) */
  double dp_overlap, dp_wait_s; /* data-parallel grad bytes reduced during backward, and the wait after it */
} loom_step_stats;

typedef struct {
  float loss;
  int problems, correct; /* exact match, when the data is the addition task */
} loom_eval_stats;

void loom_trainer_init(loom_trainer *tr, loom_gpt *model, loom_adamw *opt, loom_dataset *data,
                       int T, int micro_batch, int global_batch, loom_lr_schedule lr);
/* The same over a pipeline: opts holds one optimizer per chunk, and the
 * global batch is the schedule's micro-batches times micro_batch. */
void loom_trainer_init_pipeline(loom_trainer *tr, loom_pipeline *pipe, loom_adamw *opts, loom_dataset *data,
                                int T, int micro_batch, loom_lr_schedule lr);
void loom_trainer_free(loom_trainer *tr);
/* Trains on global batch `step` (0-based). */
loom_step_stats loom_trainer_step(loom_trainer *tr, int step);
/* Mean loss over `batches` held-out micro-batches; scores addition if digits > 0. */
loom_eval_stats loom_trainer_eval(loom_trainer *tr, int batches, int addition_digits);

#endif
