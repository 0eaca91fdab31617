/* What every subcommand shares: flag parsing with --help, and error reporting. */
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "cli/commands.h"
#include "cli/launch.h"
#include "comm/mpi/comm_mpi.h"
#include "core/log.h"

int loom_report(loom_status st, const loom_error *err) {
  if (st == LOOM_OK) return 0;
  const char *msg = err->msg[0] ? err->msg : loom_status_str(st);
  const int rank = loom_launch_env_rank(), code = loom_status_exit_code(st);
  /* Bad usage is found the same way on every rank: rank 0 alone says so and
   * every rank exits. Anything else may be one rank's alone: it names
   * itself and ends the whole job, so no other rank waits forever. A rank
   * that failed only because another did waits for that rank's abort, so
   * the first line printed is the failing rank's own; it speaks only if
   * that never comes. */
  if (st == LOOM_ERR_USAGE && rank != 0) return code;
  const bool launched = loom_mpi_launched();
  if (launched && err->elsewhere) {
    /* The launcher ends this rank with SIGTERM once the failing rank aborts: it must end it, not wake a handler. */
    const int signals[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1};
    for (size_t i = 0; i < sizeof signals / sizeof signals[0]; i++) signal(signals[i], SIG_DFL);
    sleep(30);
  }
  char prefix[32] = "", line[sizeof err->msg + 64];
  if (launched && st != LOOM_ERR_USAGE) snprintf(prefix, sizeof prefix, "[rank %d] ", rank);
  /* A message that names its command keeps it; the others get loom's name. */
  snprintf(line, sizeof line, "%s%s%s\n", prefix, strncmp(msg, "loom ", 5) == 0 ? "" : "loom: ", msg);
  loom_log_error_line(line);
  if (launched && st != LOOM_ERR_USAGE) loom_mpi_abort(code);
  return code;
}

loom_status loom_cli_parse(const char *cmd, const char *usage, loom_flag *table, int n, int argc, char **argv,
                           const char **positional, int max_positional, int *npositional, bool *done,
                           loom_error *err) {
  loom_status st = loom_flags_parse(cmd, table, n, argc, argv, positional, max_positional, npositional, done, err);
  if (st == LOOM_OK && *done) loom_flags_print_help(stdout, usage, table, n);
  return st;
}

int64_t loom_cli_parse_bytes(const char *text) {
  static const struct {
    const char *suffix;
    double unit;
  } UNITS[] = {{"", 1.0}, {"B", 1.0}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
               {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
  char *end;
  const double v = strtod(text, &end);
  for (size_t i = 0; end != text && v > 0 && i < sizeof UNITS / sizeof UNITS[0]; i++)
    if (strcmp(end, UNITS[i].suffix) == 0 && v * UNITS[i].unit < 9.2e18) return (int64_t)(v * UNITS[i].unit);
  return -1;
}
