/* The training loop: steps [first_step, steps) of a trainer, with progress
 * (a status line on a terminal, a plain line every log_every steps
 * otherwise), a metrics line per step, held-out evals, the straggler report,
 * checkpoints through the caller's save hook, and a stop between steps when
 * a signal asks for one. Every rank runs it; rank 0 prints. */
#ifndef LOOM_TRAIN_LOOP_H
#define LOOM_TRAIN_LOOP_H

#include <signal.h>
#include "pipeline/goodput.h"
#include "pipeline/metrics.h"
#include "pipeline/trainer.h"

typedef struct {
  int first_step, steps;
  int log_every;            /* plain progress lines every N steps; 0: a status line on a terminal, else every 10 */
  int eval_every, eval_batches;
  int digits;               /* > 0: the data is the addition task, scored by exact match */
  float straggler_factor;   /* a rank slower than the median compute time by this is named */
  const char *trace;        /* NULL, or where the last step's Chrome trace goes */
  loom_metrics *metrics;
  double peak_gflops;       /* the job's dense peak, every device's (cli/device.h) summed: what MFU is a share of */
  const volatile sig_atomic_t *stop; /* nonzero on any rank: finish the step, save, return */
  /* Checkpoints every save_every steps (0: never), at the last step and on a stop. */
  int save_every;
  void *save_ctx;
  loom_status (*save)(void *ctx, int64_t step, loom_error *err); /* NULL: no checkpoints */
  /* After each step, and blocking at the end or a stop: record a save that
   * was written in the background (NULL: saves are synchronous). */
  loom_status (*settle)(void *ctx, bool blocking, loom_error *err);
  /* In-memory checkpoints every local_every steps (0: never), between the persistent ones. */
  int local_every;
  loom_status (*local_save)(void *ctx, int64_t step, loom_error *err);
  loom_goodput *goodput; /* rank 0's ledger (NULL: none): each step's time and each save's stall go in */
} loom_train_loop;

/* Logs the layout, the schedule's bubble, what recompute saves and what each rank holds. */
void loom_train_describe(const loom_trainer *tr);
/* Times `steps` training steps after one warm-up (which fills caches and
 * pages); returns the best step's seconds, the slowest rank's. Collective. */
double loom_train_best_step(loom_trainer *tr, int steps);
/* Runs the loop; *stopped says whether a signal ended it early. */
loom_status loom_train_run(loom_trainer *tr, const loom_train_loop *loop, bool *stopped, loom_error *err);

#endif
