/* What `loom train` is asked to do: the plan flags (shared with `loom plan
 * new`) or --plan, and the flags of the run itself: data, optimizer, steps,
 * outputs. */
#ifndef LOOM_TRAIN_FLAGS_H
#define LOOM_TRAIN_FLAGS_H

#include <stdint.h>
#include "cli/flags.h"
#include "cli/plan_flags.h"
#include "optim/lr_schedule.h"

typedef struct {
  loom_plan_flags layout;
  int steps, warmup, wsd_decay_steps, digits, eval_every, eval_batches, threads, log_every, save_every, keep, local_every,
      flight_entries;
  bool resume, async_save, print_plan, elastic, preflight, force;
  const char *ckpt, *local_dir, *flight_dir;
  int64_t seed;
  float lr, min_lr_frac, weight_decay, grad_clip, straggler_factor, bucket_mb, watchdog_timeout;
  const char *data, *eval_data, *split, *data_order, *synthetic, *metrics, *save, *tensorboard_dir;
  const char *trace, *plan, *device, *lr_decay, *wsd_shape;
} loom_train_flags;

/* Where --local-save-every's copies go unless --local-dir says: tmpfs, host memory. */
#define LOOM_LOCAL_DIR_DEFAULT "/dev/shm/loom-local"
#define LOOM_TRAIN_FLAG_COUNT (LOOM_PLAN_FLAG_COUNT + 42)

loom_train_flags loom_train_flags_defaults(void);
/* The learning-rate schedule the flags ask for. */
loom_lr_schedule loom_train_flags_lr(const loom_train_flags *f);
/* Writes the table of every `loom train` flag, pointing into f. */
void loom_train_flags_table(loom_train_flags *f, loom_flag *table);
/* Cross-flag checks of the run's own flags (the plan's rules judge the layout). */
loom_status loom_train_flags_check(const loom_train_flags *f, const loom_flag *table, const loom_plan *plan,
                                   loom_error *err);
/* Every output the run will write (--save, --metrics, --trace, --ckpt),
 * checked before the first step on the rank that writes them: each can be
 * written, none replaces what is there without --force, --save's name fits
 * its format, and --ckpt over a checkpoint needs --resume or --force. */
loom_status loom_train_flags_check_outputs(const loom_train_flags *f, const loom_plan *plan, loom_error *err);
/* The plan to run: --plan's file (refusing flags it fixes), else the plan
 * flags through the same builder as `loom plan new`. */
loom_status loom_train_plan(loom_train_flags *f, const loom_flag *table, loom_plan **plan, loom_error *err);

#endif
