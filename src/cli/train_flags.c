/* `loom train`'s flags: table, defaults, cross-flag and memory checks, --plan. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/launch.h"
#include "cli/train_flags.h"
#include "cli/device.h"
#include "core/sysinfo.h"
#include "data/addition.h"
#include "data/byte_tokenizer.h"
#include "layers/gpt.h"
#include "pipeline/layer_split.h"
#include "plan/plan.h"

static const char *const ORDER_CHOICES[] = {"sequential", "shuffled", NULL};
static const char *const SYNTHETIC_CHOICES[] = {"addition", NULL};
static const char *const SCHEDULE_CHOICES[] = {"gpipe", "1f1b", "interleaved", NULL};
static const char *const RECOMPUTE_CHOICES[] = {"none", "full", NULL};


void loom_train_flags_table(loom_train_flags *f, loom_flag *t) {
  loom_model_flags_table(&f->model, t);
  const loom_flag rest[] = {
      {"--micro-batch", FLAG_INT, &f->micro_batch, "sequences per micro-batch", 1, 1 << 20, NULL, false},
      {"--global-batch", FLAG_INT, &f->global_batch, "sequences per optimizer step (0: the micro-batch)", 0, 1 << 24, NULL, false},
      {"--steps", FLAG_INT, &f->steps, "optimizer steps", 1, 1e9, NULL, false},
      {"--lr", FLAG_FLOAT, &f->lr, "peak learning rate", 0, 10, NULL, false},
      {"--min-lr-frac", FLAG_FLOAT, &f->min_lr_frac, "final cosine LR as a fraction of --lr", 0, 1, NULL, false},
      {"--warmup", FLAG_INT, &f->warmup, "linear warmup steps", 0, 1e9, NULL, false},
      {"--weight-decay", FLAG_FLOAT, &f->weight_decay, "AdamW decoupled weight decay", 0, 10, NULL, false},
      {"--grad-clip", FLAG_FLOAT, &f->grad_clip, "max global grad norm (0: off)", 0, 1e9, NULL, false},
      {"--seed", FLAG_INT64, &f->seed, "seed of init, data order and dropout", 0, 9007199254740991.0, NULL, false},
      {"--data", FLAG_STRING, &f->data, "train on an llm.c token file", LOOM_NO_RANGE, NULL, false},
      {"--eval-data", FLAG_STRING, &f->eval_data, "held-out token file (default: the tail of --data)", LOOM_NO_RANGE, NULL, false},
      {"--data-order", FLAG_STRING, &f->data_order, "order of --data windows", LOOM_NO_RANGE, ORDER_CHOICES, false},
      {"--synthetic", FLAG_STRING, &f->synthetic, "train on a built-in task (used when --data is absent)", LOOM_NO_RANGE, SYNTHETIC_CHOICES, false},
      {"--digits", FLAG_INT, &f->digits, "operand digits of the addition task", 1, 9, NULL, false},
      {"--eval-every", FLAG_INT, &f->eval_every, "held-out evaluation every N steps (0: off)", 0, 1e9, NULL, false},
      {"--eval-batches", FLAG_INT, &f->eval_batches, "micro-batches per evaluation", 1, 1e6, NULL, false},
      {"--log-every", FLAG_INT, &f->log_every, "print a progress line every N steps", 1, 1e9, NULL, false},
      {"--metrics", FLAG_STRING, &f->metrics, "write JSON lines of per-step metrics here", LOOM_NO_RANGE, NULL, false},
      {"--save", FLAG_STRING, &f->save, "save the final model in llm.c format", LOOM_NO_RANGE, NULL, false},
      {"--device", FLAG_STRING, &f->device, "compute backend: auto (cuda when a GPU is visible), cpu or cuda", LOOM_NO_RANGE, LOOM_DEVICE_CHOICES, false},
      {"--threads", FLAG_INT, &f->threads, "CPU threads per rank (0: the node's cores shared among its ranks)", 0, 4096, NULL, false},
      {"--tp", FLAG_INT, &f->tp, "tensor-parallel ranks (launch with mpirun -np TP)", 1, 4096, NULL, false},
      {"--sequence-parallel", FLAG_BOOL, &f->sequence_parallel, "split norms and dropout along the sequence across the TP group", LOOM_NO_RANGE, NULL, false},
      {"--pp", FLAG_INT, &f->pp, "pipeline stages (world size = tp x pp x dp)", 1, 1024, NULL, false},
      {"--dp", FLAG_INT, &f->dp, "data-parallel replicas, each taking its share of the global batch", 1, 1 << 20, NULL, false},
      {"--straggler-factor", FLAG_FLOAT, &f->straggler_factor, "name a rank whose compute time exceeds the median by this factor", 1, 100, NULL, false},
      {"--ckpt", FLAG_STRING, &f->ckpt, "checkpoint directory (sharded, one file per rank)", LOOM_NO_RANGE, NULL, false},
      {"--save-every", FLAG_INT, &f->save_every, "checkpoint every N steps (0: only at the end)", 0, 1e9, NULL, false},
      {"--watchdog-timeout", FLAG_FLOAT, &f->watchdog_timeout, "abort, naming the stalled ranks, when a collective waits this many seconds (0: never)", 0, 1e6, NULL, false},
      {"--keep", FLAG_INT, &f->keep, "keep the newest N checkpoints, removing older ones (0: keep all)", 0, 1e9, NULL, false},
      {"--resume", FLAG_BOOL, &f->resume, "continue from the checkpoint --ckpt/latest names; --steps counts from the start", LOOM_NO_RANGE, NULL, false},
      {"--dp-bucket-mb", FLAG_FLOAT, &f->bucket_mb, "grad all-reduce bucket size in MiB, reduced during backward (0: at the end)", 0, 1e5, NULL, false},
      {"--zero", FLAG_INT, &f->zero, "ZeRO stage: 1 shards Adam state over the dp replicas", 0, 1, NULL, false},
      {"--vpp", FLAG_INT, &f->vpp, "model chunks per pipeline rank (--schedule interleaved)", 1, 64, NULL, false},
      {"--micro-batches", FLAG_INT, &f->micro_batches, "micro-batches per step and replica (0: global batch / (micro-batch x dp))", 0, 16383, NULL, false},
      {"--schedule", FLAG_STRING, &f->schedule, "pipeline schedule", LOOM_NO_RANGE, SCHEDULE_CHOICES, false},
      {"--recompute", FLAG_STRING, &f->recompute, "activation recomputation in backward", LOOM_NO_RANGE, RECOMPUTE_CHOICES, false},
      {"--layer-split", FLAG_STRING, &f->layer_split, "layers per stage, e.g. 7,8,8,7 (default: even)", LOOM_NO_RANGE, NULL, false},
      {"--trace", FLAG_STRING, &f->trace, "write the last step's pipeline timeline as Chrome-trace JSON", LOOM_NO_RANGE, NULL, false},
      {"--plan", FLAG_STRING, &f->plan, "run a partition plan (.txtpb or .pb); it fixes the model and layout", LOOM_NO_RANGE, NULL, false},
  };
  _Static_assert(sizeof rest / sizeof rest[0] == LOOM_TRAIN_FLAG_COUNT - LOOM_MODEL_FLAG_COUNT, "LOOM_TRAIN_FLAG_COUNT");
  memcpy(t + LOOM_MODEL_FLAG_COUNT, rest, sizeof rest);
}

/* The flags a plan fixes; with --plan only steps, learning rate, data and
 * output paths (and how progress is shown) may be given. */
static const char *const PLAN_FIXED[] = {"--model", "--layers", "--hidden", "--heads", "--ffn", "--vocab", "--seq",
                                         "--dropout", "--micro-batch", "--global-batch", "--micro-batches", "--tp",
                                         "--pp", "--vpp", "--dp", "--zero", "--sequence-parallel", "--schedule", "--recompute",
                                         "--layer-split", NULL};

/* Fills the model and layout flags from a plan file, refusing broken plans. */
loom_status loom_train_apply_plan(loom_train_flags *f, const loom_flag *t, loom_gpt_config *cfg, int *T, int *counts,
                                  int *ncounts, loom_error *err) {
  for (const char *const *name = PLAN_FIXED; *name; name++)
    if (loom_flags_find(t, LOOM_TRAIN_FLAG_COUNT, *name)->set)
      return loom_fail(err, LOOM_ERR_USAGE, "loom train: %s cannot be combined with --plan: the plan fixes the model and layout",
                       *name);
  loom_plan *plan;
  loom_status st = loom_plan_read(f->plan, &plan, err);
  if (st != LOOM_OK) return st;
  char lines[2048];
  if (loom_plan_check_rules(plan, loom_launch_env_size(), 0, lines, sizeof lines) > 0) {
    char *nl = strchr(lines, '\n');
    if (nl) *nl = '\0';
    st = loom_fail(err, LOOM_ERR_USAGE, "loom train: %s: %s (loom plan check lists every problem)", f->plan, lines);
  } else if (plan->parallel->zero_stage > 1) {
    st = loom_fail(err, LOOM_ERR_USAGE, "loom train: %s: zero_stage %d: loom has ZeRO stage 0 or 1", f->plan,
                   plan->parallel->zero_stage);
  }
  for (size_t k = 1; st == LOOM_OK && k < plan->n_stages; k++)
    if (plan->stages[k]->recompute != plan->stages[0]->recompute)
      st = loom_fail(err, LOOM_ERR_USAGE, "loom train: %s: stages disagree on recompute; this loom recomputes all stages or none",
                     f->plan);
  if (st == LOOM_OK) {
    const Loom__Model *m = plan->model;
    *cfg = (loom_gpt_config){.layers = m->layers, .hidden = m->hidden, .heads = m->heads, .ffn = m->ffn,
                             .vocab = m->vocab, .seq = m->seq, .dropout = m->dropout, .norm_eps = m->norm_eps};
    loom_gpt_config_finish(cfg);
    *T = m->seq;
    f->tp = plan->parallel->tp;
    f->pp = plan->parallel->pp;
    f->vpp = plan->parallel->virtual_chunks;
    f->dp = plan->parallel->dp;
    f->zero = plan->parallel->zero_stage;
    f->sequence_parallel = plan->parallel->sequence_parallel;
    f->micro_batch = plan->batch->micro_batch;
    f->global_batch = plan->batch->global_batch;
    static const char *const KINDS[] = {"1f1b", "gpipe", "interleaved"};
    f->schedule = KINDS[plan->schedule];
    f->recompute = plan->n_stages && plan->stages[0]->recompute ? "full" : "none";
    *ncounts = loom_plan_layer_counts(plan, counts);
  }
  loom_plan_free(plan);
  return st;
}

loom_train_flags loom_train_flags_defaults(void) {
  return (loom_train_flags){.model = {.preset = "gpt-tiny"}, .micro_batch = 16, .global_batch = 0,
                       .steps = 2000, .warmup = 30, .digits = LOOM_ADDITION_DEFAULT_DIGITS,
                       .eval_every = 250, .eval_batches = 8, .threads = 0, .log_every = 1, .tp = 1,
                       .pp = 1, .vpp = 1, .dp = 1, .straggler_factor = 1.5f, .bucket_mb = 4.0f, .watchdog_timeout = 600.0f, .schedule = "1f1b", .recompute = "none",
                       .seed = 1337, .lr = 3e-3f, .min_lr_frac = 0.1f, .weight_decay = 0.1f,
                       .grad_clip = 1.0f, .data_order = "sequential", .synthetic = "addition", .device = "auto"};
}

loom_status loom_train_flags_check(const loom_train_flags *f, const loom_flag *t, const loom_gpt_config *cfg,
                                   loom_error *err) {
  if (f->global_batch % (f->micro_batch * f->dp) != 0) {
    char dp[24] = "";
    if (f->dp > 1) snprintf(dp, sizeof dp, " x --dp %d", f->dp);
    return loom_fail(err, LOOM_ERR_USAGE, "loom train: --global-batch %d is not a multiple of --micro-batch %d%s",
                     f->global_batch, f->micro_batch, dp);
  }
  if (f->data && loom_flags_find(t, LOOM_TRAIN_FLAG_COUNT, "--synthetic")->set)
    return loom_fail(err, LOOM_ERR_USAGE, "loom train: give --data or --synthetic, not both");
  if (f->eval_data && !f->data)
    return loom_fail(err, LOOM_ERR_USAGE, "loom train: --eval-data needs --data");
  if (f->micro_batches && loom_flags_find(t, LOOM_TRAIN_FLAG_COUNT, "--global-batch")->set &&
      f->global_batch != f->micro_batches * f->micro_batch * f->dp)
    return loom_fail(err, LOOM_ERR_USAGE, "loom train: --global-batch %d != --micro-batches %d x --micro-batch %d%s",
                     f->global_batch, f->micro_batches, f->micro_batch, f->dp > 1 ? " x --dp" : "");
  if (f->layer_split && loom_layer_split_parse(f->layer_split, (int[LOOM_MAX_STAGES]){0}, LOOM_MAX_STAGES) < 0)
    return loom_fail(err, LOOM_ERR_USAGE, "loom train: --layer-split '%s' is not a comma-separated list of layer counts",
                     f->layer_split);
  if ((f->resume || loom_flags_find(t, LOOM_TRAIN_FLAG_COUNT, "--save-every")->set ||
       loom_flags_find(t, LOOM_TRAIN_FLAG_COUNT, "--keep")->set) && !f->ckpt)
    return loom_fail(err, LOOM_ERR_USAGE, "loom train: --resume, --save-every and --keep need --ckpt DIR");
  if (!f->data && cfg->vocab < LOOM_BYTE_VOCAB)
    return loom_fail(err, LOOM_ERR_USAGE, "loom train: --synthetic %s needs --vocab of at least %d (byte tokens), got %d",
                     f->synthetic, LOOM_BYTE_VOCAB, cfg->vocab);
  return LOOM_OK;
}

loom_status loom_train_check_memory(const loom_gpt_config *cfg, int T, int B, int tp, bool sp, int ranks,
                                    loom_error *err) {
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const double per_rank_state = 4.0 * sizeof(float) * (double)loom_gpt_param_count(cfg, tp); /* params, grads, Adam m, v */
  const double state = ranks * per_rank_state;
  const double acts = ranks * (double)loom_gpt_activation_bytes(cfg, T, B, tp, sp, NULL, false, 1);
  const double avail = (double)loom_mem_available_bytes();
  if (state + acts <= avail) return LOOM_OK;
  return loom_fail(err, LOOM_ERR_USAGE,
                   "loom train: this run needs %.1f GiB (parameters, grads and Adam state %.1f GiB, activations "
                   "%.1f GiB for micro-batch %d x seq %d) but %.1f GiB is available; lower --micro-batch or --seq",
                   (state + acts) / gib, state / gib, acts / gib, B, T, avail / gib);
}

