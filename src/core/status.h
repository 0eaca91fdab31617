/* Status codes for operations that can legitimately fail (I/O, allocation,
 * user input). Broken invariants use the check macros in check.h instead. */
#ifndef LOOM_STATUS_H
#define LOOM_STATUS_H

#include <stdbool.h>
#include <string.h>

typedef enum {
  LOOM_OK = 0,
  LOOM_ERR_USAGE,   /* bad flag or value given by the user */
  LOOM_ERR_IO,      /* a file could not be opened, read or written */
  LOOM_ERR_FORMAT,  /* a file's contents are malformed */
  LOOM_ERR_NOMEM,   /* an allocation failed */
  LOOM_ERR_RUNTIME, /* a run failed (NaN loss, ...) */
  LOOM_ERR_WRITE,   /* an output could not be written (a full disk, an I/O error): the run failed, exit 1 */
} loom_status;

const char *loom_status_str(loom_status s);

/* A failure's one-line message, filled by whoever detects it and printed by
 * the CLI. Messages name what is wrong and why, e.g. "data.bin: bad magic". */
typedef struct {
  char msg[512];
  /* The failure is another rank's, which reports it with its own message:
   * this rank stays quiet, so the first line a user reads is the real one. */
  bool elsewhere;
} loom_error;

/* Writes the message into err (if non-NULL) and returns st, so callers can
 * `return loom_fail(err, LOOM_ERR_FORMAT, "%s: truncated", path);`. */
loom_status loom_fail(loom_error *err, loom_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* What a rank that did not fail returns when `rank` did: "rank R could not
 * WHAT", marked elsewhere (the failing rank reports; see loom_report). */
loom_status loom_fail_elsewhere(loom_error *err, loom_status st, int rank, const char *what);
/* Puts "prefix: " before err's message (naming the command that failed); returns st. */
loom_status loom_error_prefix(loom_error *err, loom_status st, const char *prefix);

/* A value from outside quoted in a message by at most LOOM_QUOTE_MAX of its
 * bytes, "..." where cut, so a long value never pushes the reason out of
 * the message: loom_fail(err, st, "--x " LOOM_QUOTE_FMT ": why", LOOM_QUOTE(text)). */
#define LOOM_QUOTE_MAX 48
#define LOOM_QUOTE_FMT "'%.*s%s'"
#define LOOM_QUOTE(s) loom_quote_len(s), (s), strlen(s) > LOOM_QUOTE_MAX ? "..." : ""
static inline int loom_quote_len(const char *s) { return strlen(s) > LOOM_QUOTE_MAX ? LOOM_QUOTE_MAX : (int)strlen(s); }

/* Exit code for the CLI, as DESIGN.md fixes them: 1 run failed, 2 bad input. */
int loom_status_exit_code(loom_status s);

#endif
