/* The loom subcommands. Each returns the process exit code: 0 ok, 1 a run or
 * check failed, 2 bad usage or unreadable input. */
#ifndef LOOM_COMMANDS_H
#define LOOM_COMMANDS_H

#include <stdint.h>
#include "cli/flags.h"
#include "core/status.h"

int loom_cmd_train(int argc, char **argv);
int loom_cmd_eval(int argc, char **argv);
int loom_cmd_sample(int argc, char **argv);
int loom_cmd_bench(int argc, char **argv);
int loom_cmd_data(int argc, char **argv);
int loom_cmd_ckpt(int argc, char **argv);
int loom_cmd_schedule(int argc, char **argv);
int loom_cmd_trace(int argc, char **argv);
int loom_cmd_preflight(int argc, char **argv);
int loom_cmd_plan(int argc, char **argv);

/* Prints err's message as one "loom: ..." line and returns st's exit code. */
int loom_report(loom_status st, const loom_error *err);

/* A byte count as people write one: "80GiB", "512MiB", "5GB" (10^9, as
 * transformers reads max_shard_size), "1e9", "1000B"; -1 if it is none, or
 * not positive. */
int64_t loom_cli_parse_bytes(const char *text);

/* Parses a subcommand's flags; with -h/--help prints usage and the table and
 * sets *done. Returns LOOM_ERR_USAGE with err filled on bad input. */
loom_status loom_cli_parse(const char *cmd, const char *usage, loom_flag *table, int n, int argc, char **argv,
                           const char **positional, int max_positional, int *npositional, bool *done,
                           loom_error *err);

#endif
