/* The rank sheet: everything resolved about one rank's part of a validated
 * plan, filled once and read-only after. The plan is read in one place
 * (loom_plan_resolve, plan/plan.c); the memory model's counts and buffer
 * list are computed from the sheet (plan/memory.c), the schedule is built
 * from it and verified. The runtime builds this rank's part of the run from
 * the sheet and from nothing else of the plan: its grid coordinates, its
 * chunks (stage, layers, recompute, buffer counts), the micro-batch shape
 * and count, its dtypes, the built and verified schedule, and the buffer
 * list, which is what the rank allocates. `plan show`, resharding, the
 * estimates and the sim read sheets too (the estimates and the sim one per
 * pipeline rank, through plan/memory.h's functions of a plan). */
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
  loom_gpt_config rank_model; /* as one rank holds it: its experts placed over ep (loom_plan_rank_config) */
  int seq, micro_batch, micro_batches, global_batch;
  loom_dtype compute_dtype;   /* the layers' weights and activations */
  loom_dtype grad_dtype;      /* grads as they cross dp (the plan's grad_reduce; fp32 with one replica) */
  int zero_stage;
  loom_plan_overlap overlap;
  loom_compression compression; /* NONE with one replica */
  loom_schedule_kind kind;    /* the schedule's */
  bool untied;                /* the head is untied: the schedule has no tied-embedding reduction */
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

/* The plan's part of a sheet: everything but the buffer counts, the
 * schedule and the buffer list, read from the plan (plan/plan.c). */
void loom_plan_resolve(const loom_plan *plan, int rank, loom_rank_sheet *s);
/* The memory model on a resolved sheet (plan/memory.c): this rank's
 * chunks' slot and weight-grad state counts and its send buffers, from the
 * schedule's shape; and the rows of chunk `chunk`, with its stage's first
 * recompute_layers layers recomputed (LOOM_RECOMPUTE_PLAN: the sheet's),
 * into rows, returning their number. */
void loom_sheet_count_buffers(loom_rank_sheet *s);
int loom_sheet_chunk_rows(const loom_rank_sheet *s, int chunk, int recompute_layers, loom_buffer_row rows[LOOM_CHUNK_ROWS]);
/* The activations and weight-grad states of its chunks, recomputing as asked. */
double loom_sheet_activations(const loom_rank_sheet *s, int recompute_layers);

#endif
