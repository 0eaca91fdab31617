/* JSON-lines metrics writer. */
#include <errno.h>
#include <math.h>
#include <string.h>
#include "pipeline/metrics.h"

loom_status loom_metrics_open(loom_metrics *m, const char *path, loom_error *err) {
  m->fp = NULL;
  m->fields = 0;
  if (!path) return LOOM_OK;
  m->fp = fopen(path, "w");
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
