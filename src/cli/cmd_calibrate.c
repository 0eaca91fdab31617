/* `loom sim calibrate`: measures this machine into a cluster profile. */
#include "cli/commands.h"
#include "cli/sim_cli.h"

int loom_cmd_sim_calibrate(int argc, char **argv) {
  (void)argc, (void)argv;
  loom_error err = {{0}};
  return loom_report(loom_fail(&err, LOOM_ERR_USAGE, "loom sim calibrate: WIP"), &err);
}
