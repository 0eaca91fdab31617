/* The subcommands of `loom data`, each in its own file. */
#ifndef LOOM_DATA_CLI_H
#define LOOM_DATA_CLI_H

#include "cli/flags.h"

int loom_cmd_data_prepare(int argc, char **argv);
int loom_cmd_data_encode(int argc, char **argv);
int loom_cmd_data_decode(int argc, char **argv);

#endif
