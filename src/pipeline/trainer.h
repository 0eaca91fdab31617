/* A training run built from a plan's rank sheet (plan/rank_sheet.h), and
 * nothing else: this rank's grid coordinates, its pipeline chunks, their optimizers (AdamW, or ZeRO's
 * pieces of it, with the fp32 master weights' pieces where the model holds
 * none), the step over one global batch (grad accumulation through the
 * plan's schedule, the grad norm over every stage, the NaN skip, clipping and
 * AdamW) and held-out evaluation through the forward-only schedule. Every
 * layout, (1,1,1) included, runs here.
 *
 * Sample g of step s is s * global_batch + g, so the data is the same for any
 * split of the global batch into micro-batches and replicas. */
#ifndef LOOM_TRAINER_H
#define LOOM_TRAINER_H

#include "data/dataset.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "optim/zero.h"
#include "pipeline/executor.h"
#include "plan/memory.h"

/* What a run needs beyond its plan. */
typedef struct {
  uint64_t seed;        /* weight init and dropout */
  size_t bucket_bytes;  /* data-parallel grad buckets reduced during backward (0: at the end) */
  float weight_decay, grad_clip;
  loom_lr_schedule lr;
  bool forward_only;    /* evaluation only: no optimizer state (loom_trainer_step may not be called) */
} loom_trainer_options;

typedef struct {
  const loom_plan *plan;
  loom_rank_sheet sheet; /* this rank's part of the plan, which everything below is built from */
  loom_parallel ps;
  loom_pipeline *pipe;
  loom_adamw *opts;  /* [loom_pipeline_chunk_count(pipe)] */
  loom_zero *zero;  /* [loom_pipeline_chunk_count(pipe)] under ZeRO (then opts is unused), else NULL */
  loom_dataset *data; /* not owned */
  loom_lr_schedule lr;
  int T, micro_batch, global_batch;
  const loom_allocator *mem; /* the backend's memory, counted */
  size_t baseline_tensor;    /* bytes it held before the run */
  /* what the pipeline hooks read */
  loom_split split;
  int64_t first_sample;
  float step_lr;
  int step;
  int digits;
  int64_t *moe_load; /* a MoE model's tokens per expert of each layer [layers * experts] in the last step, every rank's */
  /* model.moe.expert_bias: every layer's bias per expert [layers * experts],
   * the same on every rank (the chunks route with their rows); NULL: none. */
  float *expert_bias;
  size_t expert_bias_count;
  /* FP8 delayed scaling: every FP8 operand's scale, its amax this step (this rank's until the step's end), and its
   * amax history (oldest first, fp8.history each), [fp8_count] ([fp8_count x history]) over the whole model */
  float *fp8_scale, *fp8_step_amax, *fp8_history;
  size_t fp8_count;
  int64_t moe_rows_peak; /* the most rows any rank's experts took in one layer's forward, over the run's steps */
} loom_trainer;

typedef struct {
  float loss;       /* mean over the global batch (the main head's: Megatron's lm loss) */
  double mtp_loss;  /* multi-token prediction's: its modules' mean loss, the same on every rank (0: none) */
  float lr;
  double grad_norm; /* before clipping */
  bool skipped;     /* the grads held an inf or NaN somewhere: no rank stepped */
  double compute_s, wait_s; /* this rank's compute and waiting time */
  double dp_overlap, dp_wait_s; /* data-parallel grad bytes reduced during backward, and the wait after it */
  /* A MoE model's routing over the step, the same on every rank (0 for a
   * dense model): the router losses per MoE layer and micro-batch, their
   * coefficients included (as Megatron-LM logs load_balancing_loss and
   * z_loss), the choices dropped over capacity, and the busiest expert's
   * tokens over the mean at the most unbalanced layer (tokens per expert of
   * each layer: loom_trainer.moe_load). */
  double moe_aux_loss, moe_z_loss, moe_load_imbalance;
  int64_t moe_dropped;
  int64_t moe_rows; /* the most rows any rank's experts took in one layer's forward (the memory model allots
                     * loom_moe_recv_rows: loom_trainer_moe_rows_bound) */
} loom_step_stats;

typedef struct {
  float loss;            /* the main head's */
  double mtp_loss;       /* multi-token prediction's modules' mean loss (0: none) */
  int problems, correct; /* exact match, when the data is the addition task */
} loom_eval_stats;

/* Builds this rank's part of a validated plan (loom_plan_validate) over the
 * world communicator: fills its rank sheet, once, and builds the chunks,
 * buffers and optimizers from it; the plan and data must outlive the
 * trainer. */
loom_status loom_trainer_init(loom_trainer *tr, loom_comm *world, const loom_plan *plan, const loom_ops *ops,
                              loom_dataset *data, const loom_trainer_options *o, loom_error *err);
void loom_trainer_free(loom_trainer *tr);
/* After the weights were loaded (a resume, --init-from): under the
 * distributed optimizer, all-gathers the master slices, rounded to bf16,
 * into the compute weights (collective over dp); else nothing to do, as
 * each step rounds the master weights it holds. */
void loom_trainer_publish_weights(loom_trainer *tr);
/* Trains on global batch `step` (0-based). */
loom_step_stats loom_trainer_step(loom_trainer *tr, int step);
/* Mean loss over `batches` held-out micro-batches; scores addition if digits > 0. */
loom_status loom_trainer_eval(loom_trainer *tr, int batches, int addition_digits, loom_eval_stats *out,
                              loom_error *err);
/* Local parameters over this rank's chunks. */
size_t loom_trainer_local_params(const loom_trainer *tr);
/* The tensor memory this rank allocates by the memory model (plan/memory.h): its sheet's buffer list by kind. */
loom_memory loom_trainer_memory(const loom_trainer *tr);
/* That list, row by row; returns the number of rows. */
int loom_trainer_buffers(const loom_trainer *tr, const loom_buffer_row **rows);
/* The most tensor memory this rank has held at once since loom_trainer_init
 * began, over what its allocator held before: the backend allocator's count. */
double loom_trainer_tensor_peak(const loom_trainer *tr);
/* Bytes this rank holds for its chunks' parameters, read off what it allocated. */
typedef struct {
  double weights;   /* the model's fp32 and bf16 weights, and ZeRO's master pieces */
  double grads;     /* the model's grads, or ZeRO-2/3's summed pieces */
  double optimizer; /* Adam's moments (this replica's pieces under ZeRO) */
  double transient; /* ZeRO's buffers in transit: slices, staging, gathered weights and grads of the layers in flight */
} loom_held_bytes;
loom_held_bytes loom_trainer_held_bytes(const loom_trainer *tr);

#endif
