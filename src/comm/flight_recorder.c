/* The flight recorder (see flight_recorder.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "comm/comm.h"
#include "comm/flight_recorder.h"
#include "core/fault.h"

const char *const LOOM_FLIGHT_KIND_NAMES[LOOM_FLIGHT_KINDS] = {
    [LOOM_FLIGHT_ALLREDUCE] = "all-reduce", [LOOM_FLIGHT_ALLGATHER] = "all-gather",
    [LOOM_FLIGHT_REDUCE_SCATTER] = "reduce-scatter", [LOOM_FLIGHT_BROADCAST] = "broadcast",
    [LOOM_FLIGHT_ALLTOALLV] = "all-to-all", [LOOM_FLIGHT_BARRIER] = "barrier", [LOOM_FLIGHT_SEND] = "send",
    [LOOM_FLIGHT_RECV] = "recv"};

typedef struct {
  int64_t seq, bytes, step;
  int group; /* index into g_groups */
  int32_t kind, peer;
  double start, end; /* end 0: not completed */
} entry;

/* The groups seen, by communicator: their names and how many operations this rank posted on each. */
enum { MAX_GROUPS = 64, MAX_PENDING = 4096 };
typedef struct {
  const loom_comm *c;
  char name[16];
  int leader, size;
  int64_t posted;
} group;

static entry *g_ring;
static int64_t g_cap, g_next;
static group g_groups[MAX_GROUPS];
static int g_ngroups;
static char g_dir[4096];
static int64_t g_step;
static bool g_skipped;
static int64_t g_step_collectives; /* collectives begun in this step so far */
static struct {
  loom_request *r;
  int64_t slot;
} g_pending[MAX_PENDING];

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void loom_flight_configure(int entries, const char *dir) {
  free(g_ring);
  g_ring = entries > 0 ? calloc((size_t)entries, sizeof *g_ring) : NULL;
  g_cap = g_ring ? entries : 0;
  g_next = 0;
  g_ngroups = 0;
  snprintf(g_dir, sizeof g_dir, "%s", dir ? dir : "");
}

void loom_flight_set_step(int64_t step) {
  g_step = step;
  g_step_collectives = 0;
}

static int group_of(const loom_comm *c) {
  for (int i = g_ngroups - 1; i >= 0; i--)
    if (g_groups[i].c == c) return i;
  if (g_ngroups == MAX_GROUPS) return -1;
  group *g = &g_groups[g_ngroups];
  *g = (group){.c = c, .leader = c->leader, .size = c->size};
  snprintf(g->name, sizeof g->name, "%s", c->name);
  return g_ngroups++;
}

int64_t loom_flight_begin(loom_comm *c, loom_flight_kind kind, size_t bytes, int peer) {
  /* A planted fault: the rank skips its Nth collective of the step (the fault's argument, 1 without one), as a bug
   * on one rank would. */
  double nth;
  if (kind < LOOM_FLIGHT_SEND && !g_skipped && loom_fault_fires(LOOM_FAULT_SKIP_COLLECTIVE, g_step, &nth) &&
      ++g_step_collectives == (nth >= 1 ? (int64_t)nth : 1)) {
    g_skipped = true;
    return LOOM_FLIGHT_SKIP;
  }
  if (!g_ring) return LOOM_FLIGHT_NONE;
  const int gi = group_of(c);
  if (gi < 0) return LOOM_FLIGHT_NONE;
  const int64_t slot = g_next++;
  g_ring[slot % g_cap] = (entry){.seq = ++g_groups[gi].posted, .bytes = (int64_t)bytes, .step = g_step, .group = gi,
                                 .kind = kind, .peer = peer, .start = now_s()};
  return slot;
}

void loom_flight_end(int64_t slot) {
  if (slot >= 0 && g_ring && slot >= g_next - g_cap) g_ring[slot % g_cap].end = now_s();
}

void loom_flight_pending(loom_request *r, int64_t slot) {
  if (!r || slot < 0) return;
  for (int i = 0; i < MAX_PENDING; i++)
    if (!g_pending[i].r) {
      g_pending[i].r = r, g_pending[i].slot = slot;
      return;
    }
}

void loom_flight_completed(loom_request *r) {
  if (!r || !g_ring) return;
  for (int i = 0; i < MAX_PENDING; i++)
    if (g_pending[i].r == r) {
      loom_flight_end(g_pending[i].slot);
      g_pending[i].r = NULL;
      return;
    }
}

void loom_flight_summarize(loom_flight_summary *out) {
  memset(out, 0, sizeof *out);
  /* The groups used last come first: a hang is in the latest operations. */
  for (int64_t s = g_next - 1; g_ring && s >= 0 && s >= g_next - g_cap; s--) {
    const entry *e = &g_ring[s % g_cap];
    const group *g = &g_groups[e->group];
    int k = 0;
    while (k < out->groups && !(strcmp(out->g[k].name, g->name) == 0 && out->g[k].leader == g->leader)) k++;
    if (k == out->groups) {
      if (out->groups == LOOM_FLIGHT_GROUPS) continue;
      loom_flight_group *fg = &out->g[out->groups++];
      snprintf(fg->name, sizeof fg->name, "%s", g->name);
      fg->leader = g->leader, fg->size = g->size, fg->posted = g->posted;
    }
    loom_flight_group *fg = &out->g[k];
    int free_at = -1; /* filled newest last: shift toward the front */
    for (int j = LOOM_FLIGHT_LAST - 1; j >= 0 && free_at < 0; j--)
      if (fg->last[j].seq == 0) free_at = j;
    if (free_at < 0) continue;
    fg->last[free_at] = (loom_flight_op){.seq = e->seq, .bytes = e->bytes, .step = e->step, .kind = e->kind,
                                         .peer = e->peer, .done = e->end > 0, .start = e->start};
  }
}

bool loom_flight_dump(int world_rank) {
  if (!g_ring || !g_dir[0]) return false;
  char path[4200];
  snprintf(path, sizeof path, "%s/flight_rank_%05d.json", g_dir, world_rank);
  FILE *fp = fopen(path, "w");
  if (!fp) return false;
  fprintf(fp, "{\"rank\": %d, \"entries\": [", world_rank);
  const int64_t first = g_next > g_cap ? g_next - g_cap : 0;
  for (int64_t s = first; s < g_next; s++) {
    const entry *e = &g_ring[s % g_cap];
    const group *g = &g_groups[e->group];
    fprintf(fp, "%s\n  {\"group\": \"%s\", \"leader\": %d, \"size\": %d, \"seq\": %lld, \"kind\": \"%s\", \"bytes\": %lld, "
            "\"peer\": %d, \"step\": %lld, \"start\": %.6f, \"end\": ", s > first ? "," : "", g->name, g->leader, g->size,
            (long long)e->seq, LOOM_FLIGHT_KIND_NAMES[e->kind], (long long)e->bytes, e->peer, (long long)e->step, e->start);
    if (e->end > 0) fprintf(fp, "%.6f}", e->end);
    else fprintf(fp, "null}");
  }
  fprintf(fp, "\n]}\n");
  return fclose(fp) == 0;
}

/* An operation some ranks of a group posted and others did not, or posted differently. */
typedef struct {
  bool found;
  double start;
  char line[1024];
} finding;

static void describe_op(char *out, size_t len, const loom_flight_op *op) {
  const double b = (double)op->bytes;
  char size[32];
  if (b >= 1 << 20) snprintf(size, sizeof size, "%.1f MiB", b / (1 << 20));
  else if (b >= 1 << 10) snprintf(size, sizeof size, "%.1f KiB", b / (1 << 10));
  else snprintf(size, sizeof size, "%.0f B", b);
  if (op->peer >= 0) snprintf(out, len, "%s of %s with group rank %d at step %lld", LOOM_FLIGHT_KIND_NAMES[op->kind], size,
                              op->peer, (long long)op->step);
  else snprintf(out, len, "%s of %s at step %lld", LOOM_FLIGHT_KIND_NAMES[op->kind], size, (long long)op->step);
}

static const loom_flight_op *op_at(const loom_flight_group *g, int64_t seq) {
  for (int j = 0; j < LOOM_FLIGHT_LAST; j++)
    if (g->last[j].seq == seq) return &g->last[j];
  return NULL;
}

/* Appends "rank a, b, c" for the ranks r of list (n of them). */
static size_t list(char *out, size_t len, const int *ranks, int n) {
  size_t at = 0;
  for (int i = 0; i < n && at < len; i++)
    at += (size_t)snprintf(out + at, len - at, "%s%d", i ? ", " : (n == 1 ? "rank " : "ranks "), ranks[i]);
  return at;
}

static void consider(finding *best, double start, const char *line) {
  if (best->found && best->start <= start) return;
  best->found = true, best->start = start;
  snprintf(best->line, sizeof best->line, "%s", line);
}

/* One group as one rank reported it: the groups of every rank, sorted, put each group's members side by side. */
typedef struct {
  const loom_flight_group *g;
  int rank;
} membership;

static int by_group(const loom_flight_group *x, const loom_flight_group *y) {
  const int name = strcmp(x->name, y->name);
  return name ? name : (x->leader > y->leader) - (x->leader < y->leader);
}

static int by_group_then_rank(const void *a, const void *b) {
  const membership *x = a, *y = b;
  const int group = by_group(x->g, y->g);
  return group ? group : x->rank - y->rank;
}

bool loom_flight_disagreement(const loom_flight_summary *all, int world, char *line, size_t len) {
  finding best = {0};
  size_t total = 0;
  for (int r = 0; r < world; r++) total += all[r].groups > 0 ? (size_t)all[r].groups : 0;
  membership *every = malloc((total + 1) * sizeof *every);
  const loom_flight_group **member = malloc((total + 1) * sizeof *member);
  int *ranks = malloc((total + 1) * sizeof *ranks), *posted = malloc((total + 1) * sizeof *posted),
      *never = malloc((total + 1) * sizeof *never);
  size_t n = 0;
  for (int r = 0; every && r < world; r++)
    for (int k = 0; k < all[r].groups; k++) every[n++] = (membership){&all[r].g[k], r};
  if (every && member && ranks && posted && never) qsort(every, n, sizeof *every, by_group_then_rank);
  else n = 0;
  for (size_t at = 0, next; at < n; at = next) {
    const loom_flight_group *g = every[at].g;
    int m = 0;
    for (next = at; next < n && by_group(g, every[next].g) == 0; next++)
      member[m] = every[next].g, ranks[m++] = every[next].rank;
    int64_t lowest = member[0]->posted;
    for (int i = 1; i < m; i++) lowest = member[i]->posted < lowest ? member[i]->posted : lowest;
    char text[1024], what[256];
    /* Operations posted by some and not by others: the first such is one past the fewest posted. */
    const loom_flight_op *op = NULL;
    int np = 0, nn = 0;
    for (int i = 0; i < m; i++) {
      if (member[i]->posted > lowest) posted[np++] = ranks[i];
      else never[nn++] = ranks[i];
      if (!op && member[i]->posted > lowest) op = op_at(member[i], lowest + 1);
    }
    if (np && op) {
      describe_op(what, sizeof what, op);
      size_t at = (size_t)snprintf(text, sizeof text, "%s group (leader rank %d, %d ranks) operation #%lld, %s: posted by ",
                                   g->name, g->leader, g->size, (long long)(lowest + 1), what);
      at += list(text + at, sizeof text - at, posted, np);
      at += (size_t)snprintf(text + at, sizeof text - at, "; never by ");
      at += list(text + at, sizeof text - at, never, nn);
      snprintf(text + at, sizeof text - at, " (%s last posted #%lld there)", nn == 1 ? "whose" : "which", (long long)lowest);
      consider(&best, op->start, text);
    }
    /* The same place in the sequence, different operations. */
    for (int64_t seq = lowest; seq > 0 && seq > lowest - LOOM_FLIGHT_LAST; seq--) {
      const loom_flight_op *a = op_at(member[0], seq);
      for (int i = 1; a && i < m; i++) {
        const loom_flight_op *b = op_at(member[i], seq);
        if (!b || (a->kind == b->kind && a->bytes == b->bytes)) continue;
        char wa[256], wb[256];
        describe_op(wa, sizeof wa, a);
        describe_op(wb, sizeof wb, b);
        snprintf(text, sizeof text, "%s group (leader rank %d, %d ranks) operation #%lld: rank %d posted %s, rank %d %s",
                 g->name, g->leader, g->size, (long long)seq, ranks[0], wa, ranks[i], wb);
        consider(&best, a->start < b->start ? a->start : b->start, text);
      }
    }
  }
  free(every);
  free(member);
  free(ranks);
  free(posted);
  free(never);
  if (best.found) snprintf(line, len, "%s", best.line);
  return best.found;
}
