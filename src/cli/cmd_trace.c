/* `loom trace svg FILE.json -o FILE.svg`: draws a pipeline trace written by
 * `loom train --trace` as a rank x time picture. */
#include <string.h>
#include "cli/flag_defs.h"
#include "cli/commands.h"
#include "core/log.h"
#include "schedule/timeline.h"

int loom_cmd_trace(int argc, char **argv) {
  const char *out = NULL;
  loom_flag table[] = {
      loom_flag_def_as("-o", &out, "output SVG file (required)"),
  };
  loom_error err = {0};
  bool help;
  const char *pos[2];
  int npos;
  loom_status st = loom_cli_parse("loom trace", "loom trace svg TRACE.json -o OUT.svg", table, 1, argc, argv, pos, 2, &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  if (npos < 1 || strcmp(pos[0], "svg") != 0) st = loom_fail(&err, LOOM_ERR_USAGE, "loom trace: expected 'svg TRACE.json -o OUT.svg'");
  else if (npos != 2) st = loom_fail(&err, LOOM_ERR_USAGE, "loom trace svg: expected one trace file");
  else if (!out) st = loom_fail(&err, LOOM_ERR_USAGE, "loom trace svg: -o OUT.svg is required");
  if (st == LOOM_OK) st = loom_trace_svg(pos[1], out, &err);
  if (st == LOOM_OK) loom_log_info("wrote %s", out);
  return loom_report(st, &err);
}
