/* `loom data prepare IN.txt -o OUT.bin`: byte-tokenize a text file into an
 * llm.c token file. */
#include <string.h>
#include "cli/commands.h"
#include "cli/flags.h"
#include "core/log.h"
#include "data/byte_tokenizer.h"

int loom_cmd_data_prepare(int argc, char **argv) {
  const char *out = NULL;
  loom_flag table[] = {
      {"-o", FLAG_STRING, &out, "output token file (required)", LOOM_NO_RANGE, NULL, false, NULL},
  };
  loom_error err = {{0}};
  bool help;
  const char *pos[1];
  int npos;
  loom_status st = loom_cli_parse("loom data prepare", "loom data prepare IN.txt -o OUT.bin", table, 1, argc, argv, pos, 1, &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  if (st == LOOM_OK && npos != 1) st = loom_fail(&err, LOOM_ERR_USAGE, "loom data prepare: expected one input text file");
  else if (st == LOOM_OK && !out) st = loom_fail(&err, LOOM_ERR_USAGE, "loom data prepare: -o OUT.bin is required");
  size_t count = 0;
  if (st == LOOM_OK) st = loom_byte_prepare(pos[0], out, &count, &err);
  if (st == LOOM_OK) loom_log_info("wrote %zu byte tokens to %s", count, out);
  return loom_report(st, &err);
}
