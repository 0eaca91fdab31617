/* What `loom sim`, `loom sim calibrate` and `loom plan search` share. */
#ifndef LOOM_SIM_CLI_H
#define LOOM_SIM_CLI_H

#include "sim/sim.h"

/* The plan's rules (first broken one as the refusal), then the prediction. */
loom_status loom_sim_plan(loom_plan *plan, const loom_profile *prof, loom_flops_formula formula, loom_sim_result *res,
                          loom_error *err);
int loom_cmd_sim(int argc, char **argv);
int loom_cmd_sim_calibrate(int argc, char **argv);
int loom_cmd_plan_search(int argc, char **argv);

#endif
