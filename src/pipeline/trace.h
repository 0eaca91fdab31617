/* Pipeline traces: one traced step of every rank on one timeline, written as
 * Chrome-trace JSON (chrome://tracing, Perfetto) and drawn as SVG. Spans are
 * forward, backward, send, recv, the step-wide reductions, and the idle gaps
 * between them; the measured bubble is the idle share of the step. Ranks of
 * one machine share its monotonic clock, so their spans line up. */
#ifndef LOOM_TRACE_H
#define LOOM_TRACE_H

#include "pipeline/executor.h"

/* Gathers the traced step of every rank (collective over world) and writes it
 * from rank 0. *bubble gets the measured bubble on every rank. */
loom_status loom_trace_write(const loom_pipeline *pipe, loom_comm *world, const char *path, double *bubble,
                             loom_error *err);
/* Draws a trace file written by loom_trace_write as an SVG timeline. */
loom_status loom_trace_svg(const char *json_path, const char *svg_path, loom_error *err);

#endif
