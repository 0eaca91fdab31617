/* The fault registry: a short table of armed faults, matched by point, rank and step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/fault.h"

enum { MAX_FAULTS = 16, ANY = -1 };

typedef struct {
  loom_fault_point point;
  int64_t rank, step; /* ANY matches every value */
  double arg;
} armed_fault;

static const char *const g_names[LOOM_FAULT_COUNT] = {
    [LOOM_FAULT_SETUP] = "setup",     [LOOM_FAULT_STALL] = "stall",
    [LOOM_FAULT_NAN_GRAD] = "nan_grad", [LOOM_FAULT_SLOW] = "slow",
    [LOOM_FAULT_KILL_IN_SAVE] = "kill_in_save", [LOOM_FAULT_KILL_IN_STAGE] = "kill_in_stage",
    [LOOM_FAULT_KILL_IN_WRITE] = "kill_in_write", [LOOM_FAULT_ALLOC] = "alloc",
    [LOOM_FAULT_KILL] = "kill",       [LOOM_FAULT_SKIP_COLLECTIVE] = "skip_collective",
};

static armed_fault g_armed[MAX_FAULTS];
static int g_count, g_rank;
static _Atomic int64_t g_allocs; /* allocations through this registry since arming (a checkpoint writer thread's too) */

const char *loom_fault_name(loom_fault_point p) { return p >= 0 && p < LOOM_FAULT_COUNT ? g_names[p] : "?"; }

/* A rank or step field: `*`, or a whole number in [0, 2^62). */
static bool parse_field(const char *s, size_t n, int64_t *out) {
  if (n == 1 && s[0] == '*') {
    *out = ANY;
    return true;
  }
  if (n == 0 || n > 18) return false;
  int64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (s[i] - '0');
  }
  *out = v;
  return true;
}

/* One name:rank:step[:arg] of length n. */
static loom_status parse_one(const char *s, size_t n, armed_fault *f, loom_error *err) {
  const char *field[4] = {s, NULL, NULL, NULL};
  size_t len[4] = {0};
  int fields = 1;
  for (size_t i = 0; i < n; i++) {
    if (s[i] != ':') continue;
    if (fields == 4) return loom_fail(err, LOOM_ERR_USAGE, "fault '%.*s': more than name:rank:step:arg", (int)n, s);
    field[fields++] = s + i + 1;
  }
  for (int k = 0; k < fields; k++)
    len[k] = (size_t)((k + 1 < fields ? field[k + 1] - 1 : s + n) - field[k]);
  if (fields < 3) return loom_fail(err, LOOM_ERR_USAGE, "fault '%.*s': expected name:rank:step[:arg]", (int)n, s);
  int point = -1;
  for (int p = 0; p < LOOM_FAULT_COUNT; p++)
    if (strlen(g_names[p]) == len[0] && memcmp(g_names[p], field[0], len[0]) == 0) point = p;
  if (point < 0) {
    char known[160] = "";
    for (int p = 0; p < LOOM_FAULT_COUNT; p++)
      snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", p ? ", " : "", g_names[p]);
    return loom_fail(err, LOOM_ERR_USAGE, "fault '%.*s': no fault point '%.*s' (known: %s)", (int)n, s, (int)len[0],
                     field[0], known);
  }
  f->point = (loom_fault_point)point;
  if (!parse_field(field[1], len[1], &f->rank) || !parse_field(field[2], len[2], &f->step))
    return loom_fail(err, LOOM_ERR_USAGE, "fault '%.*s': rank and step are whole numbers or *", (int)n, s);
  f->arg = 0.0;
  if (fields == 4) {
    char buf[32], *end;
    if (len[3] == 0 || len[3] >= sizeof buf)
      return loom_fail(err, LOOM_ERR_USAGE, "fault '%.*s': the argument is a number", (int)n, s);
    memcpy(buf, field[3], len[3]);
    buf[len[3]] = '\0';
    f->arg = strtod(buf, &end);
    if (*end || !(f->arg >= 0.0 && f->arg <= 1e9))
      return loom_fail(err, LOOM_ERR_USAGE, "fault '%.*s': the argument is a number in [0, 1e9]", (int)n, s);
  }
  return LOOM_OK;
}

loom_status loom_fault_arm(const char *spec, loom_error *err) {
  armed_fault parsed[MAX_FAULTS];
  int count = 0;
  for (const char *s = spec; s && *s;) {
    const char *comma = strchr(s, ',');
    const size_t n = comma ? (size_t)(comma - s) : strlen(s);
    if (g_count + count == MAX_FAULTS)
      return loom_fail(err, LOOM_ERR_USAGE, "more than %d faults armed at once", MAX_FAULTS);
    const loom_status st = parse_one(s, n, &parsed[count], err);
    if (st != LOOM_OK) return st;
    count++;
    s = comma ? comma + 1 : s + n;
  }
  memcpy(g_armed + g_count, parsed, (size_t)count * sizeof *parsed);
  g_count += count;
  g_allocs = 0;
  return LOOM_OK;
}

loom_status loom_fault_arm_from_env(loom_error *err) {
  return loom_error_prefix(err, loom_fault_arm(getenv("LOOM_FAULT"), err), "LOOM_FAULT");
}

void loom_fault_disarm(void) {
  g_count = 0;
  g_allocs = 0;
}

void loom_fault_set_rank(int rank) { g_rank = rank; }

bool loom_fault_fires(loom_fault_point p, int64_t step, double *arg) {
  for (int i = 0; i < g_count; i++) {
    const armed_fault *f = &g_armed[i];
    if (f->point != p || (f->rank != ANY && f->rank != g_rank) || (f->step != ANY && f->step != step)) continue;
    if (arg) *arg = f->arg;
    return true;
  }
  if (arg) *arg = 0.0;
  return false;
}

void *loom_fault_malloc(size_t bytes) {
  return g_count && loom_fault_fires(LOOM_FAULT_ALLOC, ++g_allocs, NULL) ? NULL : malloc(bytes);
}

void *loom_fault_calloc(size_t count, size_t size) {
  return g_count && loom_fault_fires(LOOM_FAULT_ALLOC, ++g_allocs, NULL) ? NULL : calloc(count, size);
}

void *loom_fault_realloc(void *p, size_t bytes) {
  return g_count && loom_fault_fires(LOOM_FAULT_ALLOC, ++g_allocs, NULL) ? NULL : realloc(p, bytes);
}
