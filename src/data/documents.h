/* Reading a corpus document by document, as Megatron's tools read one: each
 * line of a JSONL file is a document (its text in one member), and each
 * other file is one document. Shared by `loom data prepare` and the
 * tokenizer trainer. */
#ifndef LOOM_DOCUMENTS_H
#define LOOM_DOCUMENTS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include "core/json.h"
#include "core/status.h"

typedef struct {
  const char *const *inputs;
  int ninputs;
  bool jsonl;
  int file;          /* the input being read */
  FILE *fp;
  int64_t line;      /* lines read of it */
  char *buf;         /* the current document's raw bytes */
  size_t cap;
  int64_t bytes;     /* bytes read from every input so far */
  int doc_file;      /* where the document just returned came from: its input */
  int64_t doc_line;  /* and its line (0 for a whole text file) */
} loom_doc_reader;

loom_doc_reader loom_doc_reader_start(const char *const *inputs, int ninputs, bool jsonl);
/* The next raw document (a JSON line without its line end, or a whole file):
 * 1 with *raw valid until the next call, 0 at the end, -1 with *st and err set.
 * Blank JSONL lines are skipped. */
int loom_doc_reader_next(loom_doc_reader *r, const char **raw, size_t *len, loom_status *st, loom_error *err);
void loom_doc_reader_end(loom_doc_reader *r);
/* "FILE:LINE" (or "FILE") of the document just read, for messages. */
void loom_doc_where(const char *const *inputs, int file, int64_t line, char *buf, size_t cap);

/* A document's text: the member json_key of its JSON line (parsed into
 * *json, which the caller frees), or with json_key NULL the raw bytes. */
loom_status loom_document_text(const char *raw, size_t len, const char *json_key, const char *where, loom_json *json,
                               const char **text, size_t *text_len, loom_error *err);

#endif
