/* Single-line logging to stdout/stderr. */
#include <stdarg.h>
#include "core/log.h"

static int g_quiet;

void loom_log_set_quiet(int quiet) { g_quiet = quiet; }

void loom_log_info(const char *fmt, ...) {
  if (g_quiet) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stdout, fmt, ap);
  va_end(ap);
  fputc('\n', stdout);
  fflush(stdout);
}

void loom_log_error(const char *fmt, ...) {
  va_list ap;
  fputs("loom: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  fflush(stderr);
}
