/* `loom data encode` and `loom data decode`: a tokenizer on one file, for
 * checking it against another implementation or reading a dataset back.
 *   loom data encode --tokenizer T [--allow-special] FILE   token ids, one line
 *   loom data decode --tokenizer T FILE                     the text of ids */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include "cli/flag_defs.h"
#include "cli/commands.h"
#include "cli/data_cli.h"
#include "core/read_file.h"
#include "core/log.h"
#include "data/bpe.h"

#define MAX_TEXT ((size_t)1 << 32)

loom_flag loom_data_template_flag(bool *no_template) {
  return (loom_flag){"--no-add-special-tokens", FLAG_BOOL, no_template,
                     "leave out the tokenizer's post-processor template, such as Llama 3's <|begin_of_text|> (Hugging Face's "
                     "add_special_tokens=False)", LOOM_NO_RANGE, NULL, false, NULL};
}

void loom_data_log_template(const loom_bpe *t, bool no_template) {
  const char *what = t ? loom_bpe_template_describe(t) : NULL;
  if (what && no_template) loom_log_info("tokenizer post-processor left out (--no-add-special-tokens): %s", what);
  else if (what) loom_log_info("tokenizer post-processor adds %s (add_special_tokens; --no-add-special-tokens leaves it out)", what);
}

static int run(int argc, char **argv, bool encode) {
  const char *tokenizer = NULL;
  bool allow_special = false, no_template = false;
  loom_flag table[] = {
      loom_flag_def_as("--tokenizer", &tokenizer, "tokenizer: GPT-2 files' directory, tokenizer.json or NAME.tiktoken (required)"),
      loom_flag_def("--allow-special", &allow_special),
      loom_data_template_flag(&no_template),
  };
  const char *cmd = encode ? "loom data encode" : "loom data decode";
  loom_error err = {0};
  bool help;
  const char *pos[1];
  int npos;
  loom_status st = loom_cli_parse(cmd, encode ? "loom data encode --tokenizer T [--allow-special] [--no-add-special-tokens] FILE"
                                              : "loom data decode --tokenizer T FILE",
                                  table, encode ? 3 : 1, argc, argv, pos, 1, &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  if (!tokenizer) st = loom_fail(&err, LOOM_ERR_USAGE, "%s: --tokenizer is required", cmd);
  else if (npos != 1) st = loom_fail(&err, LOOM_ERR_USAGE, "%s: expected one input file", cmd);
  loom_bpe *t = NULL;
  char *text = NULL;
  size_t len = 0;
  if (st == LOOM_OK) st = loom_bpe_load(&t, tokenizer, &err);
  if (st == LOOM_OK) st = loom_read_small_file(pos[0], encode ? "text file" : "token id file", MAX_TEXT, &text, &len, &err);
  loom_ids ids = {0};
  if (st == LOOM_OK && encode) {
    loom_bpe_encoder *e = loom_bpe_encoder_new(t, allow_special);
    if (no_template) loom_bpe_encode(e, text, len, &ids);
    else loom_bpe_encode_templated(e, text, len, &ids);
    loom_bpe_encoder_free(e);
    for (size_t i = 0; i < ids.count; i++) printf(i ? " %d" : "%d", ids.ids[i]);
    printf("\n");
  } else if (st == LOOM_OK) {
    char *at = text, *end;
    for (;;) {
      errno = 0;
      const long id = strtol(at, &end, 10);
      if (end == at) break;
      if (errno || id < 0 || id >= loom_bpe_vocab(t)) {
        st = loom_fail(&err, LOOM_ERR_FORMAT, "%s: token %zu is not an id in [0, %d)", pos[0], ids.count + 1, loom_bpe_vocab(t));
        break;
      }
      loom_ids_push(&ids, (int32_t)id);
      at = end;
    }
    while (st == LOOM_OK && (*at == ' ' || *at == '\n' || *at == '\t' || *at == '\r')) at++;
    if (st == LOOM_OK && at != text + len) st = loom_fail(&err, LOOM_ERR_FORMAT, "%s: token %zu is not a number", pos[0], ids.count + 1);
    loom_strbuf out = {0};
    if (st == LOOM_OK && (st = loom_bpe_decode(t, ids.ids, ids.count, &out, &err)) != LOOM_OK) loom_error_prefix(&err, st, pos[0]);
    if (st == LOOM_OK) fwrite(out.buf, 1, out.len, stdout);
    free(out.buf);
  }
  loom_ids_free(&ids);
  free(text);
  loom_bpe_free(t);
  return loom_report(st, &err);
}

int loom_cmd_data_encode(int argc, char **argv) { return run(argc, argv, true); }
int loom_cmd_data_decode(int argc, char **argv) { return run(argc, argv, false); }
