/* `loom sim calibrate -o PROFILE.txtpb`: under mpirun, measures this
 * machine into a cluster profile (src/sim/calibrate.h) that `loom sim
 * --cluster PROFILE.txtpb` then predicts with. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu_peak.h"
#include "cli/flag_defs.h"
#include "cli/commands.h"
#include "cli/launch.h"
#include "cli/sim_cli.h"
#include "core/log.h"
#include "core/write_file.h"
#include "plan/textformat.h"
#include "sim/calibrate.h"

enum { CALIBRATE_FLAGS = 6 };

int loom_cmd_sim_calibrate(int argc, char **argv) {
  const char *out = NULL, *links = NULL, *name = "calibrated";
  float seconds = 0.2f, mem_mb = 192.0f;
  int threads = 0;
  loom_flag table[CALIBRATE_FLAGS] = {
      loom_flag_def_as("-o", &out, "the profile to write (.txtpb) (required)"),
      loom_flag_def("--seconds", &seconds),
      loom_flag_def("--mem-mb", &mem_mb),
      {"--links-from", FLAG_STRING, &links, "a profile whose links a one-rank calibration takes (one rank measures none)", LOOM_NO_RANGE, NULL, false, NULL},
      loom_flag_def_as("--name", &name, "the profile's name"),
      loom_flag_def("--threads", &threads),
  };
  loom_error err = {0};
  bool help;
  int npos;
  loom_status st = loom_cli_parse("loom sim calibrate", "mpirun -np N loom sim calibrate -o PROFILE.txtpb [flags]", table,
                                  CALIBRATE_FLAGS, argc, argv, NULL, 0, &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  if (!out) return loom_report(loom_fail(&err, LOOM_ERR_USAGE, "loom sim calibrate: -o PROFILE.txtpb is required"), &err);
  loom_profile *from = NULL;
  if (links && (st = loom_profile_load(links, &from, &err)) != LOOM_OK) return loom_report(st, &err);
  loom_cpu_set_threads(threads ? threads : loom_launch_default_threads());
  loom_launch launch;
  if ((st = loom_launch_init(&launch, &err)) != LOOM_OK) {
    const int code = loom_report(st, &err);
    loom_launch_finish(&launch);
    return code;
  }
  const loom_ops *ops = loom_ops_cpu();
  const loom_calibrate_options o = {.seconds = seconds, .mem_bytes = (size_t)((double)mem_mb * 1048576.0),
                                    .links_from = from, .name = name};
  loom_profile *prof = NULL;
  char *notes = NULL;
  st = loom_sim_calibrate(launch.world, ops, &o, &prof, &notes, &err);
  if (st == LOOM_OK && launch.rank == 0) {
    char *body = loom_text_print(&prof->base);
    /* What was written must load as a profile: the same checks as any other. */
    loom_profile *check = NULL;
    st = loom_profile_parse(body, strlen(body), out, &check, &err);
    loom_profile_free(check);
    const loom_chunk chunks[] = {{notes, strlen(notes)}, {body, strlen(body)}};
    if (st == LOOM_OK) st = loom_write_file_atomic(out, chunks, 2, &err);
    if (st == LOOM_OK) {
      fputs(notes, stdout);
      loom_log_info("wrote %s (%d rank%s, %d thread%s each)", out, launch.size, launch.size > 1 ? "s" : "",
                    loom_cpu_threads(), loom_cpu_threads() > 1 ? "s" : "");
    }
    free(body);
  }
  free(notes);
  loom_profile_free(prof);
  loom_profile_free(from);
  loom_launch_finish(&launch);
  return loom_report(st, &err);
}
