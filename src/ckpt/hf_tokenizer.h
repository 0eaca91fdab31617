/* What goes beside a Hugging Face model's weights so that transformers'
 * from_pretrained loads the directory without edits: generation_config.json
 * always, and with a tokenizer its files (a tokenizer.json as it is; GPT-2's
 * files as vocab.json and merges.txt) and tokenizer_config.json. */
#ifndef LOOM_HF_TOKENIZER_H
#define LOOM_HF_TOKENIZER_H

#include "core/status.h"
#include "data/bpe.h"

/* A tokenizer to write, loaded and checked before anything is written. */
typedef struct {
  loom_bpe *bpe;
  int bos, eos; /* its beginning- and end-of-text ids, -1 where it has none */
} loom_hf_tokenizer;

/* Loads the tokenizer at path (as --tokenizer names one) for a model of
 * `vocab` ids: refused where its ids do not fit the model, or where it is
 * a tiktoken rank file, which transformers reads only by converting it. */
loom_status loom_hf_tokenizer_open(loom_hf_tokenizer *t, const char *path, int vocab, loom_error *err);
void loom_hf_tokenizer_close(loom_hf_tokenizer *t);

/* Writes dir/generation_config.json (with tok's bos and eos ids where it
 * has them) and, with tok (NULL: none), its files and tokenizer_config.json
 * (its class, bos and eos tokens, and model_max_length = seq); each file
 * atomically. */
loom_status loom_hf_write_tokenizer(const char *dir, const loom_hf_tokenizer *tok, int seq, loom_error *err);

#endif
