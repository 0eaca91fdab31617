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
#include "optim/zero.h"
#include "optim/grad_compress.h"
#include "plan/grad_compression.h"
#include "plan/rank_sheet.h"
#include "schedule/schedule.h"
#include "tensor_parallel/parallel_state.h"

/* Opaque: a pipeline is asked, through the accessors below, for what it holds. */
typedef struct loom_pipeline loom_pipeline;

/* The caller's side of a step. */
typedef struct {
  void *ctx;
  /* Writes micro-batch mb of the current step (or evaluation) into tokens and
   * targets [T * B]; returns how many targets are scored (>= 0). */
  int64_t (*feed)(void *ctx, int mb, int *tokens, int *targets);
  /* Steps every chunk's parameters once grads are final; returns the grad norm. */
  double (*optimizer_step)(void *ctx, loom_pipeline *pipe);
  /* Evaluation only, on the last stage: scores micro-batch mb's greedy
   * predictions pred[T * B]; adds to tally[0] (problems) and tally[1] (correct). */
  void (*score)(void *ctx, const int *tokens, const int *targets, const int *pred, int64_t *tally);
} loom_pipeline_hooks;


typedef struct {
  float loss;       /* mean over the global batch's scored targets */
  double grad_norm; /* before clipping */
  double compute_s; /* this rank's time in forward and backward passes */
  double wait_s;    /* this rank's time in recvs, reductions and the optimizer step */
  double dp_overlap;   /* share of grad bytes whose data-parallel reduction started during backward */
  double dp_wait_s;    /* time spent finishing those reductions after backward */
} loom_pipeline_stats;

/* Builds this rank's chunks from its sheet (plan/rank_sheet.h): their
 * stages, recompute and buffers, the schedule, the micro-batches and the ZeRO
 * stage; ps is the sheet's grid. Both must outlive the pipeline. bucket_bytes: data-parallel grad
 * buckets reduced during backward (0: all at the end). zero_dp > 0: the
 * chunks are built for the plan's ZeRO stage over that many replicas
 * (loom_gpt_init_stage). On failure *out is NULL. */
loom_status loom_pipeline_new(loom_pipeline **out, const loom_parallel *ps, const loom_rank_sheet *sheet, const loom_ops *ops,
                              uint64_t seed, size_t bucket_bytes, int zero_dp, loom_error *err);
/* Frees what loom_pipeline_new built (NULL is fine). */
void loom_pipeline_free(loom_pipeline *pipe);
/* This rank's chunks (the plan's virtual chunks), and chunk c of them. */
int loom_pipeline_chunk_count(const loom_pipeline *pipe);
loom_gpt *loom_pipeline_chunk(const loom_pipeline *pipe, int c);
/* Micro-batches of a training step. */
int loom_pipeline_micro_batches(const loom_pipeline *pipe);
/* The verified training schedule this rank runs. */
const loom_schedule *loom_pipeline_schedule(const loom_pipeline *pipe);
/* The grad compression this run's dp reduction uses, or NULL. */
const loom_compression *loom_pipeline_compression(const loom_pipeline *pipe);
/* Chunk c's grad compression state (what checkpoints hold of it), or NULL without compression. */
loom_grad_compress *loom_pipeline_compression_state(const loom_pipeline *pipe, int c);
/* Chunk c's bf16 grads as they cross dp (grad_reduce bf16), room for its padded grads; NULL in fp32. */
uint16_t *loom_pipeline_grad16(const loom_pipeline *pipe, int c);
/* Trace the next steps' actions (for loom_trace_write) or not. */
void loom_pipeline_set_tracing(loom_pipeline *pipe, bool on);
/* What the run has used of its buffers: the most slots and weight-grad
 * states any chunk holds (their pools' size), and the bytes its sends have
 * carried to other ranks so far. */
typedef struct {
  int slots, weight_states;
  int64_t p2p_bytes;
} loom_pipeline_usage;
loom_pipeline_usage loom_pipeline_usage_of(const loom_pipeline *pipe);
/* Under ZeRO-2/3: runs the passes with the chunks' optimizers zero[v]
 * (loom_zero_runtime); a no-op otherwise. */
loom_status loom_pipeline_use_zero(loom_pipeline *pipe, loom_zero *zero);
/* The chunk of this rank holding virtual stage `stage`, or -1. */
int loom_pipeline_chunk_holding(const loom_pipeline *pipe, int stage);
/* Bytes of the ZeRO-2/3 transient buffers: gathered weights and grads in flight. */
size_t loom_pipeline_transient_bytes(const loom_pipeline *pipe);
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
                               int64_t *tally, loom_error *err);

#endif
