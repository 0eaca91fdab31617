/* Gathering a traced step of every rank. */
#include <math.h>
#include <stdlib.h>
#include "core/check.h"
#include "pipeline/executor_state.h"
#include "pipeline/trace.h"
#include "schedule/verify.h"

/* The most records of `fields` int64s any rank holds (collective over world), and every rank's, each padded to
 * that many with -1 (allgathered: [ranks][most][fields]); NULL when no rank holds any. */
static int64_t *gather_records(loom_comm *world, const int64_t *mine, int count, int fields, int *most) {
  int32_t width = count;
  loom_comm_allreduce_typed(world, &width, 1, LOOM_DTYPE_I32, LOOM_REDUCE_MAX);
  *most = width;
  if (width == 0) return NULL;
  const size_t each = (size_t)width * fields;
  int64_t *padded = loom_xmalloc(each * sizeof *padded, "trace");
  int64_t *all = loom_xmalloc(each * (size_t)loom_comm_size(world) * sizeof *all, "trace");
  for (size_t i = 0; i < each; i++) padded[i] = i < (size_t)count * fields ? mine[i] : -1;
  loom_comm_allgather_typed(world, padded, all, each, LOOM_DTYPE_I64);
  free(padded);
  return all;
}

/* Every rank's ring spans, gathered on every rank, their count in *n; *sum gets each kind's mean time per rank.
 * NULL when no rank kept any. */
static loom_trace_span *gather_ring(const loom_pipeline *pipe, loom_comm *world, int *n, loom_trace_summary *sum) {
  const loom_ring_log *g = &pipe->ring_log;
  const int ranks = loom_comm_size(world);
  int width;
  int64_t *all = gather_records(world, g->spans, g->count, 3, &width);
  *n = 0;
  if (!all) return NULL;
  loom_trace_span *out = loom_xmalloc((size_t)width * ranks * sizeof *out, "ring trace");
  for (int r = 0; r < ranks; r++)
    for (int i = 0; i < width; i++) {
      const int64_t *e = all + ((size_t)r * width + i) * 3;
      if (e[0] < 0) continue;
      out[(*n)++] = (loom_trace_span){.rank = r, .kind = (int)e[0], .start_us = 1e-3 * (double)e[1], .end_us = 1e-3 * (double)e[2]};
      sum->ring_us[e[0]] += 1e-3 * (double)(e[2] - e[1]) / ranks;
    }
  free(all);
  return out;
}

/* The measured bubble: the idle share of the step, averaged over ranks. */
static double measured_bubble(const int64_t *all, int ranks, int width) {
  double makespan = 0.0, busy_sum = 0.0;
  for (int r = 0; r < ranks; r++)
    for (int i = 0; i < width; i++) {
      const int64_t *e = all + ((size_t)r * width + i) * LOOM_TRACE_FIELDS;
      if (e[0] < 0) continue;
      makespan = fmax(makespan, (double)e[4]);
      if (loom_action_computes(&(loom_action){.kind = (loom_action_kind)e[0]})) busy_sum += (double)(e[4] - e[3]);
    }
  return makespan > 0.0 ? 1.0 - busy_sum / ranks / makespan : 0.0;
}

loom_status loom_trace_write(const loom_pipeline *pipe, loom_comm *world, const char *path, loom_trace_summary *sum,
                             loom_error *err) {
  *sum = (loom_trace_summary){0};
  int nring, width;
  loom_trace_span *ring = gather_ring(pipe, world, &nring, sum);
  const int ranks = loom_comm_size(world);
  int64_t *all = gather_records(world, pipe->trace, pipe->trace_count, LOOM_TRACE_FIELDS, &width);
  sum->bubble = all ? measured_bubble(all, ranks, width) : 0.0;
  loom_status st = LOOM_OK;
  if (loom_comm_rank(world) == 0) {
    loom_trace_span *spans = loom_xmalloc((size_t)width * ranks * sizeof *spans + 1, "trace");
    int n = 0;
    const loom_rank_sheet *sh = pipe->sheet;
    for (int r = 0; r < ranks; r++) {
      const int pp_rank = loom_parallel_coords(r, sh->size).pp;
      for (int i = 0; i < width; i++) {
        const int64_t *e = all + ((size_t)r * width + i) * LOOM_TRACE_FIELDS;
        if (e[0] >= 0)
          spans[n++] = (loom_trace_span){r, (int)e[0], (int)e[1], (int)e[2], 1e-3 * (double)e[3], 1e-3 * (double)e[4], pp_rank,
                                         (int)e[5]};
      }
    }
    const loom_trace_info info = {ranks, sh->size.pp, pipe->v, pipe->m, loom_schedule_kind_name(pipe->sched->kind),
                                  "bubble_measured", sum->bubble, loom_schedule_theory_bubble(pipe->sched), pipe->sched,
                                  ring, nring};
    st = loom_trace_write_json(path, spans, n, &info, err);
    free(spans);
  }
  free(all);
  free(ring);
  return st;
}
