/* JSON-lines metrics writer. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include "core/log.h"
#include "core/read_file.h"
#include "pipeline/metrics.h"

/* Rewrites path with only its lines of steps up to keep_through (a missing
 * file is an empty one; a device such as /dev/null keeps nothing to rewrite). */
static loom_status keep_lines(const char *path, long keep_through, loom_error *err) {
  struct stat sb;
  if (stat(path, &sb) != 0) return errno == ENOENT ? LOOM_OK : loom_fail(err, LOOM_ERR_IO, "--metrics %s: %s", path, strerror(errno));
  if (!S_ISREG(sb.st_mode)) return LOOM_OK;
  FILE *in;
  loom_status st = loom_open_for_reading(path, "metrics file", &in, err);
  if (st != LOOM_OK) return st;
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *out = fopen(tmp, "w");
  if (!out) {
    fclose(in);
    return loom_fail(err, LOOM_ERR_IO, "--metrics %s: cannot write it: %s", tmp, strerror(errno));
  }
  char line[8192];
  long step;
  bool wrote = true;
  while (wrote && fgets(line, sizeof line, in))
    if (sscanf(line, "{\"step\": %ld", &step) == 1 && step <= keep_through && strchr(line, '\n')) wrote = fputs(line, out) >= 0;
  fclose(in);
  const bool ok = fclose(out) == 0 && wrote && rename(tmp, path) == 0;
  if (!ok) {
    const int why = errno;
    remove(tmp);
    return loom_fail(err, LOOM_ERR_IO, "--metrics %s: cannot rewrite it: %s", path, strerror(why));
  }
  return LOOM_OK;
}

loom_status loom_metrics_open(loom_metrics *m, const char *path, long keep_through, loom_error *err) {
  *m = (loom_metrics){.path = path};
  if (!path) return LOOM_OK;
  if (keep_through >= 0) {
    const loom_status st = keep_lines(path, keep_through, err);
    if (st != LOOM_OK) return st;
  }
  m->fp = fopen(path, keep_through >= 0 ? "a" : "w");
  if (!m->fp) return loom_fail(err, LOOM_ERR_IO, "--metrics %s: cannot open for writing: %s", path, strerror(errno));
  return LOOM_OK;
}

/* A write that failed: said once, loudly; the file is closed and no more is written. */
static void failed(loom_metrics *m) {
  m->failed_errno = errno ? errno : EIO;
  fclose(m->fp);
  m->fp = NULL;
  loom_log_error("--metrics %s: writing step %d failed (%s); metrics stop recording here, training goes on", m->path,
                 m->step, strerror(m->failed_errno));
}

void loom_metrics_close(loom_metrics *m) {
  if (m->fp && fclose(m->fp) != 0 && !m->failed_errno) m->failed_errno = errno ? errno : EIO;
  m->fp = NULL;
}

loom_status loom_metrics_status(const loom_metrics *m, loom_error *err) {
  if (!m->failed_errno) return LOOM_OK;
  return loom_fail(err, LOOM_ERR_WRITE, "--metrics %s: stopped recording at step %d (%s); the run itself went on to its end",
                   m->path, m->step, strerror(m->failed_errno));
}

void loom_metrics_begin(loom_metrics *m, int step) {
  if (!m->fp) return;
  m->step = step;
  errno = 0;
  if (fprintf(m->fp, "{\"step\": %d", step) < 0) failed(m);
  m->fields = 1;
}

void loom_metrics_num(loom_metrics *m, const char *key, double value) {
  if (!m->fp) return;
  /* JSON has no NaN or Infinity; null keeps each line parseable. */
  const int n = isfinite(value) ? fprintf(m->fp, ", \"%s\": %.9g", key, value) : fprintf(m->fp, ", \"%s\": null", key);
  if (n < 0) failed(m);
  m->fields++;
}

void loom_metrics_end(loom_metrics *m) {
  if (!m->fp) return;
  errno = 0;
  /* Flushed every line, so a full disk is found at the step it fills, and a line is whole or absent. */
  if (fputs("}\n", m->fp) < 0 || fflush(m->fp) != 0 || ferror(m->fp)) failed(m);
}

void loom_metrics_memory(loom_metrics *m, int rank, double estimate, double peak, double resident) {
  if (!m || !m->fp) return;
  errno = 0;
  if (fprintf(m->fp, "{\"memory\": {\"rank\": %d, \"estimate_bytes\": %.0f, \"peak_bytes\": %.0f, \"resident_peak_bytes\": %.0f}}\n",
              rank, estimate, peak, resident) < 0 || fflush(m->fp) != 0 || ferror(m->fp))
    failed(m);
}
