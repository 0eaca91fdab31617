/* Logging: one line per message to stderr (errors) or stdout (progress).
 * Every error a user sees is a single line starting with "loom: ".
 *
 * On a terminal, a long job keeps one status line at the bottom that it
 * rewrites in place (loom_log_status); messages print above it and it is
 * drawn again under them. Off a terminal there is no status line. */
#ifndef LOOM_LOG_H
#define LOOM_LOG_H

#include <stdbool.h>
#include <stdio.h>

void loom_log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void loom_log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A whole error line (newline included) written to stderr at once. */
void loom_log_error_line(const char *line);
/* Replaces the status line (a no-op off a terminal or when quiet). */
void loom_log_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Leaves the last status line on screen as an ordinary line. */
void loom_log_status_end(void);
/* Whether progress goes to a terminal, where the status line is shown. */
bool loom_log_on_terminal(void);

/* Silence progress output (tests, --quiet). Errors are never silenced. */
void loom_log_set_quiet(int quiet);

#endif
