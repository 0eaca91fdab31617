/* Schedule generators: GPipe, 1F1B (PipeDream-Flush) and Megatron's
 * interleaved 1F1B. Each kind fixes an order of forward and backward passes
 * per rank; the transfers around them follow from the stage graph. */
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

int loom_schedule_kind_parse(const char *name, loom_schedule_kind *kind) {
  load_names();
  for (int k = 0; k < MAX_KINDS; k++)
    if (g_names[k][0] && strcmp(name, g_names[k]) == 0) {
      *kind = (loom_schedule_kind)k;
      return 0;
    }
  return -1;
}

bool loom_schedule_kind_trains(loom_schedule_kind kind) { return kind != LOOM_SCHEDULE_FORWARD_ONLY; }

const char *const *loom_schedule_train_kind_names(void) {
  load_names();
  return g_train_names;
}

const char *loom_action_name(loom_action_kind kind) {
  static const char *const NAMES[] = {"forward", "backward", "recv activation", "send activation", "recv grad",
                                      "send grad", "reduce tied embedding grads", "reduce data-parallel grads",
                                      "optimizer step"};
  return NAMES[kind];
}

typedef struct {
  loom_action *list;
  int count, cap;
} action_list;

static void push(action_list *l, loom_action_kind kind, int mb, int chunk, int peer) {
  if (l->count == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 64;
    l->list = realloc(l->list, (size_t)l->cap * sizeof *l->list);
    LOOM_CHECK(l->list != NULL, "out of memory building a schedule");
  }
  l->list[l->count++] = (loom_action){kind, mb, chunk, peer};
}

/* A compute step of a rank's order: forward or backward of (mb, chunk). */
typedef struct {
  int backward, mb, chunk;
} compute;

/* Appends one compute step with the transfers it needs: its input is
 * received first, its output sent right after. */
static void emit(action_list *l, const loom_schedule *s, int r, compute c) {
  const int S = s->p * s->v, stage = loom_virtual_stage(s, r, c.chunk);
  const int prev = (r + s->p - 1) % s->p, next = (r + 1) % s->p;
  if (!c.backward) {
    if (stage > 0) push(l, LOOM_ACT_RECV_ACT, c.mb, c.chunk, prev);
    push(l, LOOM_ACT_FORWARD, c.mb, c.chunk, -1);
    if (stage < S - 1) push(l, LOOM_ACT_SEND_ACT, c.mb, c.chunk, next);
  } else {
    if (stage < S - 1) push(l, LOOM_ACT_RECV_GRAD, c.mb, c.chunk, next);
    push(l, LOOM_ACT_BACKWARD, c.mb, c.chunk, -1);
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
  return (compute){backward, k / (s->p * s->v) * s->p + k % s->p, chunk};
}

/* Forward-count before the first backward on rank r. */
static int warmup(const loom_schedule *s, int r) {
  const int total = s->m * s->v;
  int w;
  switch (s->kind) {
  case LOOM_SCHEDULE_GPIPE: w = total; break;
  case LOOM_SCHEDULE_1F1B: w = s->p - r - 1; break;
  default: w = (s->p - r - 1) * 2 + (s->v - 1) * s->p; break;
  }
  return w < total ? w : total;
}

/* Forward-only: micro-batch by micro-batch through this rank's chunks. */
static void build_forward_only(loom_schedule *s, int r) {
  action_list l = {0};
  for (int mb = 0; mb < s->m; mb++)
    for (int c = 0; c < s->v; c++) emit(&l, s, r, (compute){0, mb, c});
  s->actions[r] = l.list;
  s->count[r] = l.count;
}

static void build_rank(loom_schedule *s, int r) {
  if (s->kind == LOOM_SCHEDULE_FORWARD_ONLY) {
    build_forward_only(s, r);
    return;
  }
  action_list l = {0};
  const int total = s->m * s->v, w = warmup(s, r), steady = total - w;
  for (int k = 0; k < w; k++) emit(&l, s, r, nth(s, k, 0));
  for (int i = 0; i < steady; i++) {
    emit(&l, s, r, nth(s, w + i, 0));
    emit(&l, s, r, nth(s, i, 1));
  }
  for (int i = steady; i < total; i++) emit(&l, s, r, nth(s, i, 1));
  /* The tied wte lives on stage 0 (rank 0) and stage S-1 (rank p-1); with one
   * stage there is nothing to tie. */
  const int S = s->p * s->v;
  if (S > 1 && (r == 0 || r == s->p - 1)) push(&l, LOOM_ACT_REDUCE_TIED, -1, -1, r == 0 ? s->p - 1 : 0);
  push(&l, LOOM_ACT_REDUCE_DP, -1, -1, -1);
  push(&l, LOOM_ACT_OPTIMIZER_STEP, -1, -1, -1);
  s->actions[r] = l.list;
  s->count[r] = l.count;
}

void loom_schedule_untie(loom_schedule *s) {
  for (int r = 0; r < s->p; r++) {
    int kept = 0;
    for (int i = 0; i < s->count[r]; i++)
      if (s->actions[r][i].kind != LOOM_ACT_REDUCE_TIED) s->actions[r][kept++] = s->actions[r][i];
    s->count[r] = kept;
  }
}

loom_status loom_schedule_build(loom_schedule *s, loom_schedule_kind kind, int p, int v, int m, loom_error *err) {
  memset(s, 0, sizeof *s);
  if (p < 1) return loom_fail(err, LOOM_ERR_USAGE, "--pp must be at least 1 (got %d)", p);
  if (m < 1) return loom_fail(err, LOOM_ERR_USAGE, "--micro-batches must be at least 1 (got %d)", m);
  if (v < 1) return loom_fail(err, LOOM_ERR_USAGE, "--vpp must be at least 1 (got %d)", v);
  if (!known(kind))
    return loom_fail(err, LOOM_ERR_USAGE, "schedule kind %d is not one this loom knows", (int)kind);
  if (kind != LOOM_SCHEDULE_INTERLEAVED && kind != LOOM_SCHEDULE_FORWARD_ONLY && v != 1)
    return loom_fail(err, LOOM_ERR_USAGE, "--vpp %d needs --schedule interleaved; %s runs one chunk per rank", v,
                     loom_schedule_kind_name(kind));
  if (kind == LOOM_SCHEDULE_INTERLEAVED && m % p != 0)
    return loom_fail(err, LOOM_ERR_USAGE,
                     "--micro-batches %d is not a multiple of --pp %d; the interleaved schedule moves micro-batches "
                     "through the chunks in groups of pp", m, p);
  s->kind = kind;
  s->p = p;
  s->v = v;
  s->m = m;
  s->count = calloc((size_t)p, sizeof *s->count);
  s->actions = calloc((size_t)p, sizeof *s->actions);
  LOOM_CHECK(s->count && s->actions, "out of memory building a schedule");
  for (int r = 0; r < p; r++) build_rank(s, r);
  return LOOM_OK;
}

int loom_schedule_chunk_peak(const loom_schedule *s, int r, int c) {
  int live = 0, peak = 0;
  for (int i = 0; i < s->count[r]; i++) {
    const loom_action *a = &s->actions[r][i];
    if (a->chunk != c) continue;
    if (a->kind == LOOM_ACT_FORWARD) live++;
    if (a->kind == LOOM_ACT_BACKWARD) live--;
    if (live > peak) peak = live;
    if (a->kind == LOOM_ACT_FORWARD && s->kind == LOOM_SCHEDULE_FORWARD_ONLY) live--; /* no backward holds it */
  }
  return peak;
}

void loom_schedule_free(loom_schedule *s) {
  for (int r = 0; s->actions && r < s->p; r++) free(s->actions[r]);
  free(s->actions);
  free(s->count);
  memset(s, 0, sizeof *s);
}
