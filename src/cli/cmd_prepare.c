/* `loom data prepare`: a corpus into a Megatron indexed dataset or an llm.c
 * token file, as Megatron's preprocess_data.py does.
 *   loom data prepare FILE... (--output-prefix P | -o OUT.bin) [--tokenizer T]
 *       [--json-key K] [--append-eod] [--workers N] [--force]
 * JSONL inputs (named *.jsonl, or any with --json-key) hold one document per
 * line; other files are one document each. Without --tokenizer, bytes. */
#include <stdio.h>
#include <string.h>
#include "cli/flag_defs.h"
#include "cli/commands.h"
#include "cli/data_cli.h"
#include "core/log.h"
#include "core/strbuf.h"
#include "data/prepare.h"

#define MAX_INPUTS 4096

const char *loom_data_json_key(const char *const *inputs, int n, const char *json_key) {
  if (json_key) return json_key;
  for (int i = 0; i < n; i++)
    if (!loom_str_ends_with(inputs[i], ".jsonl")) return NULL;
  return n ? "text" : NULL;
}

int loom_cmd_data_prepare(int argc, char **argv) {
  const char *tokenizer = NULL, *json_key = NULL, *prefix = NULL, *llmc = NULL;
  bool append_eod = false, force = false, allow_special = false, no_template = false;
  int workers = 1;
  loom_flag table[] = {
      {"--output-prefix", FLAG_STRING, &prefix, "write PREFIX.bin and PREFIX.idx, a Megatron indexed dataset", LOOM_NO_RANGE, NULL, false, NULL},
      loom_flag_def_as("-o", &llmc, "write one llm.c token file instead"),
      loom_flag_def_as("--tokenizer", &tokenizer, "GPT-2 files' directory, tokenizer.json or NAME.tiktoken (default: bytes)"),
      loom_flag_def("--json-key", &json_key),
      {"--append-eod", FLAG_BOOL, &append_eod, "end each document with the end-of-document token", LOOM_NO_RANGE, NULL, false, NULL},
      loom_flag_def_as("--allow-special", &allow_special, "special tokens written in documents become their ids"),
      loom_data_template_flag(&no_template),
      {"--workers", FLAG_INT, &workers, "tokenizing threads", 1, 256, NULL, false, NULL},
      loom_flag_def("--force", &force),
  };
  const int nflags = (int)(sizeof table / sizeof *table);
  loom_error err = {0};
  bool help;
  const char *inputs[MAX_INPUTS];
  int ninputs;
  loom_status st = loom_cli_parse("loom data prepare", "loom data prepare FILE... (--output-prefix P | -o OUT.bin) [--tokenizer T] [flags]",
                                  table, nflags, argc, argv, inputs, MAX_INPUTS, &ninputs, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  if (ninputs < 1) st = loom_fail(&err, LOOM_ERR_USAGE, "loom data prepare: expected one or more input files");
  else if (!prefix == !llmc) st = loom_fail(&err, LOOM_ERR_USAGE, "loom data prepare: give --output-prefix P or -o OUT.bin (one of them)");
  loom_bpe *bpe = NULL;
  if (st == LOOM_OK && tokenizer) st = loom_bpe_load(&bpe, tokenizer, &err);
  const loom_prepare_options o = {.inputs = inputs, .ninputs = ninputs, .json_key = loom_data_json_key(inputs, ninputs, json_key),
                                  .tokenizer = bpe, .append_eod = append_eod, .allow_special = allow_special,
                                  .add_special_tokens = !no_template, .output_prefix = prefix,
                                  .llmc_output = llmc, .force = force, .workers = workers, .progress = loom_log_on_terminal()};
  loom_prepare_stats s;
  if (st == LOOM_OK) loom_data_log_template(bpe, no_template);
  if (st == LOOM_OK) st = loom_prepare(&o, &s, &err);
  if (st == LOOM_OK)
    loom_log_info("prepared %lld documents (%lld empty skipped), %lld tokens, from %.1f MB in %.2f s: %.1f MB/s with %d worker%s (%s) into %s%s",
                  (long long)s.documents, (long long)s.empty, (long long)s.tokens, (double)s.bytes / 1e6, s.seconds,
                  s.seconds > 0 ? (double)s.bytes / 1e6 / s.seconds : 0.0, workers, workers == 1 ? "" : "s",
                  bpe ? loom_bpe_describe(bpe) : "bytes", prefix ? prefix : llmc, prefix ? ".{bin,idx}" : "");
  loom_bpe_free(bpe);
  return loom_report(st, &err);
}
