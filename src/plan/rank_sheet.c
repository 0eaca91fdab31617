/* Filling a rank's sheet from a validated plan. */
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "plan/rank_sheet.h"
#include "schedule/verify.h"

/* The grid, the experts' grid and this rank's places in them. */
static void place(loom_rank_sheet *s, const loom_plan *plan, int rank) {
  const Loom__Parallel *l = plan->parallel;
  s->rank = rank;
  s->size = (loom_grid_coords){.tp = l->tp, .cp = l->cp, .dp = l->dp, .pp = l->pp};
  s->at = loom_parallel_coords(rank, s->size);
  s->etp = l->etp > 1 ? l->etp : 1, s->ep = l->ep > 1 ? l->ep : 1;
  LOOM_CHECK(loom_expert_coords_of(rank, l->tp, l->cp * l->dp, s->etp, s->ep, &s->expert) == 0,
             "etp x ep divides the stage's ranks (the plan's rule)");
  s->grad_replicas = loom_plan_grad_replicas(plan);
  s->sequence_parallel = l->sequence_parallel;
}

/* Every pipeline rank's buffer counts (the memory model's), this rank's chunks and their stages. */
static void chunks(loom_rank_sheet *s, const loom_plan *plan) {
  const int pp = s->size.pp, v = plan->parallel->virtual_chunks;
  s->chunks = v;
  s->rank_slots = loom_xcalloc((size_t)pp * v, sizeof *s->rank_slots, "slot counts");
  s->rank_sends = loom_xcalloc((size_t)pp, sizeof *s->rank_sends, "send buffer counts");
  int *deferred = loom_xcalloc((size_t)v, sizeof *deferred, "weight-grad state counts");
  for (int r = 0; r < pp; r++) {
    loom_plan_rank_buffers(plan, r, &s->rank_slots[r * v], deferred, &s->rank_sends[r]);
    for (int c = 0; r == s->at.pp && c < v; c++) {
      loom_sheet_chunk *k = &s->chunk[c];
      k->stage = loom_plan_stage_index(plan, r, c);
      k->range = loom_plan_stage_range(plan, k->stage);
      k->recompute = loom_plan_stage_recompute(plan, k->stage);
      k->slots = s->rank_slots[r * v + c], k->weight_states = deferred[c];
    }
  }
  s->sends = s->rank_sends[s->at.pp];
  free(deferred);
}

/* The buffer list: each chunk's rows, as the memory model makes them. */
static void buffers(loom_rank_sheet *s, const loom_plan *plan) {
  s->buffers = loom_xmalloc((size_t)s->chunks * LOOM_CHUNK_ROWS * sizeof *s->buffers, "buffer list");
  for (int c = 0; c < s->chunks; c++)
    s->nbuffers += loom_plan_chunk_rows(plan, s->at.pp, c, LOOM_RECOMPUTE_PLAN, s->buffers + s->nbuffers);
}

loom_status loom_rank_sheet_fill(loom_rank_sheet *s, const loom_plan *plan, int rank, loom_error *err) {
  memset(s, 0, sizeof *s);
  LOOM_CHECK(rank >= 0 && rank < loom_plan_ranks(plan), "a rank of the plan");
  place(s, plan, rank);
  loom_plan_model_config(plan, &s->model);
  loom_plan_context_config(plan, &s->model);
  s->seq = loom_plan_train_seq(plan);
  s->micro_batch = plan->batch->micro_batch, s->global_batch = plan->batch->global_batch;
  s->micro_batches = loom_plan_micro_batches(plan);
  s->compute_dtype = loom_plan_compute_dtype(plan);
  s->grad_dtype = s->grad_replicas > 1 ? loom_plan_grad_reduce_dtype(plan) : LOOM_DTYPE_F32;
  s->zero_stage = plan->parallel->zero_stage;
  s->overlap = loom_plan_overlaps(plan);
  s->compression = loom_plan_compression(plan);
  if (s->grad_replicas < 2) s->compression.kind = LOOM__COMPRESSION_KIND__COMPRESSION_NONE;
  chunks(s, plan);
  buffers(s, plan);
  s->activations_unrecomputed = loom_plan_rank_activations(plan, s->at.pp, 0);
  loom_status st = loom_plan_schedule(plan, &s->schedule, err);
  if (st != LOOM_OK) return st;
  loom_schedule_report rep;
  st = loom_schedule_verify(&s->schedule, &rep);
  if (st != LOOM_OK) st = loom_fail(err, st, "the plan's schedule failed verification: %s", rep.why);
  loom_schedule_report_free(&rep);
  return st;
}

void loom_rank_sheet_free(loom_rank_sheet *s) {
  free(s->rank_slots);
  free(s->rank_sends);
  free(s->buffers);
  loom_schedule_free(&s->schedule);
  memset(s, 0, sizeof *s);
}

loom_memory loom_rank_sheet_memory(const loom_rank_sheet *s) { return loom_buffer_rows_memory(s->buffers, s->nbuffers); }
