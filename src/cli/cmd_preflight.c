/* `loom preflight`: the health of every rank, group and link before a run
 * (src/pipeline/preflight.h), under mpirun on the layout training will use:
 * a plan's, or tp x pp with dp the rest of the world. Exits 1 when it names
 * anything, so a job script can stop there. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu_peak.h"
#include "cli/flag_defs.h"
#include "cli/commands.h"
#include "cli/device.h"
#include "cli/launch.h"
#include "core/log.h"
#include "pipeline/preflight.h"
#include "plan/plan.h"

enum { PREFLIGHT_FLAG_COUNT = 10 };

int loom_cmd_preflight(int argc, char **argv) {
  const char *plan_path = NULL, *device = "auto";
  int tp = 1, pp = 1, threads = 0, gemm_n = 1024;
  float factor = 1.5f, seconds = 0.3f, mem_mb = 192.0f, comm_mb = 16.0f;
  loom_flag table[PREFLIGHT_FLAG_COUNT] = {
      loom_flag_def_as("--plan", &plan_path, "measure the groups of this plan (its ranks must be the world's)"),
      loom_flag_def_as("--tp", &tp, "tensor-parallel group size without --plan (dp: the world / (tp x pp))"),
      loom_flag_def_as("--pp", &pp, "pipeline stages without --plan"),
      {"--factor", FLAG_FLOAT, &factor, "name a rank, group or link slower than its kind's median by more than this", 1.05, 100, NULL, false, NULL},
      loom_flag_def("--seconds", &seconds),
      {"--gemm-n", FLAG_INT, &gemm_n, "the GEMM's n (n x n x n)", 64, 16384, NULL, false, NULL},
      loom_flag_def("--mem-mb", &mem_mb),
      {"--comm-mb", FLAG_FLOAT, &comm_mb, "MiB of each all-reduce and p2p message", 0.001, 4096, NULL, false, NULL},
      loom_flag_def("--device", &device),
      loom_flag_def("--threads", &threads),
  };
  loom_error err = {0};
  bool help;
  int npos;
  loom_status st = loom_cli_parse("loom preflight", "loom preflight [--plan PLAN | --tp N --pp N] [flags]", table,
                                  PREFLIGHT_FLAG_COUNT, argc, argv, NULL, 0, &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  const int world = loom_launch_env_size();
  int dp = 1;
  loom_plan *plan = NULL;
  if (plan_path && (table[1].set || table[2].set))
    st = loom_fail(&err, LOOM_ERR_USAGE, "loom preflight: --plan fixes the layout; drop --tp and --pp");
  else if (plan_path && (st = loom_plan_read(plan_path, &plan, &err)) == LOOM_OK) {
    st = loom_error_prefix(&err, loom_plan_refuse(plan, &(loom_plan_limits){.world = world}, &err), "loom preflight");
    if (st == LOOM_OK) tp = plan->parallel->tp, pp = plan->parallel->pp, dp = plan->parallel->dp;
  } else if (!plan_path && world % (tp * pp))
    st = loom_fail(&err, LOOM_ERR_USAGE, "loom preflight: %d ranks are not whole groups of --tp %d x --pp %d", world, tp, pp);
  else if (!plan_path)
    dp = world / (tp * pp);
  loom_plan_free(plan);
  const loom_ops *ops = NULL;
  char desc[160];
  if (st == LOOM_OK) st = loom_device_setup("loom preflight", device, &ops, desc, sizeof desc, &err);
  if (st != LOOM_OK) return loom_report(st, &err);
  loom_cpu_set_threads(threads ? threads : loom_launch_default_threads());
  loom_launch launch;
  if ((st = loom_launch_init(&launch, &err)) != LOOM_OK) {
    const int code = loom_report(st, &err);
    loom_launch_finish(&launch);
    return code;
  }
  loom_parallel ps;
  loom_comm_use_memory(launch.world, ops->mem);
  loom_parallel_init(&ps, launch.world, tp, pp, dp, 1, false);
  loom_preflight_options o = loom_preflight_defaults();
  o.factor = factor, o.seconds = seconds, o.gemm_n = gemm_n;
  o.mem_bytes = (size_t)((double)mem_mb * 1048576.0), o.comm_bytes = (size_t)((double)comm_mb * 1048576.0) / 4 * 4;
  o.gpu = loom_device_gpu();
  char *report;
  const int found = loom_preflight_run(&ps, ops, &o, &report);
  if (report) fputs(report, stdout);
  free(report);
  loom_parallel_free(&ps);
  loom_launch_finish(&launch);
  return found ? 1 : 0;
}
