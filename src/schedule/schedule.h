/* Pipeline schedules as data (DESIGN.md invariant 3).
 *
 * A schedule is every pipeline rank's ordered list of actions for one
 * training step, a pure function of (kind, p, v, m). The executor runs it,
 * the verifier proves it deadlock-free and bounds its memory, the renderer
 * draws it; none of them works the schedule out again.
 *
 * Rank r's chunk c holds virtual stage s = c*p + r of S = p*v stages; stage
 * 0 holds the embedding, stage S-1 the LM head and loss. Activations flow
 * s -> s+1 and grads s+1 -> s. Sends never block (non-blocking transfers
 * whose buffers live until the step ends); a recv waits for its send. */
#ifndef LOOM_SCHEDULE_H
#define LOOM_SCHEDULE_H

#include <stdbool.h>
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
} loom_action_kind;

typedef struct {
  loom_action_kind kind;
  int mb;    /* micro-batch, -1 for step-wide actions */
  int chunk; /* this rank's model chunk, -1 for step-wide actions */
  int peer;  /* pipeline rank at the other end of a transfer, else -1 */
} loom_action;

/* The plan's enum (proto/loom.proto ScheduleKind) is the only one. */
typedef Loom__ScheduleKind loom_schedule_kind;
#define LOOM_SCHEDULE_1F1B LOOM__SCHEDULE_KIND__SCHEDULE_1F1B
#define LOOM_SCHEDULE_GPIPE LOOM__SCHEDULE_KIND__SCHEDULE_GPIPE
#define LOOM_SCHEDULE_INTERLEAVED LOOM__SCHEDULE_KIND__SCHEDULE_INTERLEAVED
#define LOOM_SCHEDULE_FORWARD_ONLY LOOM__SCHEDULE_KIND__SCHEDULE_FORWARD_ONLY

typedef struct {
  loom_schedule_kind kind;
  int p, v, m;
  int *count;            /* [p] actions per rank */
  loom_action **actions; /* [p][count[r]] */
} loom_schedule;

/* Builds the schedule, or refuses the request naming the rule:
 * m >= 1, v >= 1, v == 1 unless interleaved or forward-only, m % p == 0 when
 * interleaved. A forward-only schedule (evaluation) runs micro-batches in
 * order through every chunk, with no backward, reduction or optimizer step. */
loom_status loom_schedule_build(loom_schedule *s, loom_schedule_kind kind, int p, int v, int m, loom_error *err);
void loom_schedule_free(loom_schedule *s);
/* Drops the tied-embedding reduction from every rank's actions: for a
 * model whose LM head is its own, there is nothing to tie. */
void loom_schedule_untie(loom_schedule *s);

/* "1f1b", "gpipe", "interleaved", "forward_only": the enum's value names,
 * read from the proto descriptor, without SCHEDULE_ and in lower case. */
const char *loom_schedule_kind_name(loom_schedule_kind kind);
/* 0 and *kind set if name is a kind's name; else -1. */
int loom_schedule_kind_parse(const char *name, loom_schedule_kind *kind);
/* Whether a kind trains (every kind but forward-only). */
bool loom_schedule_kind_trains(loom_schedule_kind kind);
/* NULL-terminated names of the training kinds, in enum order (flag choices). */
const char *const *loom_schedule_train_kind_names(void);
const char *loom_action_name(loom_action_kind kind);

/* The most micro-batches rank r's chunk c holds at once (forward taken,
 * backward not yet run): the activation slots the executor gives it. */
int loom_schedule_chunk_peak(const loom_schedule *s, int r, int c);

/* Virtual stage of (rank, chunk), and the rank holding stage s. */
static inline int loom_virtual_stage(const loom_schedule *s, int rank, int chunk) { return chunk * s->p + rank; }

#endif
