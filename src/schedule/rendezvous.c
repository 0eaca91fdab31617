/* Rendezvous transfers, replayed (see rendezvous.h). */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include "core/check.h"
#include "schedule/rendezvous.h"

typedef struct {
  int msg, group, next; /* next: the following transfer of its group, -1 at the end */
  int chan, side, k;    /* posted k-th on its channel's send (0) or recv (1) side */
  double ready;         /* when its group started on its stream, -1 before */
  double done;          /* when it met its other end, -1 before */
  double flight;        /* a send's: how long its data takes once met */
} transfer;

typedef struct {
  int stream, first, last, count, met;
  int next;     /* the next group on its stream, -1 if none yet */
  bool closed;  /* handed to the stream */
  double close; /* when */
  double start; /* when it began on its stream: closed, and the group before it ended */
} group;

typedef struct {
  int head, tail; /* its groups still to run, as a list; -1 if none */
  int open;       /* the group still being queued (shared stream), -1 if none */
} stream;

struct loom_rendezvous {
  const loom_schedule *s;
  const loom_send_model *model;
  double *arrival;
  int nchan;
  int64_t *chan_key;     /* [nchan] sorted */
  int *start[2];         /* [nchan + 1] offsets of each channel's sends (0) and recvs (1) */
  int *posted[2];        /* [nchan] how many of each are posted */
  int *slot[2];          /* [total] the transfer posted k-th on each channel side */
  transfer *t;           /* [total] */
  int nt;
  group *g;              /* [total] */
  int ng;
  stream *st;            /* [streams] */
  int *work;             /* [total] groups to start */
  int nwork;
};

static bool is_transfer(const loom_action *a) {
  return a->kind == LOOM_ACT_SEND_ACT || a->kind == LOOM_ACT_SEND_GRAD || a->kind == LOOM_ACT_RECV_ACT ||
         a->kind == LOOM_ACT_RECV_GRAD;
}
static bool is_send(const loom_action *a) { return a->kind == LOOM_ACT_SEND_ACT || a->kind == LOOM_ACT_SEND_GRAD; }
static bool is_grad(const loom_action *a) { return a->kind == LOOM_ACT_SEND_GRAD || a->kind == LOOM_ACT_RECV_GRAD; }

/* The channel of a transfer from src to dst: the ordered pair, and its kind where the model splits kinds. */
static int64_t key_of(const loom_rendezvous *x, int src, int dst, bool grad) {
  return ((int64_t)src * x->s->p + dst) * 2 + (x->model->by_kind && grad ? 1 : 0);
}
static int cmp_key(const void *a, const void *b) {
  const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}
static int channel_of(const loom_rendezvous *x, int64_t key) {
  const int64_t *hit = bsearch(&key, x->chan_key, (size_t)x->nchan, sizeof key, cmp_key);
  LOOM_CHECK(hit != NULL, "a transfer on a channel the schedule does not have");
  return (int)(hit - x->chan_key);
}
/* The two ends of action a on rank r with this peer. */
static void ends(const loom_action *a, int r, int peer, int *src, int *dst) {
  *src = is_send(a) ? r : peer;
  *dst = is_send(a) ? peer : r;
}

/* The channel key of rank r's action a, if it is a transfer that travels (else false). */
static bool travelling(const loom_rendezvous *x, int r, const loom_action *a, int64_t *key) {
  if (!is_transfer(a) || a->peer < 0 || a->peer >= x->s->p || !loom_send_travels(x->model, r, a->peer)) return false;
  int src, dst;
  ends(a, r, a->peer, &src, &dst);
  *key = key_of(x, src, dst, is_grad(a));
  return true;
}

loom_rendezvous *loom_rendezvous_new(const loom_schedule *s, const loom_send_model *model, double *arrival) {
  loom_rendezvous *x = loom_xcalloc(1, sizeof *x, "rendezvous replay");
  x->s = s, x->model = model, x->arrival = arrival;
  int total = 0;
  for (int r = 0; r < s->p; r++)
    for (int i = 0; i < s->count[r]; i++) total += is_transfer(&s->actions[r][i]) && s->actions[r][i].peer >= 0;
  const size_t n = (size_t)(total > 0 ? total : 1);
  x->chan_key = loom_xmalloc(n * sizeof *x->chan_key, "rendezvous replay");
  for (int r = 0; r < s->p; r++)
    for (int i = 0; i < s->count[r]; i++) {
      int64_t key;
      if (travelling(x, r, &s->actions[r][i], &key)) x->chan_key[x->nchan++] = key;
    }
  qsort(x->chan_key, (size_t)x->nchan, sizeof *x->chan_key, cmp_key);
  int unique = 0;
  for (int i = 0; i < x->nchan; i++)
    if (unique == 0 || x->chan_key[unique - 1] != x->chan_key[i]) x->chan_key[unique++] = x->chan_key[i];
  x->nchan = unique;
  for (int side = 0; side < 2; side++) {
    x->start[side] = loom_xcalloc((size_t)x->nchan + 1, sizeof(int), "rendezvous replay");
    x->posted[side] = loom_xcalloc((size_t)x->nchan + 1, sizeof(int), "rendezvous replay");
    x->slot[side] = loom_xmalloc(n * sizeof(int), "rendezvous replay");
  }
  /* Each channel side's capacity: the transfers the schedule names on it. */
  for (int r = 0; r < s->p; r++)
    for (int i = 0; i < s->count[r]; i++) {
      int64_t key;
      if (travelling(x, r, &s->actions[r][i], &key)) x->start[is_send(&s->actions[r][i]) ? 0 : 1][channel_of(x, key) + 1]++;
    }
  for (int side = 0; side < 2; side++)
    for (int c = 0; c < x->nchan; c++) x->start[side][c + 1] += x->start[side][c];
  x->t = loom_xmalloc(n * sizeof *x->t, "rendezvous replay");
  x->g = loom_xmalloc(n * sizeof *x->g, "rendezvous replay");
  x->work = loom_xmalloc(n * sizeof *x->work, "rendezvous replay");
  const int streams = model->shared_stream ? s->p : 2 * (x->nchan > 0 ? x->nchan : 1);
  x->st = loom_xmalloc((size_t)streams * sizeof *x->st, "rendezvous replay");
  for (int i = 0; i < streams; i++) x->st[i] = (stream){-1, -1, -1};
  return x;
}

void loom_rendezvous_free(loom_rendezvous *x) {
  if (!x) return;
  for (int side = 0; side < 2; side++) free(x->start[side]), free(x->posted[side]), free(x->slot[side]);
  free(x->chan_key);
  free(x->t);
  free(x->g);
  free(x->st);
  free(x->work);
  free(x);
}

/* The transfer at the other end of transfer i, or -1 while that is unposted. */
static int other_end(const loom_rendezvous *x, int i) {
  const transfer *t = &x->t[i];
  const int side = !t->side;
  return t->k < x->posted[side][t->chan] ? x->slot[side][x->start[side][t->chan] + t->k] : -1;
}

/* Transfers i and j, both on started groups, meet: both are done, and a
 * group all of whose transfers have met ends, which starts the next group
 * on its stream if that one is closed. */
static void meet(loom_rendezvous *x, int i, int j) {
  const transfer *send = x->t[i].side == 0 ? &x->t[i] : &x->t[j];
  const double t = (x->t[i].ready > x->t[j].ready ? x->t[i].ready : x->t[j].ready) + send->flight;
  x->t[i].done = x->t[j].done = t;
  x->arrival[x->t[i].msg] = t;
  const int both[2] = {i, j};
  for (int e = 0; e < 2; e++) {
    group *g = &x->g[x->t[both[e]].group];
    if (++g->met < g->count) continue;
    stream *st = &x->st[g->stream];
    st->head = g->next;
    if (st->head < 0) {
      st->tail = -1;
    } else if (x->g[st->head].closed) {
      group *next = &x->g[st->head];
      next->start = next->close > t ? next->close : t;
      x->work[x->nwork++] = st->head;
    }
  }
}

/* Starts the groups queued to start: each of their transfers is ready and
 * meets its other end where that is ready too. */
static void run(loom_rendezvous *x) {
  while (x->nwork > 0) {
    const group *g = &x->g[x->work[--x->nwork]];
    for (int i = g->first; i >= 0; i = x->t[i].next) {
      x->t[i].ready = g->start;
      const int j = other_end(x, i);
      if (j >= 0 && x->t[j].ready >= 0 && x->t[j].done < 0) meet(x, i, j);
    }
  }
}

/* Hands group gi to its stream at time t; it starts now if its stream has nothing before it. */
static void close_group(loom_rendezvous *x, int gi, double t) {
  group *g = &x->g[gi];
  g->closed = true;
  g->close = t;
  stream *st = &x->st[g->stream];
  if (st->open == gi) st->open = -1;
  if (st->head == gi) {
    g->start = t;
    x->work[x->nwork++] = gi;
    run(x);
  }
}

int loom_rendezvous_post(loom_rendezvous *x, int r, const loom_action *a, int peer, int msg, double t, double flight,
                         int *other) {
  int src, dst;
  ends(a, r, peer, &src, &dst);
  const int side = is_send(a) ? 0 : 1, c = channel_of(x, key_of(x, src, dst, is_grad(a)));
  const int k = x->posted[side][c];
  LOOM_CHECK(x->start[side][c] + k < x->start[side][c + 1], "more transfers on a channel than the schedule names");
  const int i = x->nt++;
  x->t[i] = (transfer){.msg = msg, .group = -1, .next = -1, .chan = c, .side = side, .k = k, .ready = -1, .done = -1,
                       .flight = side == 0 ? flight : 0.0};
  x->slot[side][x->start[side][c] + k] = i;
  x->posted[side][c]++;
  const int j = other_end(x, i);
  if (j >= 0 && x->t[j].msg != msg) {
    *other = x->t[j].msg;
    return -1;
  }
  /* Its stream: the rank's one, or its end of the channel. */
  const int si = x->model->shared_stream ? r : 2 * c + side;
  stream *st = &x->st[si];
  if (st->open < 0) {
    const int gi = x->ng++;
    x->g[gi] = (group){.stream = si, .first = -1, .last = -1, .next = -1, .start = -1};
    if (st->tail >= 0) x->g[st->tail].next = gi;
    else st->head = gi;
    st->tail = gi;
    st->open = gi;
  }
  group *g = &x->g[st->open];
  if (g->last >= 0) x->t[g->last].next = i;
  else g->first = i;
  g->last = i;
  g->count++;
  x->t[i].group = st->open;
  if (!x->model->shared_stream) close_group(x, st->open, t);
  return 0;
}

void loom_rendezvous_flush(loom_rendezvous *x, int r, double t) {
  if (x->model->shared_stream && x->st[r].open >= 0) close_group(x, x->st[r].open, t);
}
