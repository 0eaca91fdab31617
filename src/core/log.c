/* Single-line logging to stdout/stderr, with a status line on a terminal. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "core/log.h"

static int g_quiet;
static char g_status[512]; /* the status line shown, or "" */

void loom_log_set_quiet(int quiet) { g_quiet = quiet; }

/* Whether stdout reaches a person's terminal. Open MPI hands every rank a
 * pseudo-terminal whatever mpirun itself writes to, so under it ask
 * mpirun's own stdout (a rank's parent on its node). */
static bool stdout_is_terminal(void) {
  if (!isatty(STDOUT_FILENO)) return false;
  if (!getenv("OMPI_COMM_WORLD_SIZE")) return true;
  char link[64], target[256];
  snprintf(link, sizeof link, "/proc/%d/fd/1", (int)getppid());
  const ssize_t n = readlink(link, target, sizeof target - 1);
  if (n <= 0) return false;
  target[n] = '\0';
  return strncmp(target, "/dev/pts/", 9) == 0 || strncmp(target, "/dev/tty", 8) == 0;
}

bool loom_log_on_terminal(void) {
  static int known = -1; /* where stdout goes does not change */
  if (known < 0) known = stdout_is_terminal();
  return !g_quiet && known;
}

/* Erases the status line, so a message can take its place. */
static void clear_status(void) {
  if (g_status[0]) fputs("\r\033[K", stdout);
}

static void draw_status(void) {
  if (g_status[0]) fputs(g_status, stdout);
  fflush(stdout);
}

void loom_log_info(const char *fmt, ...) {
  if (g_quiet) return;
  clear_status();
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stdout, fmt, ap);
  va_end(ap);
  fputc('\n', stdout);
  draw_status();
}

void loom_log_status(const char *fmt, ...) {
  if (!loom_log_on_terminal()) return;
  clear_status();
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_status, sizeof g_status, fmt, ap);
  va_end(ap);
  draw_status();
}

void loom_log_status_end(void) {
  if (!g_status[0]) return;
  fputc('\n', stdout);
  fflush(stdout);
  g_status[0] = '\0';
}

void loom_log_error_line(const char *line) {
  if (g_status[0] && !g_quiet) { /* keep the error on its own line */
    clear_status();
    fflush(stdout);
  }
  /* One write: lines of ranks sharing the terminal do not interleave mid-line. */
  const size_t n = strlen(line);
  if (write(STDERR_FILENO, line, n) != (ssize_t)n) { /* nowhere left to say it */
  }
  if (!g_quiet) draw_status();
}

void loom_log_error(const char *fmt, ...) {
  char line[2048] = "loom: ";
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line + 6, sizeof line - 7, fmt, ap); /* room kept for the newline */
  va_end(ap);
  strcat(line, "\n");
  loom_log_error_line(line);
}
