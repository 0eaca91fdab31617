/* The rank sheet: everything resolved about one rank's part of a validated
 * plan, filled once and read-only after. The runtime builds this rank's
 * part of the run from it and from nothing else of the plan: its grid
 * coordinates, its chunks (stage, layers, recompute, buffer counts), the
 * micro-batch shape and count, its dtypes, the built and verified schedule,
 * and the buffer list the memory model makes (plan/memory.h), which is what
 * the rank allocates. The estimates, `plan show` and the sim read the same
 * functions underneath (loom_plan_chunk_rows, loom_plan_rank_buffers). */
#ifndef LOOM_RANK_SHEET_H
#define LOOM_RANK_SHEET_H

#include "plan/memory.h"
#include "tensor_parallel/parallel_state.h"

typedef struct {
  int stage;                 /* its virtual stage (loom_plan_stage_index) */
  loom_stage_range range;    /* its layers and ends */
  loom_recompute recompute;  /* what it recomputes in backward */
  int slots, weight_states;  /* the buffers its schedule events hold at the peak (a slot at least) */
} loom_sheet_chunk;

typedef struct {
  int rank;                   /* in the world */
  loom_grid_coords size, at;  /* the grid (tp, cp, dp, pp) and this rank's place in it */
  int etp, ep;                /* the experts' grid (1: none) */
  loom_expert_coords expert;  /* this rank's place in it */
  int grad_replicas;          /* ranks summing its grads and sharding ZeRO: dp x cp */
  bool sequence_parallel;
  loom_gpt_config model;      /* the whole model with its context split, as the layers take it */
  int seq, micro_batch, micro_batches, global_batch;
  loom_dtype compute_dtype;   /* the layers' weights and activations */
  loom_dtype grad_dtype;      /* grads as they cross dp (the plan's grad_reduce; fp32 with one replica) */
  int zero_stage;
  loom_plan_overlap overlap;
  loom_compression compression; /* NONE with one replica */
  int chunks;
  loom_sheet_chunk chunk[LOOM_PLAN_MAX_CHUNKS];
  int sends;                  /* this rank's send buffers */
  int *rank_slots, *rank_sends; /* [pp * chunks], [pp]: every pipeline rank's, for evaluation's rounds */
  loom_schedule schedule;     /* the training schedule, built and verified */
  loom_buffer_row *buffers;   /* the buffer list, chunk by chunk (the transfers with chunk 0's) */
  int nbuffers;
  double activations_unrecomputed; /* the activations and weight-grad states it would hold recomputing nothing */
} loom_rank_sheet;

/* Fills the sheet of world rank `rank` of a validated plan. */
loom_status loom_rank_sheet_fill(loom_rank_sheet *s, const loom_plan *plan, int rank, loom_error *err);
void loom_rank_sheet_free(loom_rank_sheet *s);
/* The bytes its buffer list sums to, by kind. */
loom_memory loom_rank_sheet_memory(const loom_rank_sheet *s);

#endif
