/* Atomic file writes: data goes to PATH.tmp, is flushed, then renamed over
 * PATH, so a crash mid-write never leaves a half-written file behind. */
#ifndef LOOM_WRITE_FILE_H
#define LOOM_WRITE_FILE_H

#include <stddef.h>
#include "core/status.h"

typedef struct {
  const void *data;
  size_t bytes;
} loom_chunk;

loom_status loom_write_file_atomic(const char *path, const loom_chunk *chunks, int count, loom_error *err);

#endif
