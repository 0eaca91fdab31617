/* Timelines of a schedule's run, measured (pipeline/trace.h gathers a
 * step's) or predicted (`loom sim`): every rank's spans on one timeline,
 * written as Chrome-trace JSON (chrome://tracing, Perfetto) and drawn as
 * SVG. Spans are forward, backward, send, recv, the step-wide reductions,
 * and the idle gaps between them. Beside them each rank has a counter of
 * the buffers it holds (activation slots, weight-grad states, send
 * buffers), read off the schedule's buffer events at the end of each
 * action: the buffers the memory model sizes, over time. */
#ifndef LOOM_TIMELINE_H
#define LOOM_TIMELINE_H

#include "layers/ring_attention.h"
#include "schedule/schedule.h"

/* One span of a timeline: an action of a rank, in microseconds. */
typedef struct {
  int rank, kind, mb, chunk; /* kind: a loom_action_kind */
  double start_us, end_us;
  int stage_rank, action;    /* the schedule's rank running it, and its index there */
} loom_trace_span;

/* What a trace's header says of it; bubble_label names the bubble
 * ("bubble_measured" for a run, "bubble_predicted" for `loom sim`). */
typedef struct {
  int ranks, pp, vpp, m;
  const char *schedule, *bubble_label;
  double bubble, theory;
  const loom_schedule *sched; /* whose buffer events the counters count */
  /* Context parallelism's ring (layers/ring_attention.h), written as a
   * process of its own ("pid": 1, a row per rank): nring spans, each's kind
   * a loom_ring_span_kind; NULL: none. */
  const loom_trace_span *ring;
  int nring;
} loom_trace_info;

/* Writes spans (grouped by rank, each rank's in time order) as Chrome-trace
 * JSON with the idle gaps between them: the one trace writer. */
loom_status loom_trace_write_json(const char *path, const loom_trace_span *spans, int n, const loom_trace_info *info,
                                  loom_error *err);

/* Draws a trace file (loom_trace_write_json's) as an SVG timeline. */
loom_status loom_trace_svg(const char *json_path, const char *svg_path, loom_error *err);

#endif
