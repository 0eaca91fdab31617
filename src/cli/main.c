/* The loom program: dispatches to its subcommands. */
#include <stdio.h>
#include <string.h>
#include "backend/cpu/cpu_peak.h"
#include "cli/commands.h"
#include "cli/launch.h"
#include "cli/sim_cli.h"
#include "core/fault.h"
#include "core/log.h"

typedef struct {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *help;
} command;

static const command COMMANDS[] = {
    {"plan", loom_cmd_plan, "partition plans: `loom plan new|show|check`"},
    {"sim", loom_cmd_sim, "predict a plan's step time, throughput and memory on a cluster: `loom sim --cluster a100-80gb`"},
    {"train", loom_cmd_train, "train a GPT (default: gpt-tiny on the addition task)"},
    {"preflight", loom_cmd_preflight, "measure every rank, group and link before a run; name the slow ones"},
    {"eval", loom_cmd_eval, "mean loss of a model file over a token file"},
    {"sample", loom_cmd_sample, "generate text from a model file"},
    {"bench", loom_cmd_bench, "benchmarks: `loom bench step`"},
    {"data", loom_cmd_data, "datasets: `loom data prepare IN.txt -o OUT.bin`"},
    {"ckpt", loom_cmd_ckpt, "checkpoints: `loom ckpt export --format llmc -o OUT`"},
    {"schedule", loom_cmd_schedule, "pipeline schedules: `loom schedule show --pp 4 --micro-batches 8`"},
    {"trace", loom_cmd_trace, "pipeline traces: `loom trace svg TRACE.json -o OUT.svg`"},
};
#define NCOMMANDS (int)(sizeof COMMANDS / sizeof COMMANDS[0])

static void usage(FILE *fp) {
  fprintf(fp, "usage: loom COMMAND [flags]   (loom COMMAND --help for its flags)\n\ncommands:\n");
  for (int i = 0; i < NCOMMANDS; i++) fprintf(fp, "  %-8s %s\n", COMMANDS[i].name, COMMANDS[i].help);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
    usage(stdout);
    return 0;
  }
  /* Test faults (core/fault.h), matched against the launcher's rank. */
  loom_error err = {0};
  if (loom_fault_arm_from_env(&err) != LOOM_OK) return loom_report(LOOM_ERR_USAGE, &err);
  loom_fault_set_rank(loom_launch_env_rank());
  if (loom_cpu_check_thread_env(&err) != LOOM_OK) return loom_report(LOOM_ERR_USAGE, &err);
  for (int i = 0; i < NCOMMANDS; i++)
    if (strcmp(argv[1], COMMANDS[i].name) == 0) return COMMANDS[i].run(argc - 2, argv + 2);
  char names[256] = "";
  for (int i = 0; i < NCOMMANDS; i++)
    snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", COMMANDS[i].name);
  loom_log_error("unknown command '%s' (commands: %s)", argv[1], names);
  return 2;
}
