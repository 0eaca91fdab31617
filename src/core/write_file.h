/* Atomic file writes: data goes to PATH.tmp, is flushed, then renamed over
 * PATH, so a crash mid-write never leaves a half-written file behind. */
#ifndef LOOM_WRITE_FILE_H
#define LOOM_WRITE_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include "core/status.h"

typedef struct {
  const void *data;
  size_t bytes;
} loom_chunk;

loom_status loom_write_file_atomic(const char *path, const loom_chunk *chunks, int count, loom_error *err);

/* The same, one chunk at a time, so a file larger than memory can be written:
 * next(ctx, i, &chunk, &st, err) returns 1 with chunk i (valid until the next
 * call), 0 at the end, or sets *st (and err) to stop with that error. */
typedef int (*loom_next_chunk)(void *ctx, int i, loom_chunk *chunk, loom_status *st, loom_error *err);
loom_status loom_write_file_atomic_stream(const char *path, loom_next_chunk next, void *ctx, loom_error *err);

/* Whether an output can be written, asked before any work is done, so a
 * run never loses its result at the end: `path` (named by `flag` in the
 * message) is not empty; nothing is there yet, unless `force` (then what is
 * there must be a file, or a directory when `is_dir`); a character device
 * such as /dev/null is taken as it is; and a file can be created beside it
 * (probed by making and removing one). */
loom_status loom_output_check(const char *flag, const char *path, bool is_dir, bool force, loom_error *err);

/* One path, one output: what a command reads and writes, checked before any
 * work starts so no output overwrites another (or an input) at the end. */
typedef enum {
  LOOM_PATH_INPUT,    /* read: no output may be it */
  LOOM_PATH_OUTPUT,   /* a file, or a directory others may write into (checkpoints, TensorBoard) */
  LOOM_PATH_REPLACED, /* an output replaced whole (an export): nothing else may be it or lie inside it */
} loom_path_role;

typedef struct {
  const char *flag; /* "--metrics" */
  const char *path; /* NULL: not given */
  loom_path_role role;
} loom_path_use;

/* Fails naming both flags where two uses collide: the same path (after
 * resolving "." and "..", symlinks of what exists, and the working
 * directory), at least one of them written; or a path inside a replaced output. */
loom_status loom_paths_distinct(const char *cmd, const loom_path_use *uses, int n, loom_error *err);

/* mkdir -p: path and every missing parent; `what` names it in errors. */
loom_status loom_make_dirs(const char *path, const char *what, loom_error *err);

#endif
