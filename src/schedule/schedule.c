/* Schedule generators: GPipe, 1F1B (PipeDream-Flush), Megatron's
 * interleaved 1F1B, and the zero-bubble ZB-H1 and ZB-V (Qi et al., "Zero
 * Bubble Pipeline Parallelism", ICLR 2024). Each kind fixes an order of
 * compute passes per rank; the transfers around them follow from the stage
 * graph. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/check.h"
#include "schedule/schedule.h"

#define MAX_KINDS 16
static char g_names[MAX_KINDS][32];
static const char *g_train_names[MAX_KINDS + 1];

/* Names from the proto's descriptor, once: SCHEDULE_1F1B -> 1f1b. */
static void load_names(void) {
  if (g_names[0][0]) return;
  const ProtobufCEnumDescriptor *d = &loom__schedule_kind__descriptor;
  LOOM_CHECK(d->n_values <= MAX_KINDS, "too many schedule kinds");
  int trains = 0;
  for (unsigned i = 0; i < d->n_values; i++) {
    const int v = d->values[i].value;
    LOOM_CHECK(v >= 0 && v < MAX_KINDS, "schedule kinds are small and dense");
    const char *name = d->values[i].name + strlen("SCHEDULE_");
    for (size_t c = 0; name[c] && c + 1 < sizeof g_names[v]; c++)
      g_names[v][c] = (char)(name[c] >= 'A' && name[c] <= 'Z' ? name[c] - 'A' + 'a' : name[c]);
    if (v != LOOM_SCHEDULE_FORWARD_ONLY) g_train_names[trains++] = g_names[v];
  }
}

static bool known(loom_schedule_kind kind) {
  load_names();
  return kind >= 0 && kind < MAX_KINDS && g_names[kind][0];
}

const char *loom_schedule_kind_name(loom_schedule_kind kind) { return known(kind) ? g_names[kind] : "unknown"; }

bool loom_schedule_kind_trains(loom_schedule_kind kind) { return kind != LOOM_SCHEDULE_FORWARD_ONLY; }
bool loom_schedule_kind_splits_backward(loom_schedule_kind kind) {
  return kind == LOOM_SCHEDULE_ZB_H1 || kind == LOOM_SCHEDULE_ZB_V;
}
bool loom_schedule_kind_v_shape(loom_schedule_kind kind) { return kind == LOOM_SCHEDULE_ZB_V; }

const char *const *loom_schedule_train_kind_names(void) {
  load_names();
  return g_train_names;
}

const char *loom_action_name(loom_action_kind kind) {
  static const char *const NAMES[] = {"forward", "backward", "recv activation", "send activation", "recv grad",
                                      "send grad", "reduce tied embedding grads", "reduce data-parallel grads",
                                      "optimizer step", "backward (input grad)", "backward (weight grads)"};
  return NAMES[kind];
}

/* What one stream of a rank's actions holds at once, action by action: the
 * one definition behind the verifier's peak_live, the executor's slots per
 * chunk and its weight-grad states. */
typedef struct {
  bool forward_only; /* no backward holds a forward's activations */
  int live, peak_live;       /* activations: a forward takes one, the end of its backward frees it */
  int waiting, peak_waiting; /* split backwards whose weight half has not run */
} tally;

static void tally_add(tally *t, const loom_action *a) {
  if (a->kind == LOOM_ACT_FORWARD) t->live++;
  if (loom_action_ends_backward(a)) t->live--;
  if (t->live > t->peak_live) t->peak_live = t->live;
  if (a->kind == LOOM_ACT_FORWARD && t->forward_only) t->live--;
  t->waiting += a->kind == LOOM_ACT_BACKWARD_INPUT ? 1 : a->kind == LOOM_ACT_BACKWARD_WEIGHT ? -1 : 0;
  if (t->waiting > t->peak_waiting) t->peak_waiting = t->waiting;
}

/* A rank's order as it is built: stored, or (tallies set) only counted, into
 * tallies[0] for the whole rank and tallies[1 + c] for chunk c. */
typedef struct {
  loom_action *list;
  int count, cap;
  tally *tallies;
} action_list;

static void push(action_list *l, loom_action_kind kind, int mb, int chunk, int peer) {
  if (l->tallies) {
    const loom_action a = {kind, mb, chunk, peer};
    tally_add(&l->tallies[0], &a);
    if (chunk >= 0) tally_add(&l->tallies[1 + chunk], &a);
    return;
  }
  if (l->count == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 64;
    l->list = realloc(l->list, (size_t)l->cap * sizeof *l->list);
    LOOM_CHECK(l->list != NULL, "out of memory building a schedule");
  }
  l->list[l->count++] = (loom_action){kind, mb, chunk, peer};
}

/* A compute step of a rank's order: a forward or (part of) a backward of (mb, chunk). */
typedef struct {
  loom_action_kind pass; /* FORWARD, BACKWARD, BACKWARD_INPUT or BACKWARD_WEIGHT */
  int mb, chunk;
} compute;

/* Appends one compute step with the transfers it needs: its input is
 * received first, its output sent right after. A weight pass moves nothing. */
static void emit(action_list *l, const loom_schedule *s, int r, compute c) {
  const int S = s->p * s->v, stage = loom_virtual_stage(s, r, c.chunk);
  int prev = -1, next = -1, chunk;
  if (stage > 0) loom_stage_place(s->v_shape, s->p, stage - 1, &prev, &chunk);
  if (stage < S - 1) loom_stage_place(s->v_shape, s->p, stage + 1, &next, &chunk);
  if (c.pass == LOOM_ACT_FORWARD) {
    if (stage > 0) push(l, LOOM_ACT_RECV_ACT, c.mb, c.chunk, prev);
    push(l, LOOM_ACT_FORWARD, c.mb, c.chunk, -1);
    if (stage < S - 1) push(l, LOOM_ACT_SEND_ACT, c.mb, c.chunk, next);
  } else if (c.pass == LOOM_ACT_BACKWARD_WEIGHT) {
    push(l, LOOM_ACT_BACKWARD_WEIGHT, c.mb, c.chunk, -1);
  } else {
    if (stage < S - 1) push(l, LOOM_ACT_RECV_GRAD, c.mb, c.chunk, next);
    push(l, c.pass, c.mb, c.chunk, -1);
    if (stage > 0) push(l, LOOM_ACT_SEND_GRAD, c.mb, c.chunk, prev);
  }
}

/* The k-th forward (or backward) of a rank in interleaved order: micro-batches
 * go through chunks in groups of p (Megatron's grouping); backward walks the
 * chunks in reverse. For v == 1 this is micro-batch k on chunk 0. */
static compute nth(const loom_schedule *s, int k, int backward) {
  const int group = k % (s->p * s->v);
  int chunk = group / s->p;
  if (backward) chunk = s->v - 1 - chunk;
  return (compute){backward ? LOOM_ACT_BACKWARD : LOOM_ACT_FORWARD, k / (s->p * s->v) * s->p + k % s->p, chunk};
}

/* Forward-count before the first backward on rank r. */
static int warmup(const loom_schedule *s, int r) {
  const int total = s->m * s->v;
  int w;
  switch (s->kind) {
  case LOOM_SCHEDULE_GPIPE: w = total; break;
  case LOOM_SCHEDULE_1F1B:
  case LOOM_SCHEDULE_ZB_H1: w = s->p - r - 1; break;
  default: w = (s->p - r - 1) * 2 + (s->v - 1) * s->p; break;
  }
  return w < total ? w : total;
}

/* A rank's order under construction, with its weight passes not yet placed
 * (a split backward's), oldest first. */
typedef struct {
  action_list l;
  const loom_schedule *s;
  int r;
  compute *deferred; /* [m * v]: each split backward's weight pass, queued once, taken from `oldest` */
  int oldest, ndeferred;
} rank_order;

static void put(rank_order *o, compute c) {
  emit(&o->l, o->s, o->r, c);
  if (c.pass == LOOM_ACT_BACKWARD_INPUT)
    o->deferred[o->oldest + o->ndeferred++] = (compute){LOOM_ACT_BACKWARD_WEIGHT, c.mb, c.chunk};
}

/* Places the oldest deferred weight pass. */
static void put_weight(rank_order *o) {
  emit(&o->l, o->s, o->r, o->deferred[o->oldest++]);
  o->ndeferred--;
}

/* GPipe, 1F1B, interleaved and ZB-H1 share one order of forwards and
 * backwards: a warm-up of forwards, then one forward and one backward in
 * turn, then the remaining backwards. ZB-H1 splits each backward and lets
 * rank r keep up to r weight passes waiting, placing the oldest after a B
 * once more wait: rank r's warm-up holds p - r - 1 forwards, so every rank
 * then holds at most p micro-batches, as 1F1B's first rank does, while the
 * deferred weight passes fill the later ranks' drain (the paper's "W
 * starts delayed by the warm-up count"). */
static void put_backward(rank_order *o, int k) {
  compute c = nth(o->s, k, 1);
  if (o->s->kind == LOOM_SCHEDULE_ZB_H1) c.pass = LOOM_ACT_BACKWARD_INPUT;
  put(o, c);
  while (o->ndeferred > o->r) put_weight(o);
}

static void build_steady(loom_schedule *s, rank_order *o) {
  const int total = s->m * s->v, w = warmup(s, o->r), steady = total - w;
  for (int k = 0; k < w; k++) put(o, nth(s, k, 0));
  for (int i = 0; i < steady; i++) {
    put(o, nth(s, w + i, 0));
    put_backward(o, i);
  }
  for (int i = steady; i < total; i++) put_backward(o, i);
}

/* ZB-V over chunk 0 (stage r) and chunk 1 (stage 2p-1-r), the V the paper
 * draws: a warm-up of 2(p-r)-1 chunk-0 forwards, r pairs of chunk-1 and
 * chunk-0 forwards, p-r chunk-1 F B W; then the steady F0 B0 W0 F1 B1 W1;
 * then r pairs of B0 B1, p-r of B0 W0, and the weight passes left. The
 * order is laid out for max(m, 2p-1) micro-batches and those past m are
 * left out: dropping whole micro-batches keeps every dependency and the
 * order between what remains, so the result stays deadlock-free. */
typedef struct {
  rank_order *o;
  int n[3][2]; /* [F, B, W][chunk] passes laid out so far */
  int m;
} v_order;

static void v_put(v_order *x, int which, int chunk) {
  static const loom_action_kind PASS[3] = {LOOM_ACT_FORWARD, LOOM_ACT_BACKWARD_INPUT, LOOM_ACT_BACKWARD_WEIGHT};
  const int mb = x->n[which][chunk]++;
  if (mb < x->m) emit(&x->o->l, x->o->s, x->o->r, (compute){PASS[which], mb, chunk});
}

enum { V_F = 0, V_B = 1, V_W = 2 };

static void build_v(loom_schedule *s, rank_order *o) {
  const int p = s->p, r = o->r, n = s->m > 2 * p - 1 ? s->m : 2 * p - 1;
  v_order x = {.o = o, .m = s->m};
  for (int i = 0; i < 2 * (p - r) - 1; i++) v_put(&x, V_F, 0);
  for (int i = 0; i < r; i++) v_put(&x, V_F, 1), v_put(&x, V_F, 0);
  for (int i = 0; i < p - r; i++) v_put(&x, V_F, 1), v_put(&x, V_B, 1), v_put(&x, V_W, 1);
  while (x.n[V_F][1] < x.n[V_F][0] || x.n[V_F][0] < n) {
    if (x.n[V_F][0] < n) v_put(&x, V_F, 0);
    v_put(&x, V_B, 0), v_put(&x, V_W, 0), v_put(&x, V_F, 1), v_put(&x, V_B, 1), v_put(&x, V_W, 1);
  }
  for (int i = 0; i < r; i++) v_put(&x, V_B, 0), v_put(&x, V_B, 1);
  for (int i = 0; i < p - r; i++) v_put(&x, V_B, 0), v_put(&x, V_W, 0);
  while (x.n[V_W][1] < x.n[V_B][1]) v_put(&x, V_W, 1);
  while (x.n[V_W][0] < x.n[V_B][0]) v_put(&x, V_W, 0);
  LOOM_CHECK(x.n[V_W][0] == n && x.n[V_W][1] == n && x.n[V_B][0] == n && x.n[V_F][1] == n, "ZB-V's layout is whole");
}

/* Forward-only: micro-batch by micro-batch through this rank's chunks. On
 * a V, whose chunk 1 waits for every rank's chunk 0, micro-batches go in
 * groups of p through chunk 0 and then chunk 1, so the ranks stay busy. */
static void build_forward_only(loom_schedule *s, int r, tally *tallies) {
  action_list l = {.tallies = tallies};
  const int group = s->v_shape ? s->p : 1;
  for (int g = 0; g < s->m; g += group)
    for (int c = 0; c < s->v; c++)
      for (int mb = g; mb < g + group && mb < s->m; mb++) emit(&l, s, r, (compute){LOOM_ACT_FORWARD, mb, c});
  s->actions[r] = l.list;
  s->count[r] = l.count;
}

/* Rank r's order into s, or with tallies (1 + v of them) only counted. */
static void build_rank(loom_schedule *s, int r, tally *tallies) {
  if (s->kind == LOOM_SCHEDULE_FORWARD_ONLY) {
    build_forward_only(s, r, tallies);
    return;
  }
  rank_order o = {.s = s, .r = r, .l = {.tallies = tallies}};
  /* Sized once: each (micro-batch, chunk) emits at most 7 actions (a forward
   * and a backward with their transfers, and a weight pass), then a few for the step. */
  if (!tallies) {
    o.l.cap = 7 * s->m * s->v + 8;
    o.l.list = loom_xmalloc((size_t)o.l.cap * sizeof *o.l.list, "schedule actions");
  }
  o.deferred = loom_xmalloc((size_t)s->m * s->v * sizeof *o.deferred, "deferred weight passes");
  if (s->kind == LOOM_SCHEDULE_ZB_V) build_v(s, &o);
  else build_steady(s, &o);
  while (o.ndeferred > 0) put_weight(&o);
  free(o.deferred);
  /* The tied wte lives on stage 0 and stage S-1; with one stage there is
   * nothing to tie, and where one rank holds both the sum is its own. */
  const int S = s->p * s->v;
  int first, last, chunk;
  loom_stage_place(s->v_shape, s->p, 0, &first, &chunk);
  loom_stage_place(s->v_shape, s->p, S - 1, &last, &chunk);
  if (S > 1 && (r == first || r == last)) push(&o.l, LOOM_ACT_REDUCE_TIED, -1, -1, r == first ? last : first);
  push(&o.l, LOOM_ACT_REDUCE_DP, -1, -1, -1);
  push(&o.l, LOOM_ACT_OPTIMIZER_STEP, -1, -1, -1);
  s->actions[r] = o.l.list;
  s->count[r] = o.l.count;
}

bool loom_action_uses(const loom_action *a, loom_buffer_kind kind) {
  switch (kind) {
  case LOOM_BUFFER_SLOT: return a->mb >= 0 && a->kind != LOOM_ACT_RECV_GRAD; /* a received grad lands in the executor's own buffer */
  case LOOM_BUFFER_WSTATE: return a->kind == LOOM_ACT_BACKWARD_INPUT || a->kind == LOOM_ACT_BACKWARD_WEIGHT;
  case LOOM_BUFFER_SEND: return a->kind == LOOM_ACT_SEND_ACT || a->kind == LOOM_ACT_SEND_GRAD;
  default: return false;
  }
}

/* ---- buffer events ---- */

static bool is_send(const loom_action *a) { return loom_action_uses(a, LOOM_BUFFER_SEND); }
static bool is_recv(const loom_action *a) { return a->kind == LOOM_ACT_RECV_ACT || a->kind == LOOM_ACT_RECV_GRAD; }

/* A message by its destination stage: (grad, mb, stage). */
static int message_of(const loom_schedule *s, int r, const loom_action *a) {
  const int stage = loom_virtual_stage(s, r, a->chunk);
  const bool grad = a->kind == LOOM_ACT_SEND_GRAD || a->kind == LOOM_ACT_RECV_GRAD;
  const int dst = a->kind == LOOM_ACT_SEND_ACT ? stage + 1 : a->kind == LOOM_ACT_SEND_GRAD ? stage - 1 : stage;
  return ((grad ? 1 : 0) * s->m + a->mb) * s->p * s->v + dst;
}

/* For each send of each rank, the action after which its buffer is given
 * back (see loom_buffer_event), into release[r][i] for send i (else -1):
 * the ranks' orders are replayed with a vector clock per rank, each message
 * carrying its sender's; a send is done once its rank's clock shows the
 * peer past the recv. Messages are the only causality counted (the tied
 * reduction is left out, which can only make a release later). */
static void place_send_releases(const loom_schedule *s, int **release) {
  const int p = s->p, messages = 2 * s->m * s->p * s->v;
  int *clock = loom_xmalloc((size_t)p * p * sizeof *clock, "vector clocks"); /* [r][q]: q's last action r knows of */
  int **carried = loom_xcalloc((size_t)messages, sizeof *carried, "message clocks");
  int *recv_at = loom_xmalloc((size_t)messages * sizeof *recv_at, "message receipts");
  int *pos = loom_xcalloc((size_t)p, sizeof *pos, "replay positions");
  int **pending = loom_xcalloc((size_t)p, sizeof *pending, "sends in flight"); /* [r]: indices of sends not yet released */
  int *npending = loom_xcalloc((size_t)p, sizeof *npending, "sends in flight");
  for (int i = 0; i < p * p; i++) clock[i] = -1;
  for (int i = 0; i < messages; i++) recv_at[i] = -1;
  for (int r = 0; r < p; r++) pending[r] = loom_xmalloc(((size_t)s->count[r] + 1) * sizeof **pending, "sends in flight");
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; r++) {
      int *mine = clock + (size_t)r * p;
      for (; pos[r] < s->count[r]; pos[r]++) {
        const int i = pos[r];
        const loom_action *a = &s->actions[r][i];
        if (is_recv(a)) {
          const int k = message_of(s, r, a);
          if (!carried[k]) break; /* waits for its send */
          for (int q = 0; q < p; q++) mine[q] = carried[k][q] > mine[q] ? carried[k][q] : mine[q];
          free(carried[k]);
          carried[k] = NULL;
          recv_at[k] = i;
        }
        mine[r] = i;
        if (is_send(a)) {
          const int k = message_of(s, r, a);
          carried[k] = loom_xmalloc((size_t)p * sizeof **carried, "message clock");
          memcpy(carried[k], mine, (size_t)p * sizeof *mine);
          pending[r][npending[r]++] = i;
        }
        int kept = 0;
        for (int j = 0; j < npending[r]; j++) {
          const loom_action *send = &s->actions[r][pending[r][j]];
          const int k = message_of(s, r, send);
          if (recv_at[k] >= 0 && mine[send->peer] >= recv_at[k]) release[r][pending[r][j]] = i;
          else pending[r][kept++] = pending[r][j];
        }
        npending[r] = kept;
        progress = true;
      }
    }
  }
  for (int r = 0; r < p; r++) { /* what no message proves received goes back after the rank's last action */
    for (int j = 0; j < npending[r]; j++) release[r][pending[r][j]] = s->count[r] - 1;
    free(pending[r]);
  }
  for (int i = 0; i < messages; i++) free(carried[i]); /* a schedule the verifier will refuse may leave some */
  free(clock), free(carried), free(recv_at), free(pos), free(pending), free(npending);
}

/* Rank r's events, action by action: counted (out NULL) or written. */
static int rank_events(const loom_schedule *s, int r, const int *first, const int *last, const int *released,
                       const int *next_released, int *event_at, loom_buffer_event *out) {
  const loom_action *acts = s->actions[r];
  int n = 0;
#define EVENT(kind_, acquire_, a_) \
  do { \
    if (out) out[n] = (loom_buffer_event){kind_, acquire_, (a_)->mb, (a_)->chunk, (a_)->kind == LOOM_ACT_SEND_GRAD}; \
    n++; \
  } while (0)
  for (int i = 0; i < s->count[r]; i++) {
    const loom_action *a = &acts[i];
    if (event_at) event_at[i] = n;
    const int key = a->mb >= 0 ? a->mb * s->v + a->chunk : -1;
    if (loom_action_uses(a, LOOM_BUFFER_SLOT) && first[key] == i) EVENT(LOOM_BUFFER_SLOT, true, a);
    if (a->kind == LOOM_ACT_BACKWARD_INPUT) EVENT(LOOM_BUFFER_WSTATE, true, a);
    if (is_send(a)) EVENT(LOOM_BUFFER_SEND, true, a);
    if (loom_action_uses(a, LOOM_BUFFER_SLOT) && last[key] == i) EVENT(LOOM_BUFFER_SLOT, false, a);
    if (a->kind == LOOM_ACT_BACKWARD_WEIGHT) EVENT(LOOM_BUFFER_WSTATE, false, a);
    for (int j = released[i]; j >= 0; j = next_released[j]) EVENT(LOOM_BUFFER_SEND, false, &acts[j]);
  }
#undef EVENT
  if (event_at) event_at[s->count[r]] = n;
  return n;
}

/* Emits every rank's buffer events (see loom_buffer_event). */
static void annotate(loom_schedule *s) {
  s->event_at = loom_xcalloc((size_t)s->p, sizeof *s->event_at, "buffer events");
  s->events = loom_xcalloc((size_t)s->p, sizeof *s->events, "buffer events");
  int **release = loom_xcalloc((size_t)s->p, sizeof *release, "send releases");
  for (int r = 0; r < s->p; r++) {
    release[r] = loom_xmalloc(((size_t)s->count[r] + 1) * sizeof **release, "send releases");
    for (int i = 0; i < s->count[r]; i++) release[r][i] = -1;
  }
  place_send_releases(s, release);
  const size_t keys = (size_t)s->m * s->v;
  int *first = loom_xmalloc(keys * sizeof *first, "slot lifetimes"), *last = loom_xmalloc(keys * sizeof *last, "slot lifetimes");
  for (int r = 0; r < s->p; r++) {
    /* The sends given back after action i: released[i], then next_released[...] (-1 ends). */
    int *released = loom_xmalloc(((size_t)s->count[r] + 1) * sizeof *released, "send releases");
    int *next_released = loom_xmalloc(((size_t)s->count[r] + 1) * sizeof *next_released, "send releases");
    for (int i = 0; i < s->count[r]; i++) released[i] = -1;
    for (int j = s->count[r] - 1; j >= 0; j--)
      if (release[r][j] >= 0) next_released[j] = released[release[r][j]], released[release[r][j]] = j;
    for (size_t k = 0; k < keys; k++) first[k] = last[k] = -1;
    for (int i = 0; i < s->count[r]; i++) {
      const loom_action *a = &s->actions[r][i];
      if (!loom_action_uses(a, LOOM_BUFFER_SLOT)) continue;
      const int key = a->mb * s->v + a->chunk;
      if (first[key] < 0) first[key] = i;
      last[key] = i;
    }
    const int n = rank_events(s, r, first, last, released, next_released, NULL, NULL);
    s->event_at[r] = loom_xmalloc(((size_t)s->count[r] + 1) * sizeof **s->event_at, "buffer events");
    s->events[r] = loom_xmalloc((size_t)(n > 0 ? n : 1) * sizeof **s->events, "buffer events");
    rank_events(s, r, first, last, released, next_released, s->event_at[r], s->events[r]);
    free(release[r]), free(released), free(next_released);
  }
  free(release), free(first), free(last);
}

static void events_free(loom_schedule *s) {
  for (int r = 0; s->events && r < s->p; r++) {
    free(s->events[r]);
    free(s->event_at[r]);
  }
  free(s->events);
  free(s->event_at);
  s->events = NULL;
  s->event_at = NULL;
}

void loom_schedule_untie(loom_schedule *s) {
  for (int r = 0; r < s->p; r++) {
    int kept = 0;
    for (int i = 0; i < s->count[r]; i++)
      if (s->actions[r][i].kind != LOOM_ACT_REDUCE_TIED) s->actions[r][kept++] = s->actions[r][i];
    s->count[r] = kept;
  }
  events_free(s);
  annotate(s);
}

int loom_schedule_shape_problem(loom_schedule_kind kind, int p, int v, int m, char *why, size_t n) {
  if (p < 1) snprintf(why, n, "parallel.pp = %d: must be at least 1", p);
  else if (v < 1) snprintf(why, n, "parallel.virtual_chunks = %d: must be at least 1", v);
  else if (m < 1) snprintf(why, n, "micro-batches = %d: a step needs at least 1", m);
  else if (!known(kind)) snprintf(why, n, "schedule = %d: not a schedule kind this loom knows", (int)kind);
  else if (kind == LOOM_SCHEDULE_ZB_V && v != 2)
    snprintf(why, n, "parallel.virtual_chunks = %d: schedule = zb_v runs two chunks per rank (a V); set parallel.virtual_chunks = 2", v);
  else if (kind != LOOM_SCHEDULE_INTERLEAVED && kind != LOOM_SCHEDULE_FORWARD_ONLY && kind != LOOM_SCHEDULE_ZB_V && v != 1)
    snprintf(why, n, "parallel.virtual_chunks = %d: needs schedule = interleaved (or zb_v with 2); %s runs one chunk per rank", v,
             loom_schedule_kind_name(kind));
  else if (kind == LOOM_SCHEDULE_INTERLEAVED && m % p != 0)
    snprintf(why, n, "micro-batches = %d: not a multiple of parallel.pp (%d); the interleaved schedule moves micro-batches "
             "through the chunks in groups of pp", m, p);
  else return 0;
  return -1;
}

/* Checks the shape and sets s up for its p ranks' orders, none built yet. */
static loom_status begin(loom_schedule *s, loom_schedule_kind kind, bool v_shape, int p, int v, int m, loom_error *err) {
  memset(s, 0, sizeof *s);
  char why[sizeof err->msg];
  if (loom_schedule_shape_problem(kind, p, v, m, why, sizeof why)) return loom_fail(err, LOOM_ERR_USAGE, "%s", why);
  s->kind = kind;
  s->v_shape = v_shape;
  s->p = p;
  s->v = v;
  s->m = m;
  s->count = calloc((size_t)p, sizeof *s->count);
  s->actions = calloc((size_t)p, sizeof *s->actions);
  LOOM_CHECK(s->count && s->actions, "out of memory building a schedule");
  return LOOM_OK;
}

static loom_status build(loom_schedule *s, loom_schedule_kind kind, bool v_shape, int p, int v, int m, loom_error *err) {
  const loom_status st = begin(s, kind, v_shape, p, v, m, err);
  if (st != LOOM_OK) return st;
  for (int r = 0; r < p; r++) build_rank(s, r, NULL);
  annotate(s);
  return LOOM_OK;
}

loom_status loom_schedule_shape_peaks(loom_schedule_kind kind, int p, int v, int m, int *live, int *slots,
                                      int *deferred, int *sends, loom_error *err) {
  loom_schedule s;
  const bool v_shape = loom_schedule_kind_v_shape(kind);
  if ((int64_t)7 * p * v * m <= LOOM_SCHEDULE_BUILT_ACTIONS) { /* small enough to build: its events say */
    const loom_status st = build(&s, kind, v_shape, p, v, m, err);
    if (st != LOOM_OK) return st;
    for (int r = 0; r < p; r++) {
      const loom_schedule_peaks all = loom_schedule_rank_peaks(&s, r, -1);
      live[r] = all.live, sends[r] = all.sends;
      for (int c = 0; c < v; c++) {
        const loom_schedule_peaks one = loom_schedule_rank_peaks(&s, r, c);
        slots[r * v + c] = one.live, deferred[r * v + c] = one.deferred;
      }
    }
    loom_schedule_free(&s);
    return LOOM_OK;
  }
  return loom_schedule_counted_peaks(kind, p, v, m, live, slots, deferred, sends, err);
}

loom_status loom_schedule_counted_peaks(loom_schedule_kind kind, int p, int v, int m, int *live, int *slots,
                                        int *deferred, int *sends, loom_error *err) {
  loom_schedule s;
  const loom_status st = begin(&s, kind, loom_schedule_kind_v_shape(kind), p, v, m, err);
  if (st != LOOM_OK) return st;
  tally *tallies = loom_xmalloc((size_t)(1 + v) * sizeof *tallies, "schedule tallies");
  for (int r = 0; r < p; r++) { /* counted as built, never stored */
    for (int t = 0; t <= v; t++) tallies[t] = (tally){.forward_only = kind == LOOM_SCHEDULE_FORWARD_ONLY};
    build_rank(&s, r, tallies);
    live[r] = tallies[0].peak_live;
    for (int c = 0; c < v; c++) slots[r * v + c] = tallies[1 + c].peak_live, deferred[r * v + c] = tallies[1 + c].peak_waiting;
    sends[r] = loom_schedule_send_bound(kind, v, m, live[r]);
  }
  free(tallies);
  loom_schedule_free(&s);
  return LOOM_OK;
}

loom_status loom_schedule_build(loom_schedule *s, loom_schedule_kind kind, int p, int v, int m, loom_error *err) {
  return build(s, kind, loom_schedule_kind_v_shape(kind), p, v, m, err);
}

loom_status loom_schedule_build_eval(loom_schedule *s, loom_schedule_kind train_kind, int p, int v, int m,
                                     loom_error *err) {
  return build(s, LOOM_SCHEDULE_FORWARD_ONLY, loom_schedule_kind_v_shape(train_kind), p, v, m, err);
}

void loom_schedule_hold(const loom_schedule *s, int r, int i, bool acquire, int held[LOOM_BUFFER_KINDS]) {
  for (int e = s->event_at[r][i]; e < s->event_at[r][i + 1]; e++)
    if (s->events[r][e].acquire == acquire) held[s->events[r][e].kind] += acquire ? 1 : -1;
}

loom_schedule_peaks loom_schedule_rank_peaks(const loom_schedule *s, int r, int c) {
  int held[LOOM_BUFFER_KINDS] = {0}, peak[LOOM_BUFFER_KINDS] = {0};
  for (int i = 0; i < s->count[r]; i++) {
    for (int e = s->event_at[r][i]; e < s->event_at[r][i + 1]; e++) { /* acquires, then releases */
      const loom_buffer_event *x = &s->events[r][e];
      if (c >= 0 && x->chunk != c) continue;
      held[x->kind] += x->acquire ? 1 : -1;
      if (held[x->kind] > peak[x->kind]) peak[x->kind] = held[x->kind];
    }
  }
  return (loom_schedule_peaks){peak[LOOM_BUFFER_SLOT], peak[LOOM_BUFFER_WSTATE], peak[LOOM_BUFFER_SEND]};
}

void loom_schedule_free(loom_schedule *s) {
  events_free(s);
  for (int r = 0; s->actions && r < s->p; r++) free(s->actions[r]);
  free(s->actions);
  free(s->count);
  memset(s, 0, sizeof *s);
}

/* A message needs a reply to be proven received: a forward-only pass over
 * one chunk per rank gets none, so its sends are held to the end; a
 * training rank's replies come within two of its live micro-batches. */
int loom_schedule_send_bound(loom_schedule_kind kind, int v, int m, int live) {
  return kind == LOOM_SCHEDULE_FORWARD_ONLY && v == 1 ? m : 2 * live + 1;
}
