/* Pipeline traces: one traced step of every rank gathered onto one
 * timeline (schedule/timeline.h writes it); the measured bubble is the idle
 * share of the step. Ranks of one machine share its monotonic clock, so
 * their spans line up. Counts and times cross ranks as integers
 * (nanoseconds), exact however long the step. */
#ifndef LOOM_TRACE_H
#define LOOM_TRACE_H

#include "pipeline/executor.h"
#include "schedule/timeline.h"

/* What a written trace measured: the bubble, and under context
 * parallelism the ring's time by kind (loom_ring_span_kind), in
 * microseconds per rank on the mean. */
typedef struct {
  double bubble;
  double ring_us[LOOM_RING_SPAN_KINDS];
} loom_trace_summary;

/* Gathers the traced step of every rank (collective over world) and writes it
 * from rank 0; *sum gets what it measured on every rank. */
loom_status loom_trace_write(const loom_pipeline *pipe, loom_comm *world, const char *path, loom_trace_summary *sum,
                             loom_error *err);
#endif
