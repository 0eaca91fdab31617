/* The subcommands of the cost model: `loom sim`, `loom sim calibrate` and `loom plan search`. */
#ifndef LOOM_SIM_CLI_H
#define LOOM_SIM_CLI_H

#include "sim/sim.h"

int loom_cmd_sim(int argc, char **argv);
int loom_cmd_sim_calibrate(int argc, char **argv);
int loom_cmd_plan_search(int argc, char **argv);

#endif
