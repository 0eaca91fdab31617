/* The goodput ledger: across restarts, what share of the wall-clock time
 * ended up as kept training steps. Rank 0 keeps it in the checkpoint
 * directory: goodput.jsonl, one line per event of each attempt (its start
 * with the restore's seconds, each save with the step time it would keep,
 * the last sign of life of an attempt that failed, the end), and
 * goodput.progress, rewritten after every step, which the next attempt
 * moves into the ledger as the failed attempt's last line. */
#ifndef LOOM_GOODPUT_H
#define LOOM_GOODPUT_H

#include <stdbool.h>
#include <stdint.h>
#include "core/status.h"

typedef struct {
  char ledger[4200], progress[4200];
  int attempt;
  double launched;   /* this process's start, seconds since the epoch */
  double step_s;     /* step time of this attempt so far */
  double stall_s;    /* the step loop's stalls for saves, this attempt */
  int64_t step;      /* the last step done */
} loom_goodput;

/* Where the wall time of every attempt together went. */
typedef struct {
  int attempts;
  double wall_s, kept_s, save_s, restore_s, lost_s, relaunch_s, other_s;
  int64_t lost_steps;
  double goodput; /* kept_s / wall_s */
} loom_goodput_summary;

/* Seconds since the epoch now; loom train notes it at its start (the launched time). */
double loom_goodput_clock(void);
/* Opens dir's ledger for an attempt that trains from step from_step after restore_s seconds of loading; a run
 * that does not resume starts a new ledger. */
loom_status loom_goodput_open(loom_goodput *g, const char *dir, double launched, bool resumed, int64_t from_step,
                              double restore_s, loom_error *err);
/* After each step: its seconds; the heartbeat rewritten. */
void loom_goodput_step(loom_goodput *g, int64_t step, double seconds);
/* A save of `step` started (the loop stalled stall_s for it): the step time it keeps, should a restart load it. */
void loom_goodput_saved(loom_goodput *g, int64_t step, double stall_s);
/* Time the loop stalled recording saves (a settle). */
void loom_goodput_stalled(loom_goodput *g, double stall_s);
/* The run ended at step: the end line, and the summary over every attempt in the ledger. */
loom_status loom_goodput_close(loom_goodput *g, loom_goodput_summary *out, loom_error *err);
/* Reads a ledger and sums it as of `now` (the summary's wall time ends there). */
loom_status loom_goodput_summarize(const char *ledger, double now, loom_goodput_summary *out, loom_error *err);
/* The run's closing line of it. */
void loom_goodput_describe(const loom_goodput_summary *s, char *out, size_t len);

#endif
