/* JSON-lines metrics writer. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include "core/log.h"
#include "core/read_file.h"
#include "pipeline/goodput.h"
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
  m->failed_step = m->step;
  fclose(m->fp);
  m->fp = NULL;
  loom_log_error("--metrics %s: writing step %d failed (%s); metrics stop recording here, training goes on", m->path,
                 m->step, strerror(m->failed_errno));
}

loom_status loom_metrics_open_tensorboard(loom_metrics *m, const char *dir, long keep_through, loom_error *err) {
  return dir ? loom_tensorboard_open(&m->tb, dir, keep_through > 0 ? keep_through + 1 : 0, err) : LOOM_OK;
}

void loom_metrics_close(loom_metrics *m) {
  if (m->fp && fclose(m->fp) != 0 && !m->failed_errno) m->failed_errno = errno ? errno : EIO;
  m->fp = NULL;
  loom_error tb_err = {0};
  if (loom_tensorboard_close(m->tb, &tb_err) != LOOM_OK) snprintf(m->tb_error, sizeof m->tb_error, "%s", tb_err.msg);
  m->tb = NULL;
}

loom_status loom_metrics_status(const loom_metrics *m, loom_error *err) {
  if (m->tb_error[0]) return loom_fail(err, LOOM_ERR_WRITE, "%s", m->tb_error);
  if (!m->failed_errno) return LOOM_OK;
  return loom_fail(err, LOOM_ERR_WRITE, "--metrics %s: stopped recording at step %d (%s); the run itself went on to its end",
                   m->path, m->failed_step, strerror(m->failed_errno));
}

/* Each metric TensorBoard shows, under Megatron-LM's name where it has one
 * (training.py's training_log and evaluate_and_print_results), scaled to
 * its unit (iteration-time in seconds). */
static const struct {
  const char *key, *tag;
  double scale;
} TENSORBOARD_TAGS[] = {
    {"loss", "lm loss", 1.0},
    {"lr", "learning-rate", 1.0},
    {"grad_norm", "grad-norm", 1.0},
    {"batch_size", "batch-size", 1.0},
    {"ms", "iteration-time", 1e-3},
    {"tflops_per_device", "throughput", 1.0},
    {"tokens_per_s_per_device", "tokens-per-sec-per-device", 1.0},
    {"mfu", "mfu", 1.0},
    {"max_allocated_bytes", "mem-max-allocated-bytes", 1.0},
    {"skipped_iterations", "skipped-iterations", 1.0},
    {"load_balancing_loss", "load_balancing_loss", 1.0},
    {"z_loss", "z_loss", 1.0},
    {"eval_loss", "lm loss validation", 1.0},
    {"eval_accuracy", "exact match validation", 1.0},
};

static void tensorboard_scalar(loom_metrics *m, const char *key, double value) {
  for (size_t i = 0; m->tb && i < sizeof TENSORBOARD_TAGS / sizeof TENSORBOARD_TAGS[0]; i++)
    if (strcmp(key, TENSORBOARD_TAGS[i].key) == 0) loom_tensorboard_scalar(m->tb, TENSORBOARD_TAGS[i].tag, m->step,
                                                                          value * TENSORBOARD_TAGS[i].scale);
  if (m->tb && strcmp(key, "eval_loss") == 0) /* Megatron's perplexity, its exponent capped at 20 */
    loom_tensorboard_scalar(m->tb, "lm loss validation ppl", m->step, exp(value < 20.0 ? value : 20.0));
}

void loom_metrics_begin(loom_metrics *m, int step) {
  m->step = step;
  if (!m->fp) return;
  errno = 0;
  if (fprintf(m->fp, "{\"step\": %d", step) < 0) failed(m);
  m->fields = 1;
}

void loom_metrics_num(loom_metrics *m, const char *key, double value) {
  tensorboard_scalar(m, key, value);
  if (!m->fp) return;
  /* JSON has no NaN or Infinity; null keeps each line parseable. */
  const int n = isfinite(value) ? fprintf(m->fp, ", \"%s\": %.9g", key, value) : fprintf(m->fp, ", \"%s\": null", key);
  if (n < 0) failed(m);
  m->fields++;
}

void loom_metrics_list(loom_metrics *m, const char *key, const int64_t *v, int rows, int cols) {
  if (!m->fp) return;
  bool ok = fprintf(m->fp, ", \"%s\": [", key) >= 0;
  for (int r = 0; r < rows && ok; r++) {
    ok = fputs(r ? ", [" : "[", m->fp) >= 0;
    for (int c = 0; c < cols && ok; c++) ok = fprintf(m->fp, c ? ", %lld" : "%lld", (long long)v[(size_t)r * cols + c]) >= 0;
    ok = ok && fputc(']', m->fp) != EOF;
  }
  if (!ok || fputc(']', m->fp) == EOF) failed(m);
  m->fields++;
}

void loom_metrics_end(loom_metrics *m) {
  if (!m->fp) return;
  errno = 0;
  /* Flushed every line, so a full disk is found at the step it fills, and a line is whole or absent. */
  if (fputs("}\n", m->fp) < 0 || fflush(m->fp) != 0 || ferror(m->fp)) failed(m);
}

void loom_metrics_memory(loom_metrics *m, int rank, double estimate, double peak, double resident, double activations) {
  if (!m || !m->fp) return;
  errno = 0;
  if (fprintf(m->fp, "{\"memory\": {\"rank\": %d, \"estimate_bytes\": %.0f, \"peak_bytes\": %.0f, \"resident_peak_bytes\": %.0f, "
              "\"activation_estimate_bytes\": %.0f}}\n", rank, estimate, peak, resident, activations) < 0 ||
      fflush(m->fp) != 0 || ferror(m->fp))
    failed(m);
}

void loom_metrics_goodput(loom_metrics *m, const loom_goodput_summary *s) {
  if (!m || !m->fp) return;
  errno = 0;
  if (fprintf(m->fp, "{\"goodput\": {\"share\": %.6f, \"wall_s\": %.6f, \"attempts\": %d, \"kept_s\": %.6f, "
              "\"save_s\": %.6f, \"restore_s\": %.6f, \"lost_steps\": %lld, \"lost_s\": %.6f, \"relaunch_s\": %.6f, "
              "\"other_s\": %.6f}}\n", s->goodput, s->wall_s, s->attempts, s->kept_s, s->save_s, s->restore_s,
              (long long)s->lost_steps, s->lost_s, s->relaunch_s, s->other_s) < 0 ||
      fflush(m->fp) != 0 || ferror(m->fp))
    failed(m);
}
