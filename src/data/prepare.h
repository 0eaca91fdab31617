/* Preparing a corpus for training, as Megatron's preprocess_data.py does:
 * documents (each line of a JSONL file, or each whole text file) are
 * tokenized by several worker threads and written in input order as a
 * Megatron indexed dataset, or as one llm.c token file. */
#ifndef LOOM_PREPARE_H
#define LOOM_PREPARE_H

#include <stdbool.h>
#include <stdint.h>
#include "core/status.h"
#include "data/bpe.h"

typedef struct {
  const char *const *inputs;  /* files: JSONL when json_key is set, else plain text */
  int ninputs;
  const char *json_key;       /* the JSONL member holding each document's text, or NULL */
  const loom_bpe *tokenizer;  /* NULL: bytes (token i is byte i) */
  bool append_eod;            /* end every document with the tokenizer's end-of-document token */
  bool allow_special;         /* special tokens written in documents become their ids */
  bool add_special_tokens;    /* the tokenizer's post-processor template around each document (Hugging Face's default) */
  const char *output_prefix;  /* write PREFIX.bin + PREFIX.idx ... */
  const char *llmc_output;    /* ... or one llm.c token file */
  bool force;                 /* replace outputs that exist */
  int workers;
  bool progress;              /* keep a progress status line (shown on a terminal) */
} loom_prepare_options;

typedef struct {
  int64_t documents, empty, tokens, bytes;
  double seconds;
} loom_prepare_stats;

loom_status loom_prepare(const loom_prepare_options *o, loom_prepare_stats *stats, loom_error *err);

#endif
