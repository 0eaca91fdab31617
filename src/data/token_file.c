/* Reader and writer for llm.c token files. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "data/token_file.h"
#include "core/read_file.h"
#include "core/write_file.h"

loom_status loom_token_file_load(loom_token_file *f, const char *path, int vocab, loom_error *err) {
  memset(f, 0, sizeof *f);
  FILE *fp;
  const loom_status opened = loom_open_for_reading(path, "token file", &fp, err);
  if (opened != LOOM_OK) return opened;
  int32_t header[LOOM_HEADER_INTS];
  loom_status st = LOOM_OK;
  if (fread(header, sizeof header, 1, fp) != 1) {
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: truncated token file: shorter than its 1024-byte header", path);
    goto close_file;
  }
  if (header[0] != LOOM_TOKENS_MAGIC) {
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: bad magic %d in token file header (expected %d, llm.c's token format)",
                   path, header[0], LOOM_TOKENS_MAGIC);
    goto close_file;
  }
  if (header[1] != LOOM_TOKENS_VERSION) {
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: unsupported token file version %d (expected %d)", path,
                   header[1], LOOM_TOKENS_VERSION);
    goto close_file;
  }
  if (header[2] < 0) {
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: negative token count %d in header", path, header[2]);
    goto close_file;
  }
  f->count = (size_t)header[2];
  /* The body must be exactly the tokens the header counts, checked before the count sizes an
   * allocation: fewer is a file cut short; more, a header that lies or two files run together. */
  struct stat sb;
  const off_t body = fstat(fileno(fp), &sb) == 0 && sb.st_size > (off_t)sizeof header ? sb.st_size - (off_t)sizeof header : 0;
  const size_t held = (size_t)body / sizeof(uint16_t);
  if ((size_t)body != f->count * sizeof(uint16_t)) {
    st = held < f->count ? loom_fail(err, LOOM_ERR_FORMAT, "%s: truncated token file: header says %zu tokens but the file holds %zu",
                                     path, f->count, held)
                         : loom_fail(err, LOOM_ERR_FORMAT, "%s: header says %zu tokens but the file holds %lld bytes of them (%zu tokens%s)",
                                     path, f->count, (long long)body, held, body % 2 ? " and a stray byte" : "");
    goto close_file;
  }
  f->tokens = malloc(f->count ? f->count * sizeof(uint16_t) : 1);
  if (!f->tokens) {
    st = loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory for %zu tokens", path, f->count);
    goto close_file;
  }
  const size_t got = fread(f->tokens, sizeof(uint16_t), f->count, fp);
  if (got != f->count) {
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: truncated token file: header says %zu tokens but the file holds %zu",
                   path, f->count, got);
    goto free_tokens;
  }
  for (size_t i = 0; i < f->count; i++) {
    if (f->tokens[i] >= vocab) {
      st = loom_fail(err, LOOM_ERR_FORMAT, "%s: token %u at position %zu is out of range for vocab %d",
                     path, f->tokens[i], i, vocab);
      goto free_tokens;
    }
  }
  fclose(fp);
  return LOOM_OK;
free_tokens:
  free(f->tokens);
  f->tokens = NULL;
close_file:
  fclose(fp);
  return st;
}

void loom_token_file_free(loom_token_file *f) {
  free(f->tokens);
  memset(f, 0, sizeof *f);
}

loom_status loom_token_file_write(const char *path, const uint16_t *tokens, size_t count, loom_error *err) {
  if (count > INT32_MAX) return loom_fail(err, LOOM_ERR_USAGE, "%s: %zu tokens exceed the format's int32 count", path, count);
  int32_t header[LOOM_HEADER_INTS] = {LOOM_TOKENS_MAGIC, LOOM_TOKENS_VERSION, (int32_t)count};
  const loom_chunk chunks[2] = {{header, sizeof header}, {tokens, count * sizeof(uint16_t)}};
  return loom_write_file_atomic(path, chunks, 2, err);
}
