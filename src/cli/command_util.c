/* What every subcommand shares: flag parsing with --help, and error reporting. */
#include <stdio.h>
#include <string.h>
#include "cli/commands.h"
#include "core/log.h"

int loom_report(loom_status st, const loom_error *err) {
  if (st == LOOM_OK) return 0;
  const char *msg = err->msg[0] ? err->msg : loom_status_str(st);
  /* Subcommand messages already name themselves ("loom train: ..."). */
  if (strncmp(msg, "loom ", 5) == 0) fprintf(stderr, "%s\n", msg);
  else loom_log_error("%s", msg);
  return loom_status_exit_code(st);
}

loom_status loom_cli_parse(const char *cmd, const char *usage, loom_flag *table, int n, int argc, char **argv,
                           const char **positional, int max_positional, int *npositional, bool *done,
                           loom_error *err) {
  loom_status st = loom_flags_parse(cmd, table, n, argc, argv, positional, max_positional, npositional, done, err);
  if (st == LOOM_OK && *done) loom_flags_print_help(stdout, usage, table, n);
  return st;
}
