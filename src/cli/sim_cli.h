/* The subcommands of the cost model: `loom sim`, `loom sim calibrate` and `loom plan search`. */
#ifndef LOOM_SIM_CLI_H
#define LOOM_SIM_CLI_H

#include "cli/flags.h"
#include "sim/sim.h"

/* The flags `loom sim` and `loom plan search` share: --cluster, --flops and --moe-rank-imbalance. */
loom_flag loom_sim_cluster_flag(const char **dst);
loom_flag loom_sim_flops_flag(const char **dst);
loom_flag loom_sim_imbalance_flag(float *dst);
/* The profile --cluster names, and the assumptions: the formula --flops names (its choices are checked) and the
 * imbalance. */
loom_status loom_sim_flag_values(const char *cluster, const char *flops, float imbalance, loom_profile **prof,
                                 loom_sim_assumptions *assume, loom_error *err);

int loom_cmd_sim(int argc, char **argv);
int loom_cmd_sim_calibrate(int argc, char **argv);
int loom_cmd_plan_search(int argc, char **argv);

#endif
