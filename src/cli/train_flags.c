/* `loom train`'s flags: table, defaults, cross-flag checks, the plan. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "backend/cpu/cpu_peak.h"
#include "ckpt/export.h"
#include "ckpt/run_files.h"
#include "cli/flag_defs.h"
#include "cli/device.h"
#include "core/write_file.h"
#include "cli/train_flags.h"
#include "data/addition.h"
#include "data/byte_tokenizer.h"
#include "data/dataset.h"

static const char *const ORDER_CHOICES[] = {"sequential", "shuffled", NULL};
static const char *const SYNTHETIC_CHOICES[] = {"addition", NULL};


void loom_train_flags_table(loom_train_flags *f, loom_flag *t) {
  loom_plan_flags_table(&f->layout, t);
  const loom_flag rest[] = {
      loom_flag_def("--steps", &f->steps),
      {"--lr", FLAG_FLOAT, &f->lr, "peak learning rate", 0, 10, NULL, false, NULL},
      {"--min-lr-frac", FLAG_FLOAT, &f->min_lr_frac, "final LR as a fraction of --lr", 0, 1, NULL, false, NULL},
      {"--warmup", FLAG_INT, &f->warmup, "linear warmup steps", 0, 1e9, NULL, false, NULL},
      {"--lr-decay-style", FLAG_STRING, &f->lr_decay, "after warmup: cosine over the rest of the run, or WSD (stable, "
       "then the last --lr-wsd-decay-iters steps anneal)", LOOM_NO_RANGE, LOOM_LR_DECAY_NAMES, false, NULL},
      {"--lr-wsd-decay-iters", FLAG_INT, &f->wsd_decay_steps, "WSD: the steps that anneal, the run's last ones", 1, 1e9,
       NULL, false, NULL},
      {"--lr-wsd-decay-style", FLAG_STRING, &f->wsd_shape, "WSD: the annealing's shape", LOOM_NO_RANGE,
       LOOM_WSD_SHAPE_NAMES, false, NULL},
      {"--weight-decay", FLAG_FLOAT, &f->weight_decay, "AdamW decoupled weight decay", 0, 10, NULL, false, NULL},
      {"--grad-clip", FLAG_FLOAT, &f->grad_clip, "max global grad norm (0: off)", 0, 1e9, NULL, false, NULL},
      loom_flag_def_as("--seed", &f->seed, "seed of init, data order and dropout"),
      loom_flag_def_as("--data", &f->data, "train on an llm.c token file, a Megatron indexed dataset PREFIX, or a blend \"W1 PREFIX1 W2 PREFIX2 ...\""),
      {"--eval-data", FLAG_STRING, &f->eval_data, "held-out data of the same kinds (default: the tail of a token file, --split's share of indexed data)", LOOM_NO_RANGE, NULL, false, NULL},
      {"--split", FLAG_STRING, &f->split, "indexed data: shares of documents for train,held-out,test (Megatron's --split)", LOOM_NO_RANGE, NULL, false, NULL},
      {"--data-order", FLAG_STRING, &f->data_order, "order of --data samples (default: sequential for a token file, shuffled for indexed data)", LOOM_NO_RANGE, ORDER_CHOICES, false, NULL},
      {"--synthetic", FLAG_STRING, &f->synthetic, "train on a built-in task (used when --data is absent)", LOOM_NO_RANGE, SYNTHETIC_CHOICES, false, NULL},
      {"--digits", FLAG_INT, &f->digits, "operand digits of the addition task", 1, 9, NULL, false, NULL},
      {"--eval-every", FLAG_INT, &f->eval_every, "held-out evaluation every N steps (0: off)", 0, 1e9, NULL, false, NULL},
      {"--eval-batches", FLAG_INT, &f->eval_batches, "micro-batches per evaluation", 1, 1e6, NULL, false, NULL},
      {"--log-every", FLAG_INT, &f->log_every, "a plain progress line every N steps (0: one status line on a terminal, else every 10)", 0, 1e9, NULL, false, NULL},
      {"--metrics", FLAG_STRING, &f->metrics, "write JSON lines of per-step metrics here", LOOM_NO_RANGE, NULL, false, NULL},
      {"--tensorboard-dir", FLAG_STRING, &f->tensorboard_dir, "write TensorBoard event files of the same numbers here, under "
       "Megatron-LM's scalar names (a new file per run, beside earlier runs' files)", LOOM_NO_RANGE, NULL, false, NULL},
      {"--save", FLAG_STRING, &f->save, "save the final model: an llm.c file for GPT-2, a Hugging Face directory for other models (a Mixture of Experts: "
       "a .safetensors file)", LOOM_NO_RANGE, NULL, false, NULL},
      loom_flag_def("--device", &f->device),
      loom_flag_def("--threads", &f->threads),
      {"--straggler-factor", FLAG_FLOAT, &f->straggler_factor, "name a rank whose compute time exceeds the median by this factor", 1, 100, NULL, false, NULL},
      {"--ckpt", FLAG_STRING, &f->ckpt, "checkpoint directory (sharded, one file per rank)", LOOM_NO_RANGE, NULL, false, NULL},
      {"--save-every", FLAG_INT, &f->save_every, "checkpoint every N steps (0: only at the end)", 0, 1e9, NULL, false, NULL},
      {"--watchdog-timeout", FLAG_FLOAT, &f->watchdog_timeout, "abort, naming the stalled ranks, when a collective waits this many seconds (0: never)", 0, 1e6, NULL, false, NULL},
      {"--flight-recorder", FLAG_INT, &f->flight_entries, "keep each rank's last N collectives and transfers; when the "
       "watchdog fires, name the first one the ranks disagree on (0: off)", 0, 1e7, NULL, false, NULL},
      {"--flight-recorder-dir", FLAG_STRING, &f->flight_dir, "where each rank's ring is written when the watchdog fires "
       "(default: --ckpt's directory; none without it)", LOOM_NO_RANGE, NULL, false, NULL},
      {"--keep", FLAG_INT, &f->keep, "keep the newest N checkpoints, removing older ones (0: keep all)", 0, 1e9, NULL, false, NULL},
      {"--async-save", FLAG_BOOL, &f->async_save, "write checkpoints on a thread while training goes on: the step loop "
       "stalls only to copy the shard to host memory (Megatron-LM's --async-save)", LOOM_NO_RANGE, NULL, false, NULL},
      {"--local-save-every", FLAG_INT, &f->local_every, "also checkpoint every N steps into host memory (--local-dir), "
       "each shard replicated on a rank of the next host: a restart loads the newest complete set from there, else "
       "--ckpt's (0: never)", 0, 1e9, NULL, false, NULL},
      {"--local-dir", FLAG_STRING, &f->local_dir, "where the in-memory checkpoints live, as DIR/HOST on each host (default "
       "/dev/shm/loom-local)", LOOM_NO_RANGE, NULL, false, NULL},
      {"--resume", FLAG_BOOL, &f->resume, "continue from the checkpoint --ckpt/latest names; --steps counts from the start", LOOM_NO_RANGE, NULL, false, NULL},
      loom_flag_def_as("--force", &f->force, "replace outputs that exist (--save, --metrics, --trace) and train afresh over --ckpt's checkpoints"),
      {"--elastic", FLAG_BOOL, &f->elastic, "on fewer ranks than the plan's, lower dp to world / (tp x pp), keeping the global batch (a restart after a lost host)", LOOM_NO_RANGE, NULL, false, NULL},
      {"--preflight", FLAG_BOOL, &f->preflight, "first measure every rank, group and link as `loom preflight` does; stop if one is slow", LOOM_NO_RANGE, NULL, false, NULL},
      {"--dp-bucket-mb", FLAG_FLOAT, &f->bucket_mb, "grad all-reduce bucket size in MiB, reduced during backward (0: at the end)", 0, 1e5, NULL, false, NULL},
      loom_flag_def_as("--trace", &f->trace, "write the last step's pipeline timeline as Chrome-trace JSON"),
      loom_flag_def_as("--plan", &f->plan, "run a partition plan (.txtpb or .pb); it fixes the model and layout"),
      {"--print-plan", FLAG_BOOL, &f->print_plan, "print the plan this run would execute (text format) and exit", LOOM_NO_RANGE, NULL, false, NULL},
  };
  _Static_assert(sizeof rest / sizeof rest[0] == LOOM_TRAIN_FLAG_COUNT - LOOM_PLAN_FLAG_COUNT, "LOOM_TRAIN_FLAG_COUNT");
  memcpy(t + LOOM_PLAN_FLAG_COUNT, rest, sizeof rest);
}

loom_status loom_train_plan(loom_train_flags *f, const loom_flag *t, loom_plan **plan, loom_error *err) {
  return loom_plan_flags_or_file("loom train", f->plan, &f->layout, t, plan, err);
}

loom_train_flags loom_train_flags_defaults(void) {
  return (loom_train_flags){.layout = loom_plan_flags_defaults(), .steps = 2000, .warmup = 30,
                            .digits = LOOM_ADDITION_DEFAULT_DIGITS, .eval_every = 250, .eval_batches = 8, .threads = 0,
                            .log_every = 0, .straggler_factor = 1.5f, .bucket_mb = 4.0f, .watchdog_timeout = 600.0f, .flight_entries = 2048,
                            .seed = 1337, .lr = 3e-3f, .min_lr_frac = 0.1f, .weight_decay = 0.1f, .grad_clip = 1.0f,
                            .split = LOOM_DEFAULT_SPLIT, .synthetic = "addition", .device = "auto", .lr_decay = "cosine",
                            .wsd_shape = "exponential", .local_dir = LOOM_LOCAL_DIR_DEFAULT};
}

loom_lr_schedule loom_train_flags_lr(const loom_train_flags *f) {
  return (loom_lr_schedule){.max_lr = f->lr, .min_lr = f->lr * f->min_lr_frac, .warmup_steps = f->warmup,
                            .total_steps = f->steps,
                            .decay = (loom_lr_decay)loom_flag_choice_index(LOOM_LR_DECAY_NAMES, f->lr_decay),
                            .wsd_decay_steps = f->wsd_decay_steps,
                            .wsd_shape = (loom_wsd_shape)loom_flag_choice_index(LOOM_WSD_SHAPE_NAMES, f->wsd_shape)};
}

loom_status loom_train_flags_check(const loom_train_flags *f, const loom_flag *t, const loom_plan *plan,
                                   loom_error *err) {
  const bool wsd = strcmp(f->lr_decay, "WSD") == 0;
  if (wsd && !f->wsd_decay_steps)
    return loom_fail(err, LOOM_ERR_USAGE, "loom train: --lr-decay-style WSD needs --lr-wsd-decay-iters, the steps that anneal");
  if (!wsd && (loom_flags_find(t, LOOM_TRAIN_FLAG_COUNT, "--lr-wsd-decay-iters")->set ||
               loom_flags_find(t, LOOM_TRAIN_FLAG_COUNT, "--lr-wsd-decay-style")->set))
    return loom_fail(err, LOOM_ERR_USAGE, "loom train: --lr-wsd-decay-iters and --lr-wsd-decay-style shape WSD's annealing; "
                     "add --lr-decay-style WSD");
  if (wsd && f->warmup + f->wsd_decay_steps > f->steps)
    return loom_fail(err, LOOM_ERR_USAGE, "loom train: --warmup %d + --lr-wsd-decay-iters %d exceed --steps %d: WSD's warmup "
                     "and annealing must fit in the run", f->warmup, f->wsd_decay_steps, f->steps);
  if (f->data && loom_flags_find(t, LOOM_TRAIN_FLAG_COUNT, "--synthetic")->set)
    return loom_fail(err, LOOM_ERR_USAGE, "loom train: give --data or --synthetic, not both");
  if (f->eval_data && !f->data)
    return loom_fail(err, LOOM_ERR_USAGE, "loom train: --eval-data needs --data");
  if (loom_flags_find(t, LOOM_TRAIN_FLAG_COUNT, "--split")->set && !(f->data && loom_data_is_indexed(f->data)))
    return loom_fail(err, LOOM_ERR_USAGE, "loom train: --split applies to indexed datasets (--data PREFIX or a blend)");
  if (f->local_every && !f->ckpt)
    return loom_fail(err, LOOM_ERR_USAGE, "loom train: --local-save-every needs --ckpt DIR: the persistent checkpoint is "
                     "what a restart falls back to when no complete in-memory set is left");
  if (loom_flags_find(t, LOOM_TRAIN_FLAG_COUNT, "--local-dir")->set && !f->local_every)
    return loom_fail(err, LOOM_ERR_USAGE, "loom train: --local-dir names where --local-save-every's copies go; add it");
  if ((f->resume || f->async_save || loom_flags_find(t, LOOM_TRAIN_FLAG_COUNT, "--save-every")->set ||
       loom_flags_find(t, LOOM_TRAIN_FLAG_COUNT, "--keep")->set) && !f->ckpt)
    return loom_fail(err, LOOM_ERR_USAGE, "loom train: --resume, --async-save, --save-every and --keep need --ckpt DIR");
  if (!f->data && plan->model->vocab < LOOM_BYTE_VOCAB)
    return loom_fail(err, LOOM_ERR_USAGE, "loom train: --synthetic %s needs --vocab of at least %d (byte tokens), got %d",
                     f->synthetic, LOOM_BYTE_VOCAB, plan->model->vocab);
  return LOOM_OK;
}

loom_status loom_train_flags_check_outputs(const loom_train_flags *f, const loom_plan *plan, loom_error *err) {
  const loom_path_use uses[] = {
      {"--metrics", f->metrics, LOOM_PATH_OUTPUT},   {"--trace", f->trace, LOOM_PATH_OUTPUT},
      {"--save", f->save, LOOM_PATH_REPLACED},       {"--ckpt", f->ckpt, LOOM_PATH_OUTPUT},
      {"--tensorboard-dir", f->tensorboard_dir, LOOM_PATH_OUTPUT},
      {"--init-from", f->layout.model.init_from, LOOM_PATH_INPUT}, {"--plan", f->plan, LOOM_PATH_INPUT}};
  loom_status st = loom_paths_distinct("loom train", uses, sizeof uses / sizeof uses[0], err);
  if (st != LOOM_OK) return st;
  if (f->save) {
    loom_gpt_config cfg;
    loom_plan_model_config(plan, &cfg);
    st = loom_model_export_check(&cfg, loom_run_save_format(&cfg), "--save", f->save, f->force, false, err);
  }
  if (st == LOOM_OK && f->metrics) st = loom_output_check("--metrics", f->metrics, false, f->force || f->resume, err);
  if (st == LOOM_OK && f->trace) st = loom_output_check("--trace", f->trace, false, f->force, err);
  /* A directory of runs' files: one that exists is written into, as TensorBoard's writers do. */
  struct stat sb;
  const bool exists = f->tensorboard_dir && stat(f->tensorboard_dir, &sb) == 0;
  if (st == LOOM_OK && exists && !S_ISDIR(sb.st_mode))
    st = loom_fail(err, LOOM_ERR_USAGE, "--tensorboard-dir %s: is a file, not a directory of event files", f->tensorboard_dir);
  else if (st == LOOM_OK && exists && access(f->tensorboard_dir, W_OK) != 0)
    st = loom_fail(err, LOOM_ERR_USAGE, "--tensorboard-dir %s: cannot write into it: %s", f->tensorboard_dir, strerror(errno));
  else if (st == LOOM_OK && f->tensorboard_dir && !exists)
    st = loom_output_check("--tensorboard-dir", f->tensorboard_dir, true, false, err);
  if (st == LOOM_OK && f->ckpt && !f->resume && !f->force) {
    char latest[4200];
    snprintf(latest, sizeof latest, "%s/latest", f->ckpt);
    if (access(latest, F_OK) == 0)
      st = loom_fail(err, LOOM_ERR_USAGE, "--ckpt %s already holds a checkpoint; add --resume to continue it, or --force to "
                     "train afresh there (its steps are then replaced as the new run saves)", f->ckpt);
  }
  return st == LOOM_OK ? LOOM_OK : loom_error_prefix(err, st, "loom train");
}
