/* --metrics FILE: one JSON object per line, each with at least "step" and
 * "loss"; and with --tensorboard-dir, the same numbers as TensorBoard
 * scalars under Megatron-LM's names (metrics.c's table). */
#ifndef LOOM_METRICS_H
#define LOOM_METRICS_H

#include "pipeline/goodput.h"
#include <stdint.h>
#include <stdio.h>
#include "core/status.h"
#include "pipeline/tensorboard.h"

typedef struct {
  FILE *fp;
  const char *path;
  int fields;       /* fields written on the current line */
  int step;         /* the line being written */
  int failed_errno; /* a write that failed (0: none); recording stopped there, at failed_step */
  int failed_step;
  loom_tensorboard *tb; /* NULL: no TensorBoard files */
  char tb_error[512];   /* how the TensorBoard file failed, once closed ("": it did not) */
} loom_metrics;

/* Opens path for writing (NULL path: metrics off). A resumed run passes the
 * step it resumes from as keep_through: the file keeps its lines up to that
 * step and continues after them, so a run stopped and resumed any number of
 * times leaves one line per step; < 0 starts the file afresh. */
loom_status loom_metrics_open(loom_metrics *m, const char *path, long keep_through, loom_error *err);
/* Adds TensorBoard files in dir (NULL: none) to m, opened with loom_metrics_open. */
loom_status loom_metrics_open_tensorboard(loom_metrics *m, const char *dir, long keep_through, loom_error *err);
void loom_metrics_close(loom_metrics *m);
/* Every write is checked: a failed one (a full disk) is logged at once and
 * recording stops, and this then fails the run at its end, naming the step
 * (call after loom_metrics_close). */
loom_status loom_metrics_status(const loom_metrics *m, loom_error *err);
void loom_metrics_begin(loom_metrics *m, int step);
void loom_metrics_num(loom_metrics *m, const char *key, double value);
/* rows x cols counts as a list of rows: "key": [[...], ...] (the JSON line only). */
void loom_metrics_list(loom_metrics *m, const char *key, const int64_t *v, int rows, int cols);
void loom_metrics_end(loom_metrics *m);
/* The run's last record, one line of its own: {"memory": {"rank": R,
 * "estimate_bytes": E, "peak_bytes": P, "resident_peak_bytes": Q,
 * "activation_estimate_bytes": A}}, the busiest rank's estimated and
 * counted tensor memory, resident peak, and the share of E that is
 * activations and weight-grad states (what the batch and sequence set;
 * P - (E - A) is then the counted peak of what they took). */
void loom_metrics_memory(loom_metrics *m, int rank, double estimate, double peak, double resident, double activations);
/* The goodput over every attempt so far, one line of its own: {"goodput": {"share": G, "wall_s": ..., "attempts": N,
 * "kept_s", "save_s", "restore_s", "lost_steps", "lost_s", "relaunch_s", "other_s"}} (pipeline/goodput.h). */
void loom_metrics_goodput(loom_metrics *m, const loom_goodput_summary *s);

#endif
