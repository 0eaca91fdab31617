/* `loom plan new|show|check`: author partition plans from the same model and
 * layout flags as `loom train`, print their rank grid, stage table, memory
 * and bubble, and check every rule before a GPU hour is spent. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "cli/flag_defs.h"
#include "cli/commands.h"
#include "cli/plan_flags.h"
#include "cli/plan_show.h"
#include "cli/sim_cli.h"
#include "core/check.h"
#include "core/log.h"
#include "plan/memory.h"
#include "plan/plan.h"

/* ---- new ---- */

static int plan_new(int argc, char **argv) {
  loom_plan_flags pf = loom_plan_flags_defaults();
  const char *out = NULL;
  loom_flag table[LOOM_PLAN_FLAG_COUNT + 1];
  loom_plan_flags_table(&pf, table);
  table[LOOM_PLAN_FLAG_COUNT] = loom_flag_def_as("-o", &out, "output plan: .txtpb (text), .pb (binary) or - (text on standard output) (required)");
  loom_error err = {0};
  bool help;
  const char *pos[1];
  int npos;
  loom_status st = loom_cli_parse("loom plan new", "loom plan new -o PLAN [flags]", table, LOOM_PLAN_FLAG_COUNT + 1, argc,
                                  argv, pos, 0, &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  if (!out) return loom_report(loom_fail(&err, LOOM_ERR_USAGE, "loom plan new: -o PLAN is required"), &err);
  loom_plan *plan;
  st = loom_plan_flags_build("loom plan new", &pf, table, &plan, &err);
  if (st != LOOM_OK) return loom_report(st, &err);
  st = loom_plan_flags_refuse("loom plan new", plan, &(loom_plan_limits){0}, table, NULL, &err);
  if (st == LOOM_OK) st = loom_plan_write(out, plan, &err);
  if (st == LOOM_OK && strcmp(out, "-") != 0)
    loom_log_info("wrote %s (%lld parameters, %lld ranks)", out, (long long)plan->estimates->total_parameters,
                  (long long)loom_plan_ranks(plan));
  loom_plan_free(plan);
  return loom_report(st, &err);
}

/* ---- show ---- */

static int plan_show(int argc, char **argv) {
  bool buffers = false;
  loom_flag table[] = {{"--buffers", FLAG_BOOL, &buffers, "list each pipeline rank's buffers, row by row, as its rank sheet "
                        "holds them (what `loom train` allocates)", LOOM_NO_RANGE, NULL, false, NULL}};
  loom_error err = {0};
  bool help;
  const char *pos[2];
  int npos;
  loom_status st = loom_cli_parse("loom plan show", "loom plan show PLAN [--buffers]", table, 1, argc, argv, pos, 1, &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  if (npos != 1) return loom_report(loom_fail(&err, LOOM_ERR_USAGE, "loom plan show: expected one plan file"), &err);
  loom_plan *plan;
  st = loom_plan_read(pos[0], &plan, &err);
  if (st != LOOM_OK) return loom_report(st, &err);
  char lines[4096];
  if (loom_plan_check_rules(plan, 0, 0, lines, sizeof lines) > 0) {
    fputs(lines, stderr);
    loom_plan_free(plan);
    return 1;
  }
  loom_plan_estimate(plan);
  st = loom_plan_show(plan, buffers, &err);
  loom_plan_free(plan);
  return loom_report(st, &err);
}

/* ---- check ---- */

static int plan_check(int argc, char **argv) {
  const char *memory = NULL;
  int world = 0;
  loom_flag table[] = {
      {"--device-memory", FLAG_STRING, &memory, "memory of one device, e.g. 80GiB (default: the plan's cluster)", LOOM_NO_RANGE, NULL, false, NULL},
      {"--world", FLAG_INT, &world, "ranks the job will have (0: unchecked)", 0, 1 << 24, NULL, false, NULL},
  };
  loom_error err = {0};
  bool help;
  const char *pos[2];
  int npos;
  loom_status st = loom_cli_parse("loom plan check", "loom plan check PLAN [flags]", table, 2, argc, argv, pos, 1, &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  if (npos != 1) return loom_report(loom_fail(&err, LOOM_ERR_USAGE, "loom plan check: expected one plan file"), &err);
  const int64_t device = memory ? loom_cli_parse_bytes(memory) : 0;
  if (device < 0)
    return loom_report(loom_fail(&err, LOOM_ERR_USAGE, "loom plan check: --device-memory " LOOM_QUOTE_FMT " is not a size like 80GiB",
                                           LOOM_QUOTE(memory)), &err);
  loom_plan *plan;
  st = loom_plan_read(pos[0], &plan, &err);
  if (st != LOOM_OK) return loom_report(st, &err);
  const int64_t limit = device ? device : plan->cluster && plan->cluster->has_device_memory_bytes ? plan->cluster->device_memory_bytes : 0;
  char lines[8192];
  const loom_plan_limits limits = {.world = world, .device_memory = limit};
  const int bad = loom_plan_validate(plan, &limits, lines, sizeof lines);
  fputs(lines, stdout);
  if (bad == 0) printf("%s: ok (every rule holds; schedule verified deadlock-free)\n", pos[0]);
  loom_plan_free(plan);
  return bad ? 1 : 0;
}

int loom_cmd_plan(int argc, char **argv) {
  if (argc >= 1 && strcmp(argv[0], "new") == 0) return plan_new(argc - 1, argv + 1);
  if (argc >= 1 && strcmp(argv[0], "show") == 0) return plan_show(argc - 1, argv + 1);
  if (argc >= 1 && strcmp(argv[0], "check") == 0) return plan_check(argc - 1, argv + 1);
  if (argc >= 1 && strcmp(argv[0], "search") == 0) return loom_cmd_plan_search(argc - 1, argv + 1);
  loom_log_error("plan: expected 'new', 'show', 'check' or 'search' (loom plan new --help)");
  return 2;
}
