/* `loom data tokenizer train CORPUS... --vocab-size N -o DIR`: a byte-level
 * BPE trained on a corpus, written as GPT-2's files and as tokenizer.json,
 * for users who bring text but no tokenizer. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include "cli/flag_defs.h"
#include "cli/commands.h"
#include "cli/data_cli.h"
#include "core/log.h"
#include "core/timer.h"
#include "data/bpe.h"

#define MAX_INPUTS 4096

int loom_cmd_data_tokenizer(int argc, char **argv) {
  const char *out = NULL, *json_key = NULL;
  int vocab_size = 0;
  bool force = false;
  loom_flag table[] = {
      {"--vocab-size", FLAG_INT, &vocab_size, "tokens: 256 bytes, the merges, and <|endoftext|> (required)", 257, LOOM_BPE_MAX_TRAIN_VOCAB, NULL, false, NULL},
      loom_flag_def_as("-o", &out, "output directory: encoder.json, vocab.bpe, tokenizer.json (required)"),
      loom_flag_def("--json-key", &json_key),
      loom_flag_def_as("--force", &force, "replace a tokenizer in the output directory"),
  };
  loom_error err = {0};
  bool help;
  const char *pos[MAX_INPUTS + 1];
  int npos;
  loom_status st = loom_cli_parse("loom data tokenizer", "loom data tokenizer train CORPUS... --vocab-size N -o DIR [--json-key K] [--force]",
                                  table, 4, argc, argv, pos, MAX_INPUTS + 1, &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  if (npos < 1 || strcmp(pos[0], "train") != 0) st = loom_fail(&err, LOOM_ERR_USAGE, "loom data tokenizer: expected 'train CORPUS... --vocab-size N -o DIR'");
  else if (npos < 2) st = loom_fail(&err, LOOM_ERR_USAGE, "loom data tokenizer train: expected one or more corpus files");
  else if (!vocab_size || !out) st = loom_fail(&err, LOOM_ERR_USAGE, "loom data tokenizer train: --vocab-size and -o are required");
  char existing[4200];
  struct stat sb;
  snprintf(existing, sizeof existing, "%s/tokenizer.json", out ? out : "");
  if (st == LOOM_OK && !force && stat(existing, &sb) == 0) st = loom_fail(&err, LOOM_ERR_USAGE, "%s exists (use --force to replace it)", existing);
  const loom_bpe_train_options o = {.inputs = pos + 1, .ninputs = npos - 1, .vocab_size = vocab_size, .out_dir = out,
                                    .json_key = loom_data_json_key(pos + 1, npos - 1, json_key)};
  loom_bpe_train_stats s;
  const double t0 = loom_now_s();
  if (st == LOOM_OK) st = loom_bpe_train(&o, &s, &err);
  if (st == LOOM_OK)
    loom_log_info("trained %d tokens (%d merges%s) on %lld documents, %.1f MB, %lld words (%lld distinct) in %.1f s into %s",
                  s.vocab, s.merges, s.vocab < vocab_size ? ": no pair occurs twice more" : "", (long long)s.documents,
                  (double)s.bytes / 1e6, (long long)s.words, (long long)s.distinct_words, loom_now_s() - t0, out);
  return loom_report(st, &err);
}
