/* The goodput ledger (see goodput.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "core/fault.h"
#include "pipeline/goodput.h"

/* Every line has one shape, so that reading it back is one scan. */
#define LINE_FORMAT "{\"attempt\": %d, \"event\": \"%s\", \"step\": %lld, \"time\": %.6f, \"launched\": %.6f, " \
                    "\"step_s\": %.6f, \"stall_s\": %.6f}\n"
#define SCAN_FORMAT "{\"attempt\": %d, \"event\": \"%15[a-z]\", \"step\": %lld, \"time\": %lf, \"launched\": %lf, " \
                    "\"step_s\": %lf, \"stall_s\": %lf}"

typedef struct {
  int attempt;
  char event[16];
  long long step;
  double time, launched, step_s, stall_s;
} event;

double loom_goodput_clock(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void append(const loom_goodput *g, const char *what, int64_t step, double step_s, double stall_s) {
  FILE *fp = fopen(g->ledger, "a");
  if (!fp) return; /* the ledger is a report: training goes on without it */
  fprintf(fp, LINE_FORMAT, g->attempt, what, (long long)step, loom_goodput_clock(), g->launched, step_s, stall_s);
  fclose(fp);
}

static int read_events(const char *path, event **out) {
  FILE *fp = fopen(path, "r");
  int n = 0, cap = 0;
  *out = NULL;
  char line[512];
  while (fp && fgets(line, sizeof line, fp)) {
    event e;
    if (sscanf(line, SCAN_FORMAT, &e.attempt, e.event, &e.step, &e.time, &e.launched, &e.step_s, &e.stall_s) != 7) continue;
    if (n == cap) {
      event *more = realloc(*out, (size_t)(cap = cap ? 2 * cap : 64) * sizeof *more);
      if (!more) break;
      *out = more;
    }
    (*out)[n++] = e;
  }
  if (fp) fclose(fp);
  return n;
}

loom_status loom_goodput_open(loom_goodput *g, const char *dir, double launched, bool resumed, int64_t from_step,
                              double restore_s, loom_error *err) {
  *g = (loom_goodput){.launched = launched, .step = from_step, .attempt = 1};
  snprintf(g->ledger, sizeof g->ledger, "%s/goodput.jsonl", dir);
  snprintf(g->progress, sizeof g->progress, "%s/goodput.progress", dir);
  event *e;
  const int n = read_events(g->ledger, &e);
  if (!resumed && n > 0) { /* training afresh (--force): a new ledger */
    unlink(g->ledger);
  } else if (n > 0) {
    g->attempt = e[n - 1].attempt + 1;
    event *last;
    if (strcmp(e[n - 1].event, "end") != 0 && read_events(g->progress, &last) == 1) { /* the failed attempt's last sign */
      FILE *fp = fopen(g->ledger, "a");
      if (fp) {
        fprintf(fp, LINE_FORMAT, last->attempt, "last", last->step, last->time, last->launched, last->step_s, last->stall_s);
        fclose(fp);
      }
      free(last);
    }
  }
  free(e);
  unlink(g->progress);
  FILE *fp = fopen(g->ledger, "a");
  if (!fp) return loom_fail(err, LOOM_ERR_IO, "%s: cannot append to the goodput ledger", g->ledger);
  fclose(fp);
  append(g, "start", from_step, 0.0, restore_s);
  return LOOM_OK;
}

void loom_goodput_step(loom_goodput *g, int64_t step, double seconds) {
  g->step = step;
  g->step_s += seconds;
  char line[512];
  const int len = snprintf(line, sizeof line, LINE_FORMAT, g->attempt, "last", (long long)step, loom_goodput_clock(),
                           g->launched, g->step_s, g->stall_s);
  /* A heartbeat, rewritten whole by a rename; not synced to disk (a step's fsync on a shared file system costs more
   * than the line is worth). */
  char tmp[4300];
  snprintf(tmp, sizeof tmp, "%s.tmp", g->progress);
  FILE *fp = fopen(tmp, "w");
  if (!fp) return;
  const bool ok = fwrite(line, 1, (size_t)len, fp) == (size_t)len;
  if (fclose(fp) == 0 && ok) rename(tmp, g->progress);
  else unlink(tmp);
}

void loom_goodput_saved(loom_goodput *g, int64_t step, double stall_s) {
  g->stall_s += stall_s;
  append(g, "save", step, g->step_s, stall_s);
}

void loom_goodput_stalled(loom_goodput *g, double stall_s) { g->stall_s += stall_s; }

loom_status loom_goodput_summarize(const char *ledger, double now, loom_goodput_summary *s, loom_error *err) {
  event *e;
  const int n = read_events(ledger, &e);
  *s = (loom_goodput_summary){0};
  if (n == 0) return loom_fail(err, LOOM_ERR_FORMAT, "%s: holds no goodput events", ledger);
  double last_alive = 0.0;
  for (int i = 0; i < n; i++) {
    if (strcmp(e[i].event, "start") != 0) continue;
    const event *start = &e[i];
    s->attempts++;
    s->restore_s += start->stall_s;
    /* starting: from the launch (or the previous attempt's last sign of life) to training, less the restore */
    s->relaunch_s += start->time - (s->attempts == 1 ? start->launched : last_alive) - start->stall_s;
    const event *end = NULL, *next = NULL;
    for (int j = i + 1; j < n && !next; j++) {
      if (strcmp(e[j].event, "start") == 0) next = &e[j];
      else if (e[j].attempt == start->attempt && (!strcmp(e[j].event, "last") || !strcmp(e[j].event, "end"))) end = &e[j];
    }
    if (!end) continue; /* no sign of life: nothing trained */
    last_alive = end->time;
    s->save_s += end->stall_s;
    double kept = end->step_s;
    if (next) { /* the next attempt restarted from a save: what this one did after it is lost */
      kept = 0.0;
      for (int j = i + 1; j < n && &e[j] != next; j++)
        if (!strcmp(e[j].event, "save") && e[j].attempt == start->attempt && e[j].step == next->step) kept = e[j].step_s;
      if (next->step <= start->step) kept = 0.0;
      s->lost_steps += end->step > next->step ? end->step - (next->step > start->step ? next->step : start->step) : 0;
      s->lost_s += end->step_s - kept;
    }
    s->kept_s += kept;
  }
  s->wall_s = now - e[0].launched;
  s->other_s = s->wall_s - s->kept_s - s->save_s - s->restore_s - s->lost_s - s->relaunch_s;
  s->goodput = s->wall_s > 0 ? s->kept_s / s->wall_s : 0.0;
  free(e);
  return LOOM_OK;
}

loom_status loom_goodput_close(loom_goodput *g, loom_goodput_summary *out, loom_error *err) {
  append(g, "end", g->step, g->step_s, g->stall_s);
  unlink(g->progress);
  return loom_goodput_summarize(g->ledger, loom_goodput_clock(), out, err);
}

void loom_goodput_describe(const loom_goodput_summary *s, char *out, size_t len) {
  snprintf(out, len, "goodput: %.1f%% of %.1f s wall over %d attempt%s kept as training steps (%.1f s); lost to saves "
           "%.2f s, restores %.2f s, %lld lost step%s %.2f s, starts and relaunches %.1f s, the rest (evals, logging) %.2f s",
           100.0 * s->goodput, s->wall_s, s->attempts, s->attempts == 1 ? "" : "s", s->kept_s, s->save_s, s->restore_s,
           (long long)s->lost_steps, s->lost_steps == 1 ? "" : "s", s->lost_s, s->relaunch_s, s->other_s);
}
