/* Byte tokenizer: text files to llm.c token files, tokens back to text. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "data/byte_tokenizer.h"
#include "data/token_file.h"

loom_status loom_byte_prepare(const char *in_path, const char *out_path, size_t *count, loom_error *err) {
  FILE *fp = fopen(in_path, "rb");
  if (!fp) return loom_fail(err, LOOM_ERR_IO, "%s: cannot open input text: %s", in_path, strerror(errno));
  size_t cap = 1 << 16, n = 0;
  uint16_t *tokens = malloc(cap * sizeof *tokens);
  int c;
  while (tokens && (c = fgetc(fp)) != EOF) {
    if (n == cap) {
      uint16_t *grown = realloc(tokens, 2 * cap * sizeof *tokens);
      if (!grown) { free(tokens); tokens = NULL; break; }
      tokens = grown;
      cap *= 2;
    }
    tokens[n++] = (uint16_t)c;
  }
  const int read_failed = ferror(fp);
  fclose(fp);
  if (!tokens) return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory tokenizing", in_path);
  loom_status st = read_failed ? loom_fail(err, LOOM_ERR_IO, "%s: read failed", in_path)
                               : loom_token_file_write(out_path, tokens, n, err);
  free(tokens);
  if (count) *count = n;
  return st;
}

void loom_byte_print(FILE *fp, int token) {
  if (token == '\n' || token == '\t' || (token >= 32 && token < 127)) fputc(token, fp);
  else fprintf(fp, "\\x%02x", token & 0xff);
}
