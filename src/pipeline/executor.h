/* The pipeline executor: runs this rank's list of a verified schedule.
 *
 * A rank holds v model chunks (virtual stages r, p + r, ..., or a V's r and
 * 2p-1-r), each with its own parameters, optimizer state and activation
 * slots. Slots, a split backward's weight-grad states and send buffers
 * are taken and given back exactly where the schedule's buffer events say,
 * and a rank holds as many of each as those events reach at their peak.
 * Activations and grads move between neighbouring stages with non-blocking
 * sends (pipeline/p2p.h); a recv waits where the schedule says. Grads accumulate
 * over micro-batches and the tied wte grads are summed over the first and
 * last stage. What data is and how parameters step are the caller's: it
 * passes them in as hooks (data and optimizers sit above this module). */
#ifndef LOOM_EXECUTOR_H
#define LOOM_EXECUTOR_H

#include "layers/gpt.h"
#include "optim/grad_compress.h"
#include "pipeline/buffer_pool.h"
#include "pipeline/p2p.h"
#include "pipeline/zero_runtime.h"
#include "plan/plan.h"
#include "schedule/schedule.h"
#include "tensor_parallel/parallel_state.h"

struct loom_pipeline;

/* The caller's side of a step. */
typedef struct {
  void *ctx;
  /* Writes micro-batch mb of the current step (or evaluation) into tokens and
   * targets [T * B]; returns how many targets are scored (>= 0). */
  int64_t (*feed)(void *ctx, int mb, int *tokens, int *targets);
  /* Steps every chunk's parameters once grads are final; returns the grad norm. */
  double (*optimizer_step)(void *ctx, struct loom_pipeline *pipe);
  /* Evaluation only, on the last stage: scores micro-batch mb's greedy
   * predictions pred[T * B]; adds to tally[0] (problems) and tally[1] (correct). */
  void (*score)(void *ctx, const int *tokens, const int *targets, const int *pred, float *tally);
} loom_pipeline_hooks;

typedef struct loom_pipeline {
  const loom_parallel *ps;
  loom_tp tp;
  loom_schedule sched;
  int v, S, m, T, B;
  loom_gpt *chunks;       /* [v] */
  loom_schedule eval_sched; /* forward-only, built on the first evaluation */
  int eval_batches, eval_round; /* the last evaluation's batches, and the rounds it ran them in */
  int *send_cap;            /* [pp] each pipeline rank's send buffers, by the memory model */
  /* The buffers the schedule's events hand out (schedule/schedule.h). */
  loom_buffer_pool slots;   /* activations of a micro-batch on a chunk */
  loom_buffer_pool wstates; /* split backwards' weight-grad states: taken at B, returned at W */
  loom_p2p p2p;             /* transfers, and the send buffers */
  float *dout;            /* [n, h] received output grad */
  const loom_allocator *mem;  /* the backend's memory: slots, dout, send buffers */
  int *tokens, *targets;  /* [T * B] the micro-batch being fed */
  int *pred;              /* [T * B] greedy predictions, for the score hook */
  int zero_stage;          /* the plan's: 0 (none) to 3 */
  loom_zero_runtime *zero; /* [v] under ZeRO-2/3 once loom_pipeline_use_zero attached them, else NULL */
  bool final_backward;     /* the backward under way is its chunk's last of the step */
  /* Data-parallel buckets: layers' grads, final after the last micro-batch's
   * backward, are all-reduced in contiguous buckets while backward goes on. */
  size_t bucket_bytes;
  size_t open_lo, open_hi;   /* the bucket being filled (flat offsets in one chunk's grads) */
  int nbucket;
  loom_request **bucket_req; /* [layers + 1] in flight this step */
  size_t *bucket_at;         /* [3 * (layers + 1)] each bucket's chunk, lo and hi */
  uint16_t **grad16;         /* [v] with grad_reduce bf16: each chunk's grads as they cross dp, else NULL */
  loom_grad_compress *compress; /* [v] with grad compression: each chunk's state, else NULL (no buckets then) */
  size_t overlapped;         /* grad floats posted during backward this step */
  /* When tracing, each action of a step as (kind, mb, chunk, start us, end us)
   * from the step's start (after a barrier over the world group). */
  bool tracing;
  float *trace;
  int trace_count, trace_cap;
} loom_pipeline;

#define LOOM_TRACE_FIELDS 5

typedef struct {
  float loss;       /* mean over the global batch's scored targets */
  double grad_norm; /* before clipping */
  double compute_s; /* this rank's time in forward and backward passes */
  double wait_s;    /* this rank's time in recvs, reductions and the optimizer step */
  double dp_overlap;   /* share of grad bytes whose data-parallel reduction started during backward */
  double dp_wait_s;    /* time spent finishing those reductions after backward */
} loom_pipeline_stats;

/* Builds this rank's chunks of a validated plan (loom_plan_validate): its
 * stages, schedule, micro-batches, recompute and ZeRO stage; ps is the plan's
 * grid. bucket_bytes: data-parallel grad buckets reduced during backward (0:
 * all at the end). zero_dp > 0: the chunks are built for the plan's ZeRO
 * stage over that many replicas (loom_gpt_init_stage). */
loom_status loom_pipeline_init(loom_pipeline *pipe, const loom_parallel *ps, const loom_plan *plan, const loom_ops *ops,
                               uint64_t seed, size_t bucket_bytes, int zero_dp, loom_error *err);
/* Under ZeRO-2/3: runs the passes with the chunks' optimizers zero[v]
 * (loom_zero_runtime); a no-op otherwise. */
loom_status loom_pipeline_use_zero(loom_pipeline *pipe, loom_zero *zero);
/* The chunk of this rank holding virtual stage `stage`, or -1. */
int loom_pipeline_chunk_holding(const loom_pipeline *pipe, int stage);
/* Bytes of the ZeRO-2/3 transient buffers: gathered weights and grads in flight. */
size_t loom_pipeline_transient_bytes(const loom_pipeline *pipe);
void loom_pipeline_free(loom_pipeline *pipe);
/* 32-bit words this rank's grads send over dp per step with compression,
 * and the words they would send whole (both 0 without compression). */
void loom_pipeline_dp_words(const loom_pipeline *pipe, int64_t *sent, int64_t *whole);
/* One training step; sample_offset is the global index of micro-batch 0's
 * first sample (dropout keys). Under data parallelism each replica runs its
 * own micro-batches; the loss is averaged over the whole global batch and
 * grads are summed over the replicas (the schedule's REDUCE_DP). */
loom_pipeline_stats loom_pipeline_step(loom_pipeline *pipe, const loom_pipeline_hooks *hooks, int step,
                                       int64_t sample_offset);
/* Evaluation: the forward-only schedule over `batches` micro-batches (made
 * by the same generator and checked by the same verifier as training's);
 * *loss is their mean loss and, with a score hook, tally[2] gets its totals.
 * The results reach every rank. */
loom_status loom_pipeline_eval(loom_pipeline *pipe, const loom_pipeline_hooks *hooks, int batches, float *loss,
                               float *tally, loom_error *err);

#endif
