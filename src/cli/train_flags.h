/* What `loom train` is asked to do: its flag table and defaults, the checks
 * across flags, the memory check before anything is allocated, and `--plan`,
 * which fills the model and layout flags from a plan file. */
#ifndef LOOM_TRAIN_FLAGS_H
#define LOOM_TRAIN_FLAGS_H

#include <stdint.h>
#include "cli/flags.h"
#include "cli/model_flags.h"
#include "layers/gpt_config.h"

typedef struct {
  loom_model_flags model;
  int micro_batch, global_batch, steps, warmup, digits, eval_every, eval_batches, threads, log_every, tp;
  int pp, vpp, dp, zero, micro_batches, save_every, keep;
  bool resume;
  const char *ckpt;
  bool sequence_parallel;
  int64_t seed;
  float lr, min_lr_frac, weight_decay, grad_clip, straggler_factor, bucket_mb, watchdog_timeout;
  const char *data, *eval_data, *data_order, *synthetic, *metrics, *save;
  const char *schedule, *recompute, *layer_split, *trace, *plan, *device;
} loom_train_flags;

#define LOOM_TRAIN_FLAG_COUNT (LOOM_MODEL_FLAG_COUNT + 40)
#define LOOM_MAX_STAGES 1024

loom_train_flags loom_train_flags_defaults(void);
/* Writes the table of every `loom train` flag, pointing into f. */
void loom_train_flags_table(loom_train_flags *f, loom_flag *table);
/* Cross-flag checks the table cannot express. */
loom_status loom_train_flags_check(const loom_train_flags *f, const loom_flag *table, const loom_gpt_config *cfg,
                                   loom_error *err);
/* Refuses a run that cannot fit in this machine's memory before allocating
 * any of it: all `ranks` of the machine share it. */
loom_status loom_train_check_memory(const loom_gpt_config *cfg, int T, int B, int tp, bool sp, int ranks,
                                    loom_error *err);
/* Fills the model and layout from f->plan, refusing broken plans and flags
 * the plan fixes; counts[*ncounts] gets the layers of each virtual stage. */
loom_status loom_train_apply_plan(loom_train_flags *f, const loom_flag *table, loom_gpt_config *cfg, int *T,
                                  int *counts, int *ncounts, loom_error *err);

#endif
