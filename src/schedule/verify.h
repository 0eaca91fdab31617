/* The schedule verifier and simulator: runs every rank's action list against
 * the others with no MPI at all, under the send semantics of the comm
 * backend that will run it (loom_send_model).
 *
 * Buffered (MPI's default): sends complete at once, and a recv takes the
 * message its tag names. Rendezvous (NCCL, and MPI under
 * LOOM_P2P=rendezvous): a send completes only when its recv is posted, and
 * sends meet recvs in issue order per channel with no tags (rendezvous.h).
 * Under both, a recv waits for its send; the tied-embedding
 * reduction waits for both of its ranks. The verifier proves that every send
 * meets exactly one matching recv, that no ranks end up waiting on each other
 * (deadlock), and that each micro-batch's forward precedes its backward on
 * every stage, and under a split backward each weight half after its input
 * half. It checks the buffer events against the actions (each buffer used
 * is held, none taken twice or left held) and waits, as the executor does,
 * where a send buffer is given back until that send was received. Timing uses unit costs, forward 1/v and backward 2/v per chunk (a
 * chunk is 1/v of a stage; each half of a split backward 1/v), which yields
 * each rank's busy spans, the bubble, and the peak number of live
 * activations per rank. The cost model (src/sim/) runs the same simulation
 * with real costs per action. */
#ifndef LOOM_SCHEDULE_VERIFY_H
#define LOOM_SCHEDULE_VERIFY_H

#include <stdbool.h>
#include "schedule/schedule.h"

/* How a comm backend carries a pipeline's messages. */
typedef struct {
  const char *name;   /* "buffered", "rendezvous": what --sends takes */
  bool rendezvous;    /* a send completes only when its recv is posted; sends between two ranks meet their
                       * recvs in issue order, tags ignored (else buffered: at once, matched by tag) */
  bool shared_stream; /* rendezvous: one stream per rank carries all its transfers, grouped up to each recv or
                       * wait for a send; else a stream per channel end, each transfer a group of its own, and a
                       * message to the rank itself is copied on the rank, never sent */
  bool by_kind;       /* rendezvous: activations and grads between two ranks travel on channels of their own */
} loom_send_model;
/* What loom's comm backends run: MPI buffered, and the pipeline's
 * transfers over NCCL (or MPI's rendezvous mode) on a channel per ordered
 * pair of ranks and kind of message (pipeline/p2p.c builds exactly these). */
extern const loom_send_model LOOM_SENDS_BUFFERED, LOOM_SENDS_RENDEZVOUS;
/* Whether a message from rank r to peer goes through the comm backend
 * under this model: all but a rank's messages to itself, which it copies,
 * unless one shared stream carries them too. */
static inline bool loom_send_travels(const loom_send_model *m, int r, int peer) {
  return peer != r || (m->rendezvous && m->shared_stream);
}
/* Every model, and every model's name in the same order, NULL-terminated (flag choices). */
extern const loom_send_model *const LOOM_SEND_MODELS[];
const char *const *loom_send_model_names(void);

typedef struct {
  double start, end;
  int action; /* index into the rank's action list */
} loom_span;

typedef struct {
  bool ok;
  char why[512];      /* the first problem, when !ok */
  int p;
  /* The most buffers each rank's events hold at once (loom_schedule_rank_peaks) */
  int *peak_live;     /* [p] activation slots */
  int *peak_deferred; /* [p] weight-grad states: split backwards waiting for their weight half */
  int *peak_sends;    /* [p] send buffers */
  double makespan;     /* when the last rank finishes */
  double compute_end;  /* when the last forward or backward ends */
  double bubble;       /* mean over ranks of the idle share of [0, compute_end) */
  int *span_count;     /* [p] */
  loom_span **spans;   /* [p][span_count]: forward, backward and every action that costs time, in time order */
} loom_schedule_report;

/* What each action costs, for a simulation with real times: duration is how
 * long the rank is busy with an action (a send's: 0 where sends leave at
 * once, else the sender's wait for it), flight how long a send's message
 * takes to reach its recv (NULL: no time). */
typedef struct {
  double (*duration)(void *ctx, int rank, const loom_action *a);
  double (*flight)(void *ctx, int rank, const loom_action *a);
  void *ctx;
} loom_action_costs;

/* Fills rep; returns LOOM_OK when the schedule is sound under every send
 * model loom runs (buffered, then rendezvous), else LOOM_ERR_RUNTIME with
 * rep->why naming the model, the rank and the action. The report's timing
 * is the buffered run's. */
loom_status loom_schedule_verify(const loom_schedule *s, loom_schedule_report *rep);
/* The verification under one send model. */
loom_status loom_schedule_verify_sends(const loom_schedule *s, const loom_send_model *model, loom_schedule_report *rep);
/* The verification with costs (NULL: the unit costs above) under one send model. */
loom_status loom_schedule_simulate(const loom_schedule *s, const loom_action_costs *costs, const loom_send_model *model,
                                   loom_schedule_report *rep);
void loom_schedule_report_free(loom_schedule_report *rep);
/* Theory: (p-1)/(m+p-1), or (p-1)/(v*m+p-1) when interleaved; for the
 * zero-bubble kinds, their unit-cost formulas (verify.c). */
double loom_schedule_theory_bubble(const loom_schedule *s);

#endif
