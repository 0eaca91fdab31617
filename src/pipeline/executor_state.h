/* What a pipeline holds: the executor's own (executor.c, grad_sync.c,
 * trace.c and a test that breaks it on purpose read it); everyone else asks
 * pipeline/executor.h's accessors. */
#ifndef LOOM_EXECUTOR_STATE_H
#define LOOM_EXECUTOR_STATE_H

#include "optim/grad_compress.h"
#include "pipeline/buffer_pool.h"
#include "pipeline/executor.h"
#include "pipeline/p2p.h"
#include "pipeline/zero_runtime.h"

struct loom_pipeline {
  const loom_parallel *ps;
  const loom_rank_sheet *sheet; /* what the pipeline is built from */
  loom_tp tp;
  const loom_schedule *sched;   /* the sheet's */
  int v, S, m, T, B;
  loom_gpt *chunks;       /* [v] */
  loom_schedule eval_sched; /* forward-only, built on the first evaluation */
  int eval_batches, eval_round; /* the last evaluation's batches, and the rounds it ran them in */
  /* The buffers the schedule's events hand out (schedule/schedule.h). */
  loom_buffer_pool slots;   /* activations of a micro-batch on a chunk */
  loom_buffer_pool wstates; /* split backwards' weight-grad states: taken at B, returned at W */
  loom_p2p p2p;             /* transfers, and the send buffers */
  float *dout;            /* [n, h] received output grad */
  const loom_allocator *mem;  /* the backend's memory: slots, dout, send buffers */
  int *tokens, *targets;  /* [T * B] the micro-batch being fed */
  int *pred;              /* [T * B] greedy predictions, for the score hook */
  /* Context parallelism: this rank's rows of those, [T / cp * B] (what
   * the model sees, at its chunks' cp_pos); else NULL. */
  int *local_tokens, *local_targets, *local_pred;
  int *mtp; /* context parallelism with multi-token prediction: [2 D] this rank's rows of each depth's tokens ahead, then
             * targets (the batch's), then [2 D] the whole sequence's (NULL: none, the model shifts its own) */
  int zero_stage;          /* the plan's: 0 (none) to 3 */
  bool grads_bf16;         /* grad_reduce bf16 with dp x cp > 1: grads cross dp as bf16 */
  loom_zero_runtime *zero; /* [v] under ZeRO-2/3 once loom_pipeline_use_zero attached them, else NULL */
  bool final_backward;     /* the backward under way is its chunk's last of the step */
  /* Data-parallel buckets: layers' grads, final after the last micro-batch's
   * backward, are all-reduced in contiguous buckets while backward goes on. */
  size_t bucket_bytes;
  size_t open_lo, open_hi;   /* the bucket being filled (flat offsets in one chunk's grads) */
  int nbucket;
  loom_request **bucket_req; /* [3 (layers + 1)] in flight this step: a bucket's, or under expert parallelism each run of
                              * it alike (experts or not: at most 3 a layer) */
  size_t *bucket_at;         /* [4 of each] its chunk, lo, hi, and 1 where it sums experts over expert data parallelism */
  uint16_t **grad16;         /* [v] with grad_reduce bf16: each chunk's grads as they cross dp, else NULL */
  loom_grad_compress *compress; /* [v] with grad compression: each chunk's state, else NULL (no buckets then) */
  size_t overlapped;         /* grad floats posted during backward this step */
  /* When tracing, each action of a step as (kind, mb, chunk, start ns, end ns,
   * its index in the schedule) from the step's start (after a barrier over
   * the world group): integers, exact however long the step. */
  bool tracing;
  loom_ring_log ring_log; /* context parallelism: the ring's spans of the traced step (every chunk's ring keeps them here) */
  int64_t *trace;
  int trace_count, trace_cap;
};

#define LOOM_TRACE_FIELDS 6

#endif
