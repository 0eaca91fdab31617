/* Pipeline traces: one traced step of every rank on one timeline, written as
 * Chrome-trace JSON (chrome://tracing, Perfetto) and drawn as SVG. Spans are
 * forward, backward, send, recv, the step-wide reductions, and the idle gaps
 * between them; the measured bubble is the idle share of the step. Beside
 * them each rank has a counter of the buffers it holds (activation slots,
 * weight-grad states, send buffers), read off the schedule's buffer events
 * at the end of each action: the buffers the memory model sizes, over
 * time. Ranks of one machine share its monotonic clock, so their spans line
 * up. */
#ifndef LOOM_TRACE_H
#define LOOM_TRACE_H

#include "pipeline/executor.h"

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
   * process of its own ("pid": 1, a row per rank): nring spans of (rank,
   * kind, start us, end us); NULL: none. */
  const float *ring;
  int nring;
} loom_trace_info;

/* What a written trace measured: the bubble, and under context
 * parallelism the ring's time by kind (loom_ring_span_kind), in
 * microseconds per rank on the mean. */
typedef struct {
  double bubble;
  double ring_us[LOOM_RING_SPAN_KINDS];
} loom_trace_summary;

/* Writes spans (grouped by rank, each rank's in time order) as Chrome-trace
 * JSON with the idle gaps between them: the one trace writer. */
loom_status loom_trace_write_json(const char *path, const loom_trace_span *spans, int n, const loom_trace_info *info,
                                  loom_error *err);

/* Gathers the traced step of every rank (collective over world) and writes it
 * from rank 0; *sum gets what it measured on every rank. */
loom_status loom_trace_write(const loom_pipeline *pipe, loom_comm *world, const char *path, loom_trace_summary *sum,
                             loom_error *err);
/* Draws a trace file written by loom_trace_write as an SVG timeline. */
loom_status loom_trace_svg(const char *json_path, const char *svg_path, loom_error *err);

#endif
