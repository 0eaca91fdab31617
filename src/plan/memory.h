/* The memory model (DESIGN.md invariant 3b): every buffer a rank allocates
 * for a plan, by kind, computed from the layers' tables (parameters,
 * activations, weight-grad states, boundary messages) and the schedule's
 * buffer events (how many slots, states and send buffers a rank holds at
 * its peak). The runtime allocates these counts and sizes; the plan's
 * estimates and rules, `plan show`, `plan search`, `loom sim` and the run's
 * log read them, and the run compares the backend allocator's counted peak
 * with their total.
 *
 * What it covers is tensor memory, the backend allocator's: it leaves out
 * what the process holds besides (MPI, BLAS, the program, host staging of
 * data and checkpoints) and the CPU kernels' per-call scratch (docs/plans.md). */
#ifndef LOOM_PLAN_MEMORY_H
#define LOOM_PLAN_MEMORY_H

#include "layers/run_buffers.h"
#include "plan/plan.h"

typedef enum {
  LOOM_MEM_WEIGHTS = 0,      /* what the layers compute with: fp32, or the bf16 copy (none kept whole under ZeRO-3) */
  LOOM_MEM_MASTER,           /* fp32 master weights beside a bf16 copy or under ZeRO-3: this replica's pieces under ZeRO */
  LOOM_MEM_GRADS,            /* fp32 grads: this replica's pieces under ZeRO-2/3 */
  LOOM_MEM_OPTIMIZER,        /* Adam's two moments: this replica's pieces under ZeRO */
  LOOM_MEM_ACTIVATIONS,      /* activation slots (each with its micro-batch's tokens) and the layers' shared scratch */
  LOOM_MEM_WEIGHT_GRAD_STATES, /* split backwards' weight-grad states */
  LOOM_MEM_P2P,              /* send buffers and the received grad */
  LOOM_MEM_ZERO_TRANSIENT,   /* ZeRO's slices in transit and its gathered weights and grads in flight */
  LOOM_MEM_GRAD_REDUCE,      /* grads as bf16 while they cross data parallelism (grad_reduce bf16) */
  LOOM_MEM_COMPRESSION,      /* grad compression's error feedback and factors */
  LOOM_MEM_KINDS
} loom_memory_kind;

typedef struct {
  double bytes[LOOM_MEM_KINDS];
} loom_memory;


/* "weights", "master weights", ...: the kind's name in logs and tables. */
const char *loom_memory_kind_name(loom_memory_kind kind);
double loom_memory_total(const loom_memory *m);

/* The buffers pipeline rank pp_rank's schedule events hold at their peak
 * under a schedule of this shape (kind, pp ranks, vpp chunks, m
 * micro-batches): activation slots and weight-grad states per chunk
 * (slots[vpp], deferred[vpp]; a chunk keeps at least one slot, its
 * scratch's shape) and send buffers. Returns the rank's peak of live
 * micro-batches over all its chunks (the verifier's peak_live). From
 * loom_schedule_shape_peaks, each shape counted once; zeros if it cannot
 * be built. */
int loom_schedule_rank_buffers(loom_schedule_kind kind, int pp, int vpp, int m, int pp_rank, int *slots, int *deferred,
                               int *sends);
/* The same for the plan's shape. */
int loom_plan_rank_buffers(const loom_plan *plan, int pp_rank, int *slots, int *deferred, int *sends);

/* The buffer list: one row per kind of buffer a rank allocates, `count`
 * alike buffers of `elements` of `dtype` each, under the name the runtime
 * gives the allocator (layers/run_buffers.h). Its life is the whole run,
 * or as long as the schedule's slot, weight-grad state or send events hold
 * it (schedule/schedule.h), which set the counts. The rank's transfers are
 * chunk -1. */
typedef enum { LOOM_LIFE_RUN, LOOM_LIFE_SLOT, LOOM_LIFE_WEIGHT_STATE, LOOM_LIFE_SEND } loom_buffer_life;
typedef struct {
  loom_run_buffer name;
  loom_memory_kind kind;
  int chunk;
  int count;
  size_t elements;
  loom_dtype dtype;
  loom_buffer_life life;
} loom_buffer_row;
#define LOOM_CHUNK_ROWS 48 /* rows of one chunk, its rank's transfers included */
double loom_buffer_row_bytes(const loom_buffer_row *r);
/* Bytes by kind: the sums over the rows. */
loom_memory loom_buffer_rows_memory(const loom_buffer_row *rows, int n);

/* recompute_layers below: how many of each stage's first layers
 * recompute: the plan's own (LOOM_RECOMPUTE_PLAN), or a count (0: none,
 * LOOM_RECOMPUTE_ALL: every one). */
#define LOOM_RECOMPUTE_PLAN (-1)
/* The tensor memory chunk `chunk` of rank pp_rank allocates, with its
 * stage's first recompute_layers layers recomputed: the sum by kind of
 * its rows (loom_sheet_chunk_rows, rank_sheet.h; the rank's transfers
 * with chunk 0's). For a plan that passes the rules. */
loom_memory loom_plan_chunk_memory(const loom_plan *plan, int pp_rank, int chunk, int recompute_layers);
/* Over every chunk of the rank, recomputing as the plan says. */
loom_memory loom_plan_rank_memory(const loom_plan *plan, int pp_rank);
/* The rank's activations and weight-grad states, recomputing as asked. */
/* The fp32 weights and Adam state pipeline rank pp_rank holds (its master
 * weights, or its fp32 weights, and its optimizer state): what its
 * checkpoint shard holds at most, and the host memory one copy of it takes. */
double loom_plan_rank_checkpoint_bytes(const loom_plan *plan, int pp_rank);
/* The most of any pipeline rank: the busiest rank's shard. */
double loom_plan_checkpoint_shard_bytes(const loom_plan *plan);
double loom_plan_rank_activations(const loom_plan *plan, int pp_rank, int recompute_layers);

/* The plan's ZeRO cut of one chunk (loom_gpt_zero_cut at its tp, dp and stage). */
loom_zero_cut loom_plan_zero_cut(const loom_plan *plan, const loom_stage_range *range);

#endif
