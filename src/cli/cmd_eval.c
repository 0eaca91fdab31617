/* `loom eval`: mean loss of a model file over the first N sequential batches
 * of a token file, as llm.c's validation loop reads it. The flags become a
 * plan (any layout, under mpirun) and the runtime runs its forward-only
 * schedule; this file only parses and prints. */
#include <stdio.h>
#include <string.h>
#include "ckpt/run_files.h"
#include "cli/flag_defs.h"
#include "cli/commands.h"
#include "cli/device.h"
#include "cli/launch.h"
#include "cli/plan_flags.h"
#include "core/log.h"

typedef struct {
  loom_plan_flags layout; /* the model (from --init-from) and the layout */
  const char *data, *device;
  int batches;
} eval_flags;

#define EVAL_FLAG_COUNT (LOOM_PLAN_FLAG_COUNT + 3)

static loom_status eval_run(const loom_plan *plan, const eval_flags *f, const loom_ops *ops, loom_comm *world,
                            loom_error *err) {
  const int T = loom_plan_train_seq(plan), B = plan->batch->micro_batch;
  loom_dataset *data = NULL;
  /* The data is the held-out split, read from its start in order. */
  const loom_data_options d = {.data = f->data, .eval_data = f->data, .split = "1,0,0", .vocab = plan->model->vocab, .T = T, .hold_out = true};
  loom_status st = loom_dataset_open(&data, &d, err);
  if (st == LOOM_OK && (int64_t)f->batches * B > loom_dataset_samples(data, LOOM_SPLIT_HELDOUT))
    st = loom_fail(err, LOOM_ERR_USAGE, "loom eval: --batches %d x --micro-batch %d needs %lld windows of seq+1 tokens; %s has %lld",
                   f->batches, B, (long long)f->batches * B, f->data, (long long)loom_dataset_samples(data, LOOM_SPLIT_HELDOUT));
  loom_trainer tr = {0};
  loom_run_files files = {0};
  const loom_trainer_options o = {.forward_only = true};
  if (st == LOOM_OK) st = loom_trainer_init(&tr, world, plan, ops, data, &o, err);
  if (st == LOOM_OK) loom_run_files_init(&files, &tr, NULL, 0, 0, f->data);
  if (st == LOOM_OK) st = loom_run_init_from(&files, f->layout.model.init_from, err);
  loom_eval_stats e;
  if (st == LOOM_OK) st = loom_trainer_eval(&tr, f->batches, 0, &e, err);
  if (st == LOOM_OK)
    loom_log_info("eval: mean loss %.6f over %d batches of %d x %d tokens", (double)e.loss, f->batches, B, T);
  if (st == LOOM_OK && e.mtp_loss > 0.0) loom_log_info("eval: mtp loss %.6f (its modules' mean)", e.mtp_loss);
  loom_run_files_free(&files);
  loom_trainer_free(&tr);
  loom_dataset_free(data);
  return st;
}

int loom_cmd_eval(int argc, char **argv) {
  eval_flags f = {.layout = loom_plan_flags_defaults(), .batches = 10, .device = "auto"};
  f.layout.micro_batch = 4;
  loom_flag table[EVAL_FLAG_COUNT];
  loom_plan_flags_table(&f.layout, table);
  const loom_flag rest[] = {
      loom_flag_def_as("--data", &f.data, "an llm.c token file, a Megatron indexed dataset PREFIX, or a blend (required)"),
      {"--batches", FLAG_INT, &f.batches, "micro-batches to average over", 1, 1e9, NULL, false, NULL},
      loom_flag_def("--device", &f.device),
  };
  _Static_assert(sizeof rest / sizeof rest[0] == EVAL_FLAG_COUNT - LOOM_PLAN_FLAG_COUNT, "EVAL_FLAG_COUNT");
  memcpy(table + LOOM_PLAN_FLAG_COUNT, rest, sizeof rest);
  loom_error err = {0};
  bool help;
  const char *pos[1];
  int npos;
  loom_status st = loom_cli_parse("loom eval", "loom eval --init-from MODEL --data TOKENS [flags]", table, EVAL_FLAG_COUNT,
                                  argc, argv, pos, 0, &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  if (!f.layout.model.init_from || !f.data)
    return loom_report(loom_fail(&err, LOOM_ERR_USAGE, "loom eval: %s is required", f.layout.model.init_from ? "--data" : "--init-from"), &err);
  loom_plan *plan = NULL;
  st = loom_plan_flags_build("loom eval", &f.layout, table, &plan, &err);
  const int world = loom_launch_env_size();
  const loom_plan_limits limits = {.world = world};
  if (st == LOOM_OK) st = loom_plan_flags_refuse("loom eval", plan, &limits, table, NULL, &err);
  const loom_ops *ops = NULL;
  char device[160];
  if (st == LOOM_OK) st = loom_device_setup("loom eval", f.device, &ops, device, sizeof device, &err);
  if (st == LOOM_OK) st = loom_device_match_plan("loom eval", ops, plan, &err);
  if (st != LOOM_OK) {
    loom_plan_free(plan);
    return loom_report(st, &err);
  }
  loom_launch launch;
  st = loom_launch_init(&launch, &err);
  loom_log_set_quiet(launch.rank != 0);
  if (st == LOOM_OK) st = eval_run(plan, &f, ops, launch.world, &err);
  const int code = loom_report(st, &err);
  loom_launch_finish(&launch);
  loom_plan_free(plan);
  return code;
}
