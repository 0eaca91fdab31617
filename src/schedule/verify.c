/* Schedule verification by simulation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "comm/comm.h"
#include "schedule/rendezvous.h"
#include "schedule/verify.h"

const loom_send_model LOOM_SENDS_BUFFERED = {.name = LOOM_SENDS_BUFFERED_NAME};
const loom_send_model LOOM_SENDS_RENDEZVOUS = {.name = LOOM_SENDS_RENDEZVOUS_NAME, .rendezvous = true, .by_kind = true};

const loom_send_model *const LOOM_SEND_MODELS[] = {&LOOM_SENDS_BUFFERED, &LOOM_SENDS_RENDEZVOUS, NULL};
enum { SEND_MODEL_COUNT = sizeof LOOM_SEND_MODELS / sizeof LOOM_SEND_MODELS[0] - 1 };

const char *const *loom_send_model_names(void) {
  static const char *names[SEND_MODEL_COUNT + 1];
  for (int i = 0; i < SEND_MODEL_COUNT; i++) names[i] = LOOM_SEND_MODELS[i]->name;
  return names;
}

typedef struct {
  const loom_schedule *s;
  const loom_action_costs *costs; /* NULL: unit costs */
  const loom_send_model *model;
  loom_rendezvous *rdv;           /* the transfers, under a rendezvous model */
  char *recv_posted;              /* [2][m][S] rendezvous: a recv of the message is posted */
  int *posted_at;                 /* [p] rendezvous: the action whose recv the rank has posted, -1 */
  char *finished;                 /* [p] rendezvous: past its last action's waits for sends */
  loom_schedule_report *rep;
  int S;
  double *sent;      /* [2][m][S] time a message to (kind, mb, dst stage) was sent, -1 if not */
  double *received;  /* [2][m][S] time its recv completed, -1 if not yet */
  char *done;        /* [p][3][m][v] forward, backward's input half, its weight half done (a whole backward: both) */
  int *pos; /* [p] */
  double *clock, *busy, *tied_arrival; /* [p]; tied_arrival -1 while not arrived */
} sim;

static int msg_index(const sim *x, int grad, int mb, int stage) { return (grad * x->s->m + mb) * x->S + stage; }
enum { PASS_F = 0, PASS_B = 1, PASS_W = 2, PASSES = 3 };
static char *done_at(const sim *x, int r, int pass, int mb, int chunk) {
  return &x->done[((r * PASSES + pass) * x->s->m + mb) * x->s->v + chunk];
}

/* "rank 1: recv grad of micro-batch 2 chunk 0 from rank 2" */
static void describe(char *out, size_t n, int r, const loom_action *a) {
  const int inbound = a->kind == LOOM_ACT_RECV_ACT || a->kind == LOOM_ACT_RECV_GRAD;
  char peer[32] = "";
  if (a->peer >= 0) snprintf(peer, sizeof peer, " %s rank %d", inbound ? "from" : "to", a->peer);
  if (a->mb >= 0)
    snprintf(out, n, "rank %d: %s of micro-batch %d chunk %d%s", r, loom_action_name(a->kind), a->mb, a->chunk, peer);
  else snprintf(out, n, "rank %d: %s%s", r, loom_action_name(a->kind), peer);
}

/* Records the first problem; returns -1 for step() to pass on. */
static int fail(sim *x, int r, const loom_action *a, const char *problem) {
  char what[200];
  describe(what, sizeof what, r, a);
  snprintf(x->rep->why, sizeof x->rep->why, "%s %s", what, problem);
  x->rep->ok = false;
  return -1;
}

/* The stage a transfer of `a` on rank r is addressed to, and its peer rank. */
static void route(const sim *x, int r, const loom_action *a, int *dst_stage, int *peer) {
  const int stage = loom_virtual_stage(x->s, r, a->chunk);
  const int up = a->kind == LOOM_ACT_SEND_ACT || a->kind == LOOM_ACT_RECV_GRAD;
  const int other = up ? stage + 1 : stage - 1;
  const int is_send = a->kind == LOOM_ACT_SEND_ACT || a->kind == LOOM_ACT_SEND_GRAD;
  int chunk;
  *dst_stage = is_send ? other : stage;
  *peer = -1;
  if (other >= 0 && other < x->S) loom_stage_place(x->s->v_shape, x->s->p, other, peer, &chunk);
}

/* How long rank r is busy with a, and (for a send) how long its message
 * takes to arrive: the caller's costs, or unit costs (forward 1/v, a whole
 * backward 2/v, each half of a split one 1/v, everything else free). */
static double duration(const sim *x, int r, const loom_action *a) {
  if (x->costs) return x->costs->duration(x->costs->ctx, r, a);
  if (a->kind == LOOM_ACT_BACKWARD) return 2.0 / x->s->v;
  return loom_action_computes(a) ? 1.0 / x->s->v : 0.0;
}
static double flight(const sim *x, int r, const loom_action *a) {
  return x->costs && x->costs->flight ? x->costs->flight(x->costs->ctx, r, a) : 0.0;
}

static void record_span(sim *x, int r, double start, double end) {
  loom_schedule_report *rep = x->rep;
  /* At most one span per action: sized by the rank's actions up front, never grown. */
  rep->spans[r][rep->span_count[r]++] = (loom_span){start, end, x->pos[r]};
}

/* The executor waits, after action i, for the sends whose buffers it gives
 * back: false while one of their recvs is still to come, else true with
 * rank r's clock moved on to the latest of those receipts. */
static bool wait_for_releases(sim *x, int r, int i) {
  const loom_schedule *s = x->s;
  for (int e = s->event_at[r][i]; e < s->event_at[r][i + 1]; e++) {
    const loom_buffer_event *b = &s->events[r][e];
    if (b->kind != LOOM_BUFFER_SEND || b->acquire || b->mb < 0 || b->mb >= s->m || b->chunk < 0 || b->chunk >= s->v)
      continue; /* out of range: check_events names it */
    if (x->rdv) loom_rendezvous_flush(x->rdv, r, x->clock[r]); /* a wait for a send hands over what was queued */
    const loom_action send = {b->grad ? LOOM_ACT_SEND_GRAD : LOOM_ACT_SEND_ACT, b->mb, b->chunk, -1};
    int dst, peer;
    route(x, r, &send, &dst, &peer);
    if (dst < 0 || dst >= x->S) continue;
    const double received = x->received[msg_index(x, b->grad, b->mb, dst)];
    if (received < 0) return false;
    if (received > x->clock[r]) x->clock[r] = received;
  }
  return true;
}

/* Posts rank r's transfer of a (message i) under a rendezvous model: -1
 * (through fail) if it would meet another message. */
static int post(sim *x, int r, const loom_action *a, int i) {
  int other;
  if (loom_rendezvous_post(x->rdv, r, a, a->peer, i, x->clock[r], flight(x, r, a), &other) == 0) return 0;
  const int stage = other % x->S, mb = other / x->S % x->s->m, grad = other / x->S / x->s->m;
  char why[200];
  snprintf(why, sizeof why, "would meet the %s of micro-batch %d to stage %d: sends between two ranks meet their recvs in issue order, without tags",
           grad ? "grad" : "activation", mb, stage);
  return fail(x, r, a, why);
}

/* Each action kind's turn: 1 if it ran (its clock moved to when it may start), 0 if blocked, -1 on error. */

static int run_send(sim *x, int r, const loom_action *a) {
  int dst, peer;
  route(x, r, a, &dst, &peer);
  if (dst < 0 || dst >= x->S) return fail(x, r, a, "there is no stage to send to");
  if (a->peer != peer) return fail(x, r, a, "addressed to the wrong rank");
  const int i = msg_index(x, a->kind == LOOM_ACT_SEND_GRAD, a->mb, dst);
  if (x->sent[i] >= 0) return fail(x, r, a, "sent twice");
  if (x->rdv && loom_send_travels(x->model, r, peer)) { /* it leaves when it meets its recv */
    x->sent[i] = x->clock[r];
    if (post(x, r, a, i) < 0) return -1;
  } else {
    x->sent[i] = x->clock[r] + flight(x, r, a);
  }
  return 1;
}

static int run_recv(sim *x, int r, const loom_action *a) {
  int dst, peer;
  route(x, r, a, &dst, &peer);
  if (a->peer != peer) return fail(x, r, a, "expects the wrong rank");
  const int i = msg_index(x, a->kind == LOOM_ACT_RECV_GRAD, a->mb, dst);
  if (x->rdv && loom_send_travels(x->model, r, peer)) { /* posted once, then waited for until it meets its send */
    if (x->posted_at[r] != x->pos[r]) {
      if (x->recv_posted[i]) return fail(x, r, a, "received twice");
      x->recv_posted[i] = 1;
      x->posted_at[r] = x->pos[r];
      if (post(x, r, a, i) < 0) return -1;
      loom_rendezvous_flush(x->rdv, r, x->clock[r]);
    }
    if (x->received[i] < 0) return 0;
    if (x->received[i] > x->clock[r]) x->clock[r] = x->received[i];
    return 1;
  }
  if (x->sent[i] < 0) return 0; /* waits for the send */
  if (x->received[i] >= 0) return fail(x, r, a, "received twice");
  if (x->sent[i] > x->clock[r]) x->clock[r] = x->sent[i];
  x->received[i] = x->clock[r];
  return 1;
}

/* The passes a whole backward is, or the one half of a split one. */
static int run_pass(sim *x, int r, const loom_action *a) {
  const int first = a->kind == LOOM_ACT_FORWARD ? PASS_F : a->kind == LOOM_ACT_BACKWARD_WEIGHT ? PASS_W : PASS_B;
  const int last = a->kind == LOOM_ACT_BACKWARD ? PASS_W : first;
  for (int pass = first; pass <= last; pass++)
    if (*done_at(x, r, pass, a->mb, a->chunk)) return fail(x, r, a, "runs twice");
  if (first > PASS_F && !*done_at(x, r, first - 1, a->mb, a->chunk))
    return fail(x, r, a, first == PASS_B ? "comes before its forward" : "comes before its input-grad backward");
  for (int pass = first; pass <= last; pass++) *done_at(x, r, pass, a->mb, a->chunk) = 1;
  return 1;
}

/* Both ends arrive, then both leave at the later arrival. */
static int run_tied(sim *x, int r, const loom_action *a) {
  const int other = a->peer;
  if (x->rdv) loom_rendezvous_flush(x->rdv, r, x->clock[r]); /* a rank hands over what it queued before it waits */
  if (x->tied_arrival[r] < 0) x->tied_arrival[r] = x->clock[r];
  if (x->tied_arrival[other] < 0) return 0;
  const double t = x->tied_arrival[r] > x->tied_arrival[other] ? x->tied_arrival[r] : x->tied_arrival[other];
  x->clock[r] = t;
  return 1;
}

/* Runs rank r's next action if it can; returns 1 if it ran, 0 if blocked, -1 on error. */
static int step(sim *x, int r) {
  if (x->pos[r] > 0 && !wait_for_releases(x, r, x->pos[r] - 1)) return 0; /* waits for a send to be done */
  const loom_action *a = &x->s->actions[r][x->pos[r]];
  int ran = 1;
  switch (a->kind) {
  case LOOM_ACT_SEND_ACT:
  case LOOM_ACT_SEND_GRAD: ran = run_send(x, r, a); break;
  case LOOM_ACT_RECV_ACT:
  case LOOM_ACT_RECV_GRAD: ran = run_recv(x, r, a); break;
  case LOOM_ACT_FORWARD:
  case LOOM_ACT_BACKWARD:
  case LOOM_ACT_BACKWARD_INPUT:
  case LOOM_ACT_BACKWARD_WEIGHT: ran = run_pass(x, r, a); break;
  case LOOM_ACT_REDUCE_TIED: ran = run_tied(x, r, a); break;
  case LOOM_ACT_REDUCE_DP:
  case LOOM_ACT_OPTIMIZER_STEP: break;
  }
  if (ran != 1) return ran;
  /* Every action keeps the rank busy for its cost: a send's is 0 (it leaves at once) unless the caller's costs make
   * the sender wait for it (`loom sim` under --no-overlap-p2p-communication). */
  const double cost = duration(x, r, a);
  const double begin = x->clock[r]; /* after any wait for a recv or a reduction */
  const bool compute = loom_action_computes(a);
  x->clock[r] = begin + cost;
  if (cost > 0.0 || compute) record_span(x, r, begin, x->clock[r]);
  if (compute) {
    x->busy[r] += cost;
    x->rep->compute_end = x->clock[r] > x->rep->compute_end ? x->clock[r] : x->rep->compute_end;
  }
  x->pos[r]++;
  return 1;
}

/* Names every rank still waiting: a deadlock is a cycle among them. */
static void report_deadlock(sim *x) {
  char *w = x->rep->why;
  size_t used = (size_t)snprintf(w, sizeof x->rep->why, "deadlock:");
  for (int r = 0; r < x->s->p && used < sizeof x->rep->why; r++) {
    if (x->pos[r] >= x->s->count[r]) {
      if (x->rdv && x->s->count[r] > 0 && !x->finished[r])
        used += (size_t)snprintf(w + used, sizeof x->rep->why - used, " rank %d: the wait for its last sends waits;", r);
      continue;
    }
    const loom_action *a = &x->s->actions[r][x->pos[r]];
    char what[200];
    describe(what, sizeof what, r, a);
    used += (size_t)snprintf(w + used, sizeof x->rep->why - used, " %s waits;", what);
  }
  x->rep->ok = false;
}

static bool all_matched(sim *x) {
  for (int i = 0; i < 2 * x->s->m * x->S; i++) {
    if (x->sent[i] >= 0 && x->received[i] < 0) {
      const int stage = i % x->S, mb = i / x->S % x->s->m, grad = i / x->S / x->s->m;
      snprintf(x->rep->why, sizeof x->rep->why, "the %s of micro-batch %d to stage %d is never received",
               grad ? "grad" : "activation", mb, stage);
      x->rep->ok = false;
      return false;
    }
  }
  const int passes = loom_schedule_kind_trains(x->s->kind) ? PASSES : 1; /* what every (mb, chunk) must run */
  static const char *const NAMES[PASSES] = {"forward", "backward", "weight-grad backward"};
  for (int r = 0; r < x->s->p; r++)
    for (int mb = 0; mb < x->s->m; mb++)
      for (int c = 0; c < x->s->v; c++)
        for (int pass = 0; pass < passes; pass++)
          if (!*done_at(x, r, pass, mb, c)) {
            snprintf(x->rep->why, sizeof x->rep->why, "rank %d never runs the %s of micro-batch %d chunk %d", r,
                     NAMES[pass], mb, c);
          x->rep->ok = false;
          return false;
        }
  return true;
}

/* Rank r's buffer events against its actions: every buffer an action uses
 * is held (taken by an earlier or its own event, not yet given back), none
 * is taken twice or given back unheld, and none is held at the end. The
 * peaks are then what the rank needs, which the executor allocates. */
static bool check_events(const loom_schedule *s, int r, loom_schedule_report *rep) {
  const int keys = s->m * s->v;
  char *held = calloc((size_t)LOOM_BUFFER_KINDS * 2 * keys, 1); /* [kind][grad][mb * v + chunk] */
  LOOM_CHECK(held != NULL, "out of memory verifying a schedule");
#define HELD(kind, grad, mb, chunk) held[((kind) * 2 + ((kind) == LOOM_BUFFER_SEND && (grad))) * keys + (mb) * s->v + (chunk)]
  static const char *const WHAT[LOOM_BUFFER_KINDS] = {"activation slot", "weight-grad state", "send buffer"};
  bool ok = true;
  char what[200];
  for (int i = 0; i < s->count[r] && ok; i++) {
    const loom_action *a = &s->actions[r][i];
    for (int pass = 0; pass < 2 && ok; pass++) { /* acquires, then (after checking what the action uses) releases */
      for (int e = s->event_at[r][i]; e < s->event_at[r][i + 1] && ok; e++) {
        const loom_buffer_event *b = &s->events[r][e];
        if (b->acquire != (pass == 0)) continue;
        if (b->mb < 0 || b->mb >= s->m || b->chunk < 0 || b->chunk >= s->v) {
          describe(what, sizeof what, r, a);
          snprintf(rep->why, sizeof rep->why, "%s names a %s of micro-batch %d chunk %d, out of range", what, WHAT[b->kind], b->mb, b->chunk);
          ok = false;
        } else if (HELD(b->kind, b->grad, b->mb, b->chunk) == b->acquire) {
          describe(what, sizeof what, r, a);
          snprintf(rep->why, sizeof rep->why, "%s %s the %s of micro-batch %d chunk %d", what,
                   b->acquire ? "takes again" : "gives back the unheld", WHAT[b->kind], b->mb, b->chunk);
          ok = false;
        } else {
          HELD(b->kind, b->grad, b->mb, b->chunk) = b->acquire;
        }
      }
      for (int k = 0; pass == 0 && k < LOOM_BUFFER_KINDS && ok; k++)
        if (loom_action_uses(a, k) && !HELD(k, a->kind == LOOM_ACT_SEND_GRAD, a->mb, a->chunk)) {
          describe(what, sizeof what, r, a);
          snprintf(rep->why, sizeof rep->why, "%s uses the %s of micro-batch %d chunk %d, which its buffer events do not hold",
                   what, WHAT[k], a->mb, a->chunk);
          ok = false;
        }
    }
  }
#undef HELD
  for (int k = 0; k < LOOM_BUFFER_KINDS * 2 * keys && ok; k++)
    if (held[k]) {
      snprintf(rep->why, sizeof rep->why, "rank %d still holds the %s of micro-batch %d chunk %d at the step's end", r,
               WHAT[k / (2 * keys)], k % keys / s->v, k % keys % s->v);
      ok = false;
    }
  free(held);
  if (!ok) rep->ok = false;
  return ok;
}

loom_status loom_schedule_verify(const loom_schedule *s, loom_schedule_report *rep) {
  loom_status st = loom_schedule_verify_sends(s, &LOOM_SENDS_RENDEZVOUS, rep);
  char why[sizeof rep->why];
  snprintf(why, sizeof why, "%s", rep->why);
  loom_schedule_report_free(rep);
  const loom_status buffered = loom_schedule_verify_sends(s, &LOOM_SENDS_BUFFERED, rep);
  if (buffered != LOOM_OK || st == LOOM_OK) return buffered;
  rep->ok = false;
  snprintf(rep->why, sizeof rep->why, "with rendezvous sends (NCCL's): %.*s", (int)sizeof rep->why - 40, why);
  return st;
}

loom_status loom_schedule_verify_sends(const loom_schedule *s, const loom_send_model *model, loom_schedule_report *rep) {
  return loom_schedule_simulate(s, NULL, model, rep);
}

loom_status loom_schedule_simulate(const loom_schedule *s, const loom_action_costs *costs, const loom_send_model *model,
                                   loom_schedule_report *rep) {
  memset(rep, 0, sizeof *rep);
  const int p = s->p, S = s->p * s->v;
  rep->ok = true;
  rep->p = p;
  rep->peak_live = calloc((size_t)p, sizeof(int));
  rep->peak_deferred = calloc((size_t)p, sizeof(int));
  rep->peak_sends = calloc((size_t)p, sizeof(int));
  rep->span_count = calloc((size_t)p, sizeof(int));
  rep->spans = calloc((size_t)p, sizeof(loom_span *));
  sim x = {.s = s, .costs = costs, .model = model ? model : &LOOM_SENDS_BUFFERED, .rep = rep, .S = S};
  x.sent = malloc((size_t)2 * s->m * S * sizeof(double));
  x.received = malloc((size_t)2 * s->m * S * sizeof(double));
  x.done = calloc((size_t)p * PASSES * s->m * s->v, 1);
  x.pos = calloc((size_t)p, sizeof(int));
  x.clock = calloc((size_t)p, sizeof(double));
  x.busy = calloc((size_t)p, sizeof(double));
  x.tied_arrival = malloc((size_t)p * sizeof(double));
  if (x.model->rendezvous) {
    x.rdv = loom_rendezvous_new(s, x.model, x.received);
    x.recv_posted = calloc((size_t)2 * s->m * S, 1);
    x.posted_at = malloc((size_t)p * sizeof(int));
    x.finished = calloc((size_t)p, 1);
    LOOM_CHECK(x.recv_posted && x.posted_at && x.finished, "out of memory verifying a schedule");
    for (int r = 0; r < p; r++) x.posted_at[r] = -1;
  }
  LOOM_CHECK(x.sent && x.received && x.done && x.pos && x.clock && x.busy && x.tied_arrival &&
                 rep->peak_live && rep->peak_deferred && rep->peak_sends && rep->span_count && rep->spans,
             "out of memory verifying a schedule");
  for (int r = 0; r < p; r++) {
    rep->spans[r] = malloc(((size_t)s->count[r] + 1) * sizeof(loom_span));
    LOOM_CHECK(rep->spans[r] != NULL, "out of memory simulating a schedule");
    /* Properties of the rank's order, whatever the timing. */
    const loom_schedule_peaks peaks = loom_schedule_rank_peaks(s, r, -1);
    rep->peak_live[r] = peaks.live, rep->peak_deferred[r] = peaks.deferred, rep->peak_sends[r] = peaks.sends;
  }
  for (int i = 0; i < 2 * s->m * S; i++) x.sent[i] = x.received[i] = -1.0;
  for (int r = 0; r < p; r++) x.tied_arrival[r] = -1.0;
  int progress = 1, pending = 1, err = 0;
  while (progress && pending && !err) {
    progress = pending = 0;
    for (int r = 0; r < p && !err; r++) {
      int ran;
      while (x.pos[r] < s->count[r] && (ran = step(&x, r)) == 1) progress = 1;
      /* Rendezvous: the waits for the sends a rank's last action gives back hand
       * over what it queued, so they run with the others (buffered: below). */
      if (x.rdv && x.pos[r] == s->count[r] && s->count[r] > 0 && !x.finished[r] && wait_for_releases(&x, r, s->count[r] - 1))
        x.finished[r] = 1, progress = 1;
      if (x.pos[r] < s->count[r] || (x.rdv && s->count[r] > 0 && !x.finished[r])) {
        pending = 1;
        err = !rep->ok;
      }
    }
  }
  if (rep->ok && pending) report_deadlock(&x);
  if (rep->ok && all_matched(&x))
    for (int r = 0; r < p && !x.rdv; r++) /* the waits for the sends a rank's last action gives back */
      if (s->count[r] > 0) wait_for_releases(&x, r, s->count[r] - 1);
  for (int r = 0; r < p && rep->ok; r++) check_events(s, r, rep);
  for (int r = 0; r < p; r++) rep->makespan = x.clock[r] > rep->makespan ? x.clock[r] : rep->makespan;
  for (int r = 0; r < p && rep->compute_end > 0; r++) rep->bubble += (1.0 - x.busy[r] / rep->compute_end) / p;
  free(x.sent);
  free(x.received);
  free(x.done);
  free(x.pos);
  free(x.clock);
  free(x.busy);
  free(x.tied_arrival);
  free(x.recv_posted);
  free(x.posted_at);
  free(x.finished);
  loom_rendezvous_free(x.rdv);
  return rep->ok ? LOOM_OK : LOOM_ERR_RUNTIME;
}

void loom_schedule_report_free(loom_schedule_report *rep) {
  for (int r = 0; rep->spans && r < rep->p; r++) free(rep->spans[r]);
  free(rep->spans);
  free(rep->span_count);
  free(rep->peak_live);
  free(rep->peak_deferred);
  free(rep->peak_sends);
  memset(rep, 0, sizeof *rep);
}

/* With a stage's forward, input-grad and weight-grad passes all costing one
 * unit (F = B = W = 1), each rank computes 3m; the zero-bubble schedules end
 * at the later of two bounds. The steady one: the papers' bubble per rank,
 * (p-1)(F+B-W) for ZB-H1 and (p-1)F/2 for ZB-V (only the last rank's wait
 * for the first half-stage forwards), after 3m of work. The chain one, which
 * binds when m is small: the first micro-batch's forwards and input grads
 * through every stage, one more F+B for each further micro-batch, and the
 * first rank's last W: (m+p-1)(F+B) + W. The simulation meets the larger
 * exactly for p 1..8, m 1..16 (tests/test_schedule.c). */
double loom_schedule_theory_bubble(const loom_schedule *s) {
  const double p = s->p, m = s->m;
  if (loom_schedule_kind_splits_backward(s->kind)) {
    const double steady = 3.0 * m + (s->kind == LOOM_SCHEDULE_ZB_V ? (p - 1.0) / 2.0 : p - 1.0);
    const double chain = 2.0 * (m + p - 1.0) + 1.0;
    return 1.0 - 3.0 * m / (steady > chain ? steady : chain);
  }
  const int v = s->kind == LOOM_SCHEDULE_INTERLEAVED ? s->v : 1;
  return (p - 1.0) / ((double)v * m + p - 1.0);
}
