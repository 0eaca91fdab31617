/* The subcommands of `loom data`, each in its own file. */
#ifndef LOOM_DATA_CLI_H
#define LOOM_DATA_CLI_H

#include "cli/flags.h"

int loom_cmd_data_prepare(int argc, char **argv);
int loom_cmd_data_encode(int argc, char **argv);
int loom_cmd_data_decode(int argc, char **argv);
int loom_cmd_data_tokenizer(int argc, char **argv);

/* The JSONL member documents are read from: --json-key if given, else "text"
 * when every input is named *.jsonl, else NULL (each file one text document). */
const char *loom_data_json_key(const char *const *inputs, int n, const char *json_key);

/* --no-add-special-tokens, one flag of every command that encodes with a
 * tokenizer (prepare, encode, sample): leave out its post-processor's
 * template, as Hugging Face's add_special_tokens=False does. */
loom_flag loom_data_template_flag(bool *no_template);
/* Says in the log what the tokenizer's template adds to each text, or that
 * it is left out; nothing when it has none. */
struct loom_bpe;
void loom_data_log_template(const struct loom_bpe *t, bool no_template);

#endif
