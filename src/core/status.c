/* Names and exit codes for loom_status. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "core/status.h"

loom_status loom_fail(loom_error *err, loom_status st, const char *fmt, ...) {
  if (!err) return st;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err->msg, sizeof err->msg, fmt, ap);
  va_end(ap);
  return st;
}

loom_status loom_fail_elsewhere(loom_error *err, loom_status st, int rank, const char *what) {
  loom_fail(err, st, "rank %d could not %s (its own message says why)", rank, what);
  if (err) err->elsewhere = true;
  return st;
}

const char *loom_status_str(loom_status s) {
  switch (s) {
  case LOOM_OK: return "ok";
  case LOOM_ERR_USAGE: return "bad usage";
  case LOOM_ERR_IO: return "i/o error";
  case LOOM_ERR_FORMAT: return "malformed input";
  case LOOM_ERR_NOMEM: return "out of memory";
  case LOOM_ERR_RUNTIME: return "run failed";
  case LOOM_ERR_WRITE: return "write failed";
  }
  return "unknown status";
}

loom_status loom_error_prefix(loom_error *err, loom_status st, const char *prefix) {
  if (!err || st == LOOM_OK) return st;
  char msg[sizeof err->msg];
  snprintf(msg, sizeof msg, "%.100s: %.400s", prefix, err->msg);
  memcpy(err->msg, msg, sizeof msg);
  return st;
}

int loom_status_exit_code(loom_status s) {
  switch (s) {
  case LOOM_OK: return 0;
  case LOOM_ERR_USAGE:
  case LOOM_ERR_IO:
  case LOOM_ERR_FORMAT: return 2;
  default: return 1;
  }
}
