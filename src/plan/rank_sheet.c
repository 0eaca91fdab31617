/* Filling a rank's sheet from a validated plan. */
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "plan/rank_sheet.h"
#include "schedule/verify.h"

/* Every pipeline rank's buffer counts, for evaluation's rounds (the executor picks rounds every rank agrees on). */
static void every_rank_counts(loom_rank_sheet *s) {
  const int pp = s->size.pp, v = s->chunks;
  s->rank_slots = loom_xcalloc((size_t)pp * v, sizeof *s->rank_slots, "slot counts");
  s->rank_sends = loom_xcalloc((size_t)pp, sizeof *s->rank_sends, "send buffer counts");
  int deferred[LOOM_PLAN_MAX_CHUNKS];
  for (int r = 0; r < pp; r++)
    loom_schedule_rank_buffers(s->kind, pp, v, s->micro_batches, r, &s->rank_slots[r * v], deferred, &s->rank_sends[r]);
}

/* The buffer list: each chunk's rows, as the memory model makes them, and what they would be recomputing nothing. */
static void buffers(loom_rank_sheet *s) {
  s->buffers = loom_xmalloc((size_t)s->chunks * LOOM_CHUNK_ROWS * sizeof *s->buffers, "buffer list");
  for (int c = 0; c < s->chunks; c++) s->nbuffers += loom_sheet_chunk_rows(s, c, LOOM_RECOMPUTE_PLAN, s->buffers + s->nbuffers);
  s->activations_unrecomputed = loom_sheet_activations(s, 0);
}

/* The schedule, built from the sheet's shape and verified. */
static loom_status schedule(loom_rank_sheet *s, loom_error *err) {
  loom_status st = loom_schedule_build(&s->schedule, s->kind, s->size.pp, s->chunks, s->micro_batches, err);
  if (st != LOOM_OK) return st;
  if (s->untied) loom_schedule_untie(&s->schedule);
  loom_schedule_report rep;
  st = loom_schedule_verify(&s->schedule, &rep);
  if (st != LOOM_OK) st = loom_fail(err, st, "the plan's schedule failed verification: %s", rep.why);
  loom_schedule_report_free(&rep);
  return st;
}

loom_status loom_rank_sheet_fill(loom_rank_sheet *s, const loom_plan *plan, int rank, loom_error *err) {
  loom_plan_resolve(plan, rank, s);
  loom_sheet_count_buffers(s);
  every_rank_counts(s);
  buffers(s);
  return schedule(s, err);
}

void loom_rank_sheet_free(loom_rank_sheet *s) {
  free(s->rank_slots);
  free(s->rank_sends);
  free(s->buffers);
  loom_schedule_free(&s->schedule);
  memset(s, 0, sizeof *s);
}

loom_memory loom_rank_sheet_memory(const loom_rank_sheet *s) { return loom_buffer_rows_memory(s->buffers, s->nbuffers); }
