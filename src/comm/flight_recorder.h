/* The flight recorder: each rank keeps its last N collectives and
 * point-to-point operations (group, kind, bytes, the group's sequence
 * number, the training step, start and end times) in a ring, as PyTorch's
 * flight recorder does for NCCL. When the collective watchdog fires
 * (comm/mpi/watchdog.h), every rank still in communication dumps its ring
 * as JSON and sends a summary of it to the rank that speaks, which names
 * the first operation on which the ranks disagree: who posted it and who
 * never did, or who posted another operation at the same place.
 *
 * A group is named by its kind ("dp", "tp", ...) and its leader, its lowest
 * world rank, so two dp groups of one job are told apart. Every
 * call of comm.h records through here; with no ring, a call costs a branch. */
#ifndef LOOM_FLIGHT_RECORDER_H
#define LOOM_FLIGHT_RECORDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct loom_comm loom_comm;
typedef struct loom_request loom_request;

typedef enum {
  LOOM_FLIGHT_ALLREDUCE, LOOM_FLIGHT_ALLGATHER, LOOM_FLIGHT_REDUCE_SCATTER, LOOM_FLIGHT_BROADCAST,
  LOOM_FLIGHT_ALLTOALLV, LOOM_FLIGHT_BARRIER, LOOM_FLIGHT_SEND, LOOM_FLIGHT_RECV, LOOM_FLIGHT_KINDS
} loom_flight_kind;
extern const char *const LOOM_FLIGHT_KIND_NAMES[LOOM_FLIGHT_KINDS];

/* What begin returns when the rank is to skip the operation (a planted fault), and when nothing is recorded. */
#define LOOM_FLIGHT_SKIP (-2)
#define LOOM_FLIGHT_NONE (-1)

/* Keeps the last `entries` operations (0: none, the default); dumps go to dir/flight_rank_NNNNN.json (NULL: no
 * files). Call before the run's first operation. */
void loom_flight_configure(int entries, const char *dir);
/* The training step operations are recorded under (the skip_collective fault's step too). */
void loom_flight_set_step(int64_t step);
/* An operation of c starts: its ring slot, or LOOM_FLIGHT_SKIP / LOOM_FLIGHT_NONE. peer: the group rank of a
 * send's or recv's other side (-1 for collectives). */
int64_t loom_flight_begin(loom_comm *c, loom_flight_kind kind, size_t bytes, int peer);
void loom_flight_end(int64_t slot);
/* A non-blocking operation's slot, kept until its request completes. */
void loom_flight_pending(loom_request *r, int64_t slot);
void loom_flight_completed(loom_request *r);

/* The summary a rank sends the watchdog's speaker: per group it posted on, how many operations it posted and its
 * last few. */
enum { LOOM_FLIGHT_GROUPS = 8, LOOM_FLIGHT_LAST = 4 };
typedef struct {
  int64_t seq, bytes, step;
  int32_t kind, peer, done;
  double start;
} loom_flight_op;
typedef struct {
  char name[16];
  int32_t leader, size;
  int64_t posted;
  loom_flight_op last[LOOM_FLIGHT_LAST]; /* oldest first; seq 0: none */
} loom_flight_group;
typedef struct {
  int32_t groups; /* 0: none (or this rank sent none) */
  loom_flight_group g[LOOM_FLIGHT_GROUPS];
} loom_flight_summary;

void loom_flight_summarize(loom_flight_summary *out);
/* Writes this rank's ring to its dump file (when a directory was given); false when it could not. */
bool loom_flight_dump(int world_rank);
/* From every rank's summary (world of them; groups 0 where a rank sent none), the first operation the ranks
 * disagree on, as a line; false when they agree on every one they report. */
bool loom_flight_disagreement(const loom_flight_summary *all, int world, char *line, size_t len);

#endif
