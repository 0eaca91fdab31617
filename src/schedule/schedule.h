/* Pipeline schedules as data (DESIGN.md invariant 3).
 *
 * A schedule is every pipeline rank's ordered list of actions for one
 * training step, a pure function of (kind, p, v, m). The executor runs it,
 * the verifier proves it deadlock-free and bounds its memory, the renderer
 * draws it; none of them works the schedule out again.
 *
 * Rank r's chunk c holds virtual stage s = c*p + r of S = p*v stages (the
 * V-shaped ZB-V: stage r for chunk 0, 2p-1-r for chunk 1); stage 0 holds the
 * embedding, stage S-1 the LM head and loss. Activations flow s -> s+1 and
 * grads s+1 -> s; between a rank's own chunks the message goes to itself.
 * Sends never block (non-blocking transfers from a send buffer of their
 * own); a recv waits for its send.
 *
 * A backward is one action (BACKWARD), or under the zero-bubble kinds two:
 * BACKWARD_INPUT (B: the grad of the chunk's input, which the previous
 * stage waits for) and BACKWARD_WEIGHT (W: the weight grads, which nothing
 * waits for until the optimizer step).
 *
 * Every buffer an action needs is named with it, as buffer events the
 * generator emits (loom_buffer_event): an activation slot, a weight-grad
 * state, a send buffer. The verifier bounds and checks them, the executor
 * takes and gives back buffers exactly there, and the memory model
 * (plan/memory.h) sizes a rank from their peaks. */
#ifndef LOOM_SCHEDULE_H
#define LOOM_SCHEDULE_H

#include <stdbool.h>
#include <stddef.h>
#include "core/status.h"
#include "loom.pb-c.h"

typedef enum {
  LOOM_ACT_FORWARD = 0,
  LOOM_ACT_BACKWARD,
  LOOM_ACT_RECV_ACT,   /* activation of (mb, chunk) from the previous stage */
  LOOM_ACT_SEND_ACT,   /* activation of (mb, chunk) to the next stage */
  LOOM_ACT_RECV_GRAD,  /* grad of (mb, chunk)'s output from the next stage */
  LOOM_ACT_SEND_GRAD,  /* grad of (mb, chunk)'s input to the previous stage */
  LOOM_ACT_REDUCE_TIED, /* sum the tied wte grads of the first and last stage */
  LOOM_ACT_REDUCE_DP,   /* average grads over data-parallel replicas */
  LOOM_ACT_OPTIMIZER_STEP,
  LOOM_ACT_BACKWARD_INPUT,  /* B: the grad of the chunk's input; its weight half follows later */
  LOOM_ACT_BACKWARD_WEIGHT, /* W: the weight grads of a micro-batch whose B has run */
} loom_action_kind;

typedef struct {
  loom_action_kind kind;
  int mb;    /* micro-batch, -1 for step-wide actions */
  int chunk; /* this rank's model chunk, -1 for step-wide actions */
  int peer;  /* pipeline rank at the other end of a transfer, else -1 */
} loom_action;

/* The buffers whose lifetimes a schedule states. */
typedef enum {
  LOOM_BUFFER_SLOT = 0, /* a micro-batch's activations on a chunk: from its first action there to its last */
  LOOM_BUFFER_WSTATE,   /* a split backward's weight-grad state: from its B to its W */
  LOOM_BUFFER_SEND,     /* a copy of an outgoing message: from its send until the sender knows it arrived */
  LOOM_BUFFER_KINDS
} loom_buffer_kind;

/* One buffer taken before an action runs (acquire) or given back after it.
 * A send buffer is given back after the first action of its rank that
 * happens, in every run, after the peer's recv of it (a message chain from
 * the peer proves it; else the rank's last action): the executor then
 * waits for a send that has completed or must complete, never one whose
 * recv may still be waiting on this rank. */
typedef struct {
  loom_buffer_kind kind;
  bool acquire;
  int mb, chunk; /* whose: a micro-batch on this rank's chunk (a send buffer: the send's) */
  bool grad;     /* a send buffer: the message is a grad (else an activation) */
} loom_buffer_event;

/* The plan's enum (proto/loom.proto ScheduleKind) is the only one. */
typedef Loom__ScheduleKind loom_schedule_kind;
#define LOOM_SCHEDULE_1F1B LOOM__SCHEDULE_KIND__SCHEDULE_1F1B
#define LOOM_SCHEDULE_GPIPE LOOM__SCHEDULE_KIND__SCHEDULE_GPIPE
#define LOOM_SCHEDULE_INTERLEAVED LOOM__SCHEDULE_KIND__SCHEDULE_INTERLEAVED
#define LOOM_SCHEDULE_FORWARD_ONLY LOOM__SCHEDULE_KIND__SCHEDULE_FORWARD_ONLY
#define LOOM_SCHEDULE_ZB_H1 LOOM__SCHEDULE_KIND__SCHEDULE_ZB_H1
#define LOOM_SCHEDULE_ZB_V LOOM__SCHEDULE_KIND__SCHEDULE_ZB_V

typedef struct {
  loom_schedule_kind kind;
  bool v_shape; /* stages laid out as a V (ZB-V, and evaluation of its chunks) */
  int p, v, m;
  int *count;            /* [p] actions per rank */
  loom_action **actions; /* [p][count[r]] */
  /* Action i of rank r has events[r][event_at[r][i]] up to (not including)
   * events[r][event_at[r][i + 1]]: acquires, then releases. */
  int **event_at;              /* [p][count[r] + 1] */
  loom_buffer_event **events;  /* [p][event_at[r][count[r]]] */
} loom_schedule;

/* Whether a schedule of this shape can be built: 0, or -1 with why[n]
 * naming the rule it breaks: p, v and m at least 1, v == 1 unless
 * interleaved, ZB-V or forward-only, v == 2 for ZB-V, m % p == 0 when
 * interleaved. Worded once, in the plan's fields (every run is a plan; the
 * CLI names its flags instead), for the plan's rules and for
 * loom_schedule_build, which refuses such a shape with that message. */
int loom_schedule_shape_problem(loom_schedule_kind kind, int p, int v, int m, char *why, size_t n);
/* Builds the schedule, or refuses the request (see above). A forward-only schedule
 * (evaluation) runs micro-batches in order through every chunk, with no
 * backward, reduction or optimizer step. */
loom_status loom_schedule_build(loom_schedule *s, loom_schedule_kind kind, int p, int v, int m, loom_error *err);
/* The forward-only schedule over the chunks a training kind lays out. */
loom_status loom_schedule_build_eval(loom_schedule *s, loom_schedule_kind train_kind, int p, int v, int m,
                                     loom_error *err);
void loom_schedule_free(loom_schedule *s);
/* Drops the tied-embedding reduction from every rank's actions: for a
 * model whose LM head is its own, there is nothing to tie. */
void loom_schedule_untie(loom_schedule *s);

/* "1f1b", "gpipe", "interleaved", "forward_only": the enum's value names,
 * read from the proto descriptor, without SCHEDULE_ and in lower case. */
const char *loom_schedule_kind_name(loom_schedule_kind kind);
/* Whether a kind trains (every kind but forward-only). */
bool loom_schedule_kind_trains(loom_schedule_kind kind);
/* Whether a kind splits each backward into B and W (the zero-bubble kinds). */
bool loom_schedule_kind_splits_backward(loom_schedule_kind kind);
/* Whether a kind lays its two chunks per rank out as a V. */
bool loom_schedule_kind_v_shape(loom_schedule_kind kind);
/* Whether action a ends its micro-batch's backward on its chunk (BACKWARD,
 * or the W of a split one): its activations are free after it. */
static inline bool loom_action_ends_backward(const loom_action *a) {
  return a->kind == LOOM_ACT_BACKWARD || a->kind == LOOM_ACT_BACKWARD_WEIGHT;
}
/* Whether action a is compute: a forward or any part of a backward. */
static inline bool loom_action_computes(const loom_action *a) {
  return a->kind == LOOM_ACT_FORWARD || a->kind == LOOM_ACT_BACKWARD || a->kind == LOOM_ACT_BACKWARD_INPUT ||
         a->kind == LOOM_ACT_BACKWARD_WEIGHT;
}
/* NULL-terminated names of the training kinds, in enum order (flag choices). */
const char *const *loom_schedule_train_kind_names(void);
const char *loom_action_name(loom_action_kind kind);

/* The most buffers rank r holds at once by its events, of its chunk c (of
 * all its chunks if c < 0): live, activation slots (the verifier's
 * peak_live over all chunks); deferred, weight-grad states; sends, send
 * buffers. A rank runs its actions in order, so all three are read off
 * its events with no replay. */
typedef struct {
  int live, deferred, sends;
} loom_schedule_peaks;
loom_schedule_peaks loom_schedule_rank_peaks(const loom_schedule *s, int r, int c);
/* Adds to held[kind] what rank r's action i takes (acquire) or gives back:
 * called for each action in order, acquires then releases, held is what
 * the rank holds while each runs and after it (the tracer's count of
 * buffers over time). */
void loom_schedule_hold(const loom_schedule *s, int r, int i, bool acquire, int held[LOOM_BUFFER_KINDS]);
/* The same for the schedule of this shape, into live[p] (all chunks),
 * deferred[p * v] and slots[p * v] (per chunk) and sends[p]. A shape of up
 * to LOOM_SCHEDULE_BUILT_ACTIONS actions is built and read as above; a
 * larger one (a plan search asks for thousands of shapes, some of millions
 * of actions) is counted one rank at a time as it is generated, never
 * stored, which gives the same slots and states, and for send buffers,
 * whose release needs every rank's order, the bound of
 * loom_schedule_send_bound. Refuses a shape loom_schedule_build refuses.
 * (Building a shape with its events is what a plan search pays most for:
 * gpt50b's search on 512 GPUs took 5 s building shapes of up to 2M actions,
 * 1.7 s at this bound.) */
#define LOOM_SCHEDULE_BUILT_ACTIONS (1 << 16)
loom_status loom_schedule_shape_peaks(loom_schedule_kind kind, int p, int v, int m, int *live, int *slots,
                                      int *deferred, int *sends, loom_error *err);
/* The counted way, whatever the shape's size. */
loom_status loom_schedule_counted_peaks(loom_schedule_kind kind, int p, int v, int m, int *live, int *slots,
                                        int *deferred, int *sends, loom_error *err);
/* A bound on the send buffers a rank holding `live` slots at most holds at
 * once, for shapes too large to build (tests/test_schedule.c checks it on
 * every shape it builds). */
int loom_schedule_send_bound(loom_schedule_kind kind, int v, int m, int live);
/* Whether action a reads or writes a buffer of this kind of its (mb,
 * chunk): the one rule the generator's events, the verifier's check and
 * the executor follow. */
bool loom_action_uses(const loom_action *a, loom_buffer_kind kind);

/* The one rule for where stages lie: the virtual stage of (rank, chunk) of
 * p ranks, looped (c*p + r) or V-shaped (chunk 1 runs back down the ranks),
 * and the inverse, the (rank, chunk) holding stage `stage`. */
static inline int loom_stage_of(bool v_shape, int p, int rank, int chunk) {
  return v_shape && chunk == 1 ? 2 * p - 1 - rank : chunk * p + rank;
}
static inline void loom_stage_place(bool v_shape, int p, int stage, int *rank, int *chunk) {
  *chunk = stage / p;
  *rank = v_shape && *chunk == 1 ? 2 * p - 1 - stage : stage % p;
}
static inline int loom_virtual_stage(const loom_schedule *s, int rank, int chunk) {
  return loom_stage_of(s->v_shape, s->p, rank, chunk);
}

#endif
