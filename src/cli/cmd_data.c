/* `loom data`: datasets and tokenizers.
 *   loom data prepare ...            text or JSONL into a dataset (cmd_prepare.c)
 *   loom data encode|decode ...      a tokenizer on one file (cmd_tokenize.c)
 *   loom data tokenizer train ...    a byte-level BPE trained on a corpus (cmd_tokenizer_train.c) */
#include <string.h>
#include "cli/commands.h"
#include "cli/data_cli.h"

int loom_cmd_data(int argc, char **argv) {
  const char *sub = argc >= 1 ? argv[0] : "";
  if (strcmp(sub, "prepare") == 0) return loom_cmd_data_prepare(argc - 1, argv + 1);
  if (strcmp(sub, "encode") == 0) return loom_cmd_data_encode(argc - 1, argv + 1);
  if (strcmp(sub, "decode") == 0) return loom_cmd_data_decode(argc - 1, argv + 1);
  if (strcmp(sub, "tokenizer") == 0) return loom_cmd_data_tokenizer(argc - 1, argv + 1);
  loom_error err = {0};
  loom_fail(&err, LOOM_ERR_USAGE, "loom data: expected 'prepare', 'encode', 'decode' or 'tokenizer train'");
  return loom_report(LOOM_ERR_USAGE, &err);
}
