/* Names given on the command line (and in its flag tables' choices),
 * turned into the enums and tables below the CLI: the one place loom
 * parses a name. The modules below only name their values (schedule
 * kinds, send models, model presets, FLOPs formulas). Each returns 0, or
 * -1 for a name it does not know; a flag's choices have checked it first. */
#ifndef LOOM_CLI_NAMES_H
#define LOOM_CLI_NAMES_H

#include "layers/gpt_config.h"
#include "schedule/schedule.h"
#include "schedule/verify.h"

int loom_cli_schedule_kind(const char *name, loom_schedule_kind *kind);
int loom_cli_send_model(const char *name, const loom_send_model **model);
int loom_cli_preset(const char *name, loom_gpt_config *cfg);
int loom_cli_flops_formula(const char *name, loom_flops_formula *formula);

#endif
