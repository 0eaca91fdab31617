/* JSON-lines metrics writer. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include "pipeline/metrics.h"

/* Rewrites path with only its lines of steps up to keep_through (a missing file is an empty one). */
static loom_status keep_lines(const char *path, long keep_through, loom_error *err) {
  FILE *in = fopen(path, "r");
  if (!in) return errno == ENOENT ? LOOM_OK : loom_fail(err, LOOM_ERR_IO, "--metrics %s: cannot read it: %s", path, strerror(errno));
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *out = fopen(tmp, "w");
  if (!out) {
    fclose(in);
    return loom_fail(err, LOOM_ERR_IO, "--metrics %s: cannot write it: %s", tmp, strerror(errno));
  }
  char line[8192];
  long step;
  while (fgets(line, sizeof line, in))
    if (sscanf(line, "{\"step\": %ld", &step) == 1 && step <= keep_through && strchr(line, '\n')) fputs(line, out);
  fclose(in);
  const bool ok = fclose(out) == 0 && rename(tmp, path) == 0;
  if (!ok) {
    remove(tmp);
    return loom_fail(err, LOOM_ERR_IO, "--metrics %s: cannot rewrite it: %s", path, strerror(errno));
  }
  return LOOM_OK;
}

loom_status loom_metrics_open(loom_metrics *m, const char *path, long keep_through, loom_error *err) {
  m->fp = NULL;
  m->fields = 0;
  if (!path) return LOOM_OK;
  if (keep_through >= 0) {
    const loom_status st = keep_lines(path, keep_through, err);
    if (st != LOOM_OK) return st;
  }
  m->fp = fopen(path, keep_through >= 0 ? "a" : "w");
  if (!m->fp) return loom_fail(err, LOOM_ERR_IO, "--metrics %s: cannot open for writing: %s", path, strerror(errno));
  return LOOM_OK;
}

void loom_metrics_close(loom_metrics *m) {
  if (m->fp) fclose(m->fp);
  m->fp = NULL;
}

void loom_metrics_begin(loom_metrics *m, int step) {
  if (!m->fp) return;
  fprintf(m->fp, "{\"step\": %d", step);
  m->fields = 1;
}

void loom_metrics_num(loom_metrics *m, const char *key, double value) {
  if (!m->fp) return;
  /* JSON has no NaN or Infinity; null keeps each line parseable. */
  if (isfinite(value)) fprintf(m->fp, ", \"%s\": %.9g", key, value);
  else fprintf(m->fp, ", \"%s\": null", key);
  m->fields++;
}

void loom_metrics_end(loom_metrics *m) {
  if (!m->fp) return;
  fputs("}\n", m->fp);
  fflush(m->fp);
}
