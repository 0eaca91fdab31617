/* Logging: one line per message to stderr (errors) or stdout (progress).
 * Every error a user sees is a single line starting with "loom: ". */
#ifndef LOOM_LOG_H
#define LOOM_LOG_H

#include <stdio.h>

void loom_log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void loom_log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Silence progress output (tests, --quiet). Errors are never silenced. */
void loom_log_set_quiet(int quiet);

#endif
