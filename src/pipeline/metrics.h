/* --metrics FILE: one JSON object per line, each with at least "step" and "loss". */
#ifndef LOOM_METRICS_H
#define LOOM_METRICS_H

#include <stdio.h>
#include "core/status.h"

typedef struct {
  FILE *fp;
  int fields; /* fields written on the current line */
} loom_metrics;

/* Opens path for writing (NULL path: metrics off). */
loom_status loom_metrics_open(loom_metrics *m, const char *path, loom_error *err);
void loom_metrics_close(loom_metrics *m);
void loom_metrics_begin(loom_metrics *m, int step);
void loom_metrics_num(loom_metrics *m, const char *key, double value);
void loom_metrics_end(loom_metrics *m);

#endif
