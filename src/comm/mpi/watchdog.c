/* The collective watchdog over MPI (see watchdog.h). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "comm/flight_recorder.h"
#include "comm/mpi/watchdog.h"

enum { REPORT_TAG = 0x3d09, FLIGHT_TAG = 0x3d0a, MAX_LISTED = 16 };

/* What a waiting rank tells the others. */
typedef struct {
  int rank;
  float waited_s;
  char what[80];
} report;

static double g_timeout;
static MPI_Comm g_watch = MPI_COMM_NULL;
static void (*g_on_abort)(void);

void loom_watchdog_on_abort(void (*fn)(void)) { g_on_abort = fn; }

void loom_watchdog_init(void) {
  if (g_watch == MPI_COMM_NULL) MPI_Comm_dup(MPI_COMM_WORLD, &g_watch);
}

void loom_watchdog_set_timeout(double seconds) { g_timeout = seconds; }
double loom_watchdog_timeout(void) { return g_timeout; }

static void nap_ms(long ms) {
  const struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

/* Appends "rank r" or "ranks r, s, ..." for the ranks where in[r] == want, at most MAX_LISTED. */
static void list_ranks(char *out, size_t len, const bool *in, int world, bool want) {
  int count = 0;
  for (int r = 0; r < world; r++) count += in[r] == want;
  size_t at = strlen(out);
  at += (size_t)snprintf(out + at, at < len ? len - at : 0, count == 1 ? "rank " : "ranks ");
  int listed = 0, more = 0;
  for (int r = 0; r < world; r++) {
    if (in[r] != want) continue;
    if (listed == MAX_LISTED) {
      more++;
      continue;
    }
    at += (size_t)snprintf(out + at, at < len ? len - at : 0, "%s%d", listed ? ", " : "", r);
    listed++;
  }
  if (more) snprintf(out + at, at < len ? len - at : 0, " and %d more", more);
}

/* Waits until a message with `tag` is there (true, its status in *st) or the clock passes `until` (false). */
static bool next_message(int tag, double until, MPI_Status *st) {
  while (MPI_Wtime() < until) {
    int flag;
    MPI_Iprobe(MPI_ANY_SOURCE, tag, g_watch, &flag, st);
    if (flag) return true;
    nap_ms(1);
  }
  return false;
}

/* This rank's operation has waited too long, or another rank said so: tell
 * everyone, hear who else is waiting, and end the job with one message. */
static void survey_and_abort(const char *what, double waited) {
  int world, me;
  MPI_Comm_size(g_watch, &world);
  MPI_Comm_rank(g_watch, &me);
  report mine = {me, (float)waited, ""};
  snprintf(mine.what, sizeof mine.what, "%s", what);
  const bool dumped = loom_flight_dump(me); /* every rank still in communication writes its ring */
  MPI_Request *sent = calloc((size_t)world, sizeof *sent);
  for (int r = 0; r < world; r++)
    if (r != me) MPI_Isend(&mine, sizeof mine, MPI_BYTE, r, REPORT_TAG, g_watch, &sent[r]);
  report *heard = calloc((size_t)world, sizeof *heard);
  bool *waiting = calloc((size_t)world, sizeof *waiting);
  heard[me] = mine;
  waiting[me] = true;
  /* Ranks reach their own deadline at slightly different times; wait for them. */
  const double grace = g_timeout / 2 < 1.0 ? 1.0 : g_timeout / 2 > 10.0 ? 10.0 : g_timeout / 2;
  MPI_Status st;
  for (const double until = MPI_Wtime() + grace; next_message(REPORT_TAG, until, &st);) {
    report got;
    MPI_Recv(&got, sizeof got, MPI_BYTE, st.MPI_SOURCE, REPORT_TAG, g_watch, MPI_STATUS_IGNORE);
    got.what[sizeof got.what - 1] = '\0';
    heard[st.MPI_SOURCE] = got;
    waiting[st.MPI_SOURCE] = true;
  }
  int lowest = 0;
  while (!waiting[lowest]) lowest++;
  /* The flight recorder's summaries go to the speaker alone (its last operations on each group: comm/flight_recorder.h). */
  loom_flight_summary *flights = calloc((size_t)world, sizeof *flights);
  MPI_Request flight_sent = MPI_REQUEST_NULL;
  if (flights) loom_flight_summarize(&flights[me]);
  if (flights && me != lowest) MPI_Isend(&flights[me], sizeof *flights, MPI_BYTE, lowest, FLIGHT_TAG, g_watch, &flight_sent);
  if (me == lowest) {
    char line[2048];
    int n = snprintf(line, sizeof line, "[rank %d] loom: watchdog: %s did not complete in %.0f s (--watchdog-timeout); ", me,
                     heard[me].what, g_timeout);
    bool any_missing = false;
    for (int r = 0; r < world; r++) any_missing |= !waiting[r];
    if (any_missing) {
      snprintf(line + n, sizeof line - (size_t)n, "not waiting in any collective, so stalled or dead: ");
      list_ranks(line, sizeof line, waiting, world, false);
      n = (int)strlen(line);
      n += snprintf(line + n, sizeof line - (size_t)n, "; waiting: ");
      list_ranks(line, sizeof line, waiting, world, true);
    } else {
      n += snprintf(line + n, sizeof line - (size_t)n, "every rank is waiting, on mismatched operations:");
      for (int r = 0; r < world && r < MAX_LISTED && n < (int)sizeof line; r++)
        n += snprintf(line + n, sizeof line - (size_t)n, "%s rank %d in %s", r ? ";" : "", r, heard[r].what);
    }
    fprintf(stderr, "%s\n", line);
    /* Last: the first operation the ranks that answered disagree on, from their summaries (each sent once its own
     * grace ended; half a grace more for the last of them). */
    int expected = 0, got = 0;
    for (int r = 0; r < world; r++) expected += waiting[r] && r != me;
    for (const double until = MPI_Wtime() + grace / 2; flights && got < expected && next_message(FLIGHT_TAG, until, &st);) {
      MPI_Recv(&flights[st.MPI_SOURCE], sizeof *flights, MPI_BYTE, st.MPI_SOURCE, FLIGHT_TAG, g_watch, MPI_STATUS_IGNORE);
      got++;
    }
    char first[1200];
    if (flights && loom_flight_disagreement(flights, world, first, sizeof first))
      fprintf(stderr, "[rank %d] loom: flight recorder: the ranks disagree first on the %s%s\n", me, first,
              dumped ? "; each answering rank's last operations are in its flight_rank_NNNNN.json" : "");
    fflush(stderr);
  } else {
    nap_ms((long)(grace * 1000)); /* the lowest waiting rank speaks and aborts */
  }
  if (g_on_abort) g_on_abort();
  MPI_Abort(MPI_COMM_WORLD, 1);
  exit(1);
}

static int request_done(void *req) {
  int done;
  MPI_Test(req, &done, MPI_STATUS_IGNORE);
  return done;
}

void loom_watchdog_complete(MPI_Request *req, const char *what) {
  if (g_timeout <= 0 || g_watch == MPI_COMM_NULL) MPI_Wait(req, MPI_STATUS_IGNORE);
  else loom_watchdog_poll(request_done, req, what);
}

void loom_watchdog_poll(int (*done)(void *ctx), void *ctx, const char *what) {
  const bool watching = g_timeout > 0 && g_watch != MPI_COMM_NULL;
  const double start = watching ? MPI_Wtime() : 0.0;
  for (unsigned spin = 1;; spin++) {
    if (done(ctx)) return;
    if (!watching || spin % 256) continue; /* the clock and the report queue, now and then */
    const double waited = MPI_Wtime() - start;
    int told;
    MPI_Iprobe(MPI_ANY_SOURCE, REPORT_TAG, g_watch, &told, MPI_STATUS_IGNORE);
    if (told || waited > g_timeout) survey_and_abort(what, waited);
  }
}
