/* Token files in llm.c's format: an int32[256] header (magic 20240520,
 * version 1, token count) followed by that many uint16 tokens. */
#ifndef LOOM_TOKEN_FILE_H
#define LOOM_TOKEN_FILE_H

#include <stddef.h>
#include <stdint.h>
#include "core/status.h"

#define LOOM_TOKENS_MAGIC 20240520
#define LOOM_TOKENS_VERSION 1
#define LOOM_HEADER_INTS 256

typedef struct {
  uint16_t *tokens;
  size_t count;
} loom_token_file;

/* Loads and validates the whole file: magic, version, size, every token < vocab. */
loom_status loom_token_file_load(loom_token_file *f, const char *path, int vocab, loom_error *err);
void loom_token_file_free(loom_token_file *f);
/* Writes tokens to path atomically (temp file, then rename). */
loom_status loom_token_file_write(const char *path, const uint16_t *tokens, size_t count, loom_error *err);

#endif
